"""docs/benchmarks.md's throughput tables, made from the JSON results in docs/bench/ (``lanes bench-report``).

One table per device (``cpu-*.json``, ``gpu-*.json`` from an H200, ``h100-*.json``; the soak's, the store's and the window's results have
sections of their own). A row per result file: one workload at one number of streams on one model, each
cell's median tok/s, and the ratios the issues set targets on, every one between cells measured side
by side in that run. The baseline is ``mlx-lm-batch`` where it ran, else ``mlx-lm`` (one stream after
another).

A ratio is paired: the median over the run's rounds of one cell's tok/s over the other's in that
round (``lanes bench`` runs every cell once per round, one after another), so that a lent machine
slowing down between rounds moves both sides of each ratio alike. A ratio of medians would not: on an
H200 (2026-12-07) ``plain`` and ``on`` ran the same rounds of a lone no-copy reply (``on`` found
nothing to copy) at 172.0 and 164.9, 169.1 and 133.6, 134.4 and 143.3 tok/s; their medians read
0.85, the rounds' ratios 0.96, 0.79 and 1.07, median 0.96. Worked example: plain 300 and 330,
on 450 and 420 (two rounds) read ``on / plain`` median(1.50, 1.27) = 1.39. Results without rounds
(older files, tests) fall back to the medians' ratio.

The page keeps its prose; only the text between ``BEGIN`` and ``END`` under each device's heading is
replaced, so the page cannot drift from the files (tests/test_bench_report.py checks it).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from engine.model.machine import changed_settings

BEGIN = "<!-- bench-report {device}: made from docs/bench/{device}-*.json by `lanes bench-report` -->"
SERVER_BEGIN = "<!-- bench-report server: made from docs/bench/*-server.json and *-agent.json by `lanes bench-report` -->"
END = "<!-- /bench-report {device} -->"
DEVICES = ("gpu", "h100", "cpu")
NOT_THROUGHPUT = ("soak", "store", "ui", "server", "agent")  # results with sections of their own
ORDER = ("copy-heavy", "no-copy", "mixed", "heldout-copy", "heldout-mixed", "long-context")


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}"


def _median(result: dict[str, Any], cell: str) -> float | None:
    c = result["cells"].get(cell)
    return None if c is None else c["median_tok_s"]


def _paired(result: dict[str, Any], a: str | None, b: str | None) -> str:
    """``a`` / ``b`` as the median of their rounds' ratios (module docstring), else of their medians."""
    ca, cb = result["cells"].get(a or ""), result["cells"].get(b or "")
    if ca is None or cb is None:
        return "-"
    ra, rb = [r["tok_s"] for r in ca.get("rounds", [])], [r["tok_s"] for r in cb.get("rounds", [])]
    if not ra or len(ra) != len(rb) or min(rb) <= 0:
        return _ratio(ca["median_tok_s"], cb["median_tok_s"])
    return f"{statistics.median(x / y for x, y in zip(ra, rb, strict=True)):.2f}"


def _baseline(result: dict[str, Any]) -> str | None:
    return next((c for c in ("mlx-lm-batch", "mlx-lm") if c in result["cells"]), None)


def row(name: str, result: dict[str, Any]) -> str:
    """One result file's row (``name``: the file's name without ``DEVICE-`` and ``.json``)."""
    base = _baseline(result)
    b = _median(result, base) if base else None
    lanes = [f"{cell} {c['median_tok_s']:.1f}" for cell, c in result["cells"].items() if cell != base]
    workload = Path(result.get("workload", name)).stem
    if "sampling" in result:  # token-equal then compares the Lanes cells with plain's seeded replies
        workload += f" (sampled: temperature {result['sampling']['temperature']}, top-p {result['sampling']['top_p']})"
    if settings := changed_settings(result["machine"].get("mlx_env", {})):  # a run under other MLX settings
        workload += f" ({settings})"
    equal = min(c["equal_streams"] for c in result["cells"].values() if c["equal_streams"] is not None)
    return "| " + " | ".join([
        name, workload, f"{Path(result['model']).name} ({result.get('passes', '-')})", str(result["streams"]),
        "-" if base is None or b is None else f"{base} {b:.1f}", ", ".join(lanes),
        _paired(result, "plain", base), _paired(result, "on", base), _paired(result, "on", "plain"),
        f"{equal}/{result['streams']}",
        result.get("measured", "-"),
    ]) + " |"


def _key(name: str, result: dict[str, Any]) -> tuple[str, bool, int, int, str]:
    workload = Path(result.get("workload", name)).stem
    rank = ORDER.index(workload) if workload in ORDER else len(ORDER)
    return (Path(result["model"]).name, "sampling" in result, result["streams"], rank, name)


def table(device: str, folder: Path) -> str:
    """The device's table from ``folder``'s ``DEVICE-*.json``, with the machine they ran on."""
    results = {}
    for path in sorted(folder.glob(f"{device}-*.json")):
        name = path.stem.removeprefix(f"{device}-")
        if name.rsplit("-", 1)[-1] not in NOT_THROUGHPUT:  # cpu-qwen2-agent is an agent result too
            results[name] = json.loads(path.read_text())
    if not results:
        return "No results yet."
    lines = [
        "| result | workload | model (passes) | streams | baseline tok/s | Lanes cells tok/s | plain / base "
        "| on / base | on / plain | token-equal | measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[row(n, r) for n, r in sorted(results.items(), key=lambda nr: _key(*nr))],
    ]
    machines = sorted({_machine(r["machine"]) for r in results.values()})
    return "\n".join([*lines, "", *[f"Machine: {m}." for m in machines]])


def _machine(m: dict[str, Any]) -> str:
    backend = f"BLAS {m['blas']}" if "blas" in m else m.get("gpu", "")
    return ", ".join(str(p) for p in (m.get("processor"), f"{m.get('cores')} cores", m.get("device"), backend) if p)


def server_table(folder: Path) -> str:
    """The API server's results (``lanes bench-server``: ``DEVICE-server.json``, ``DEVICE-agent.json``):
    a row per target, and the ratio of each target's aggregate tok/s to mlx-lm's where both ran."""
    lines = ["| result | model | mode | clients | target | requests | errors | tok/s | / mlx-lm | copied | latency p50 / p90 / p99 s "
             "| first token p50 / p90 s | measured |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    machines = set()
    for path in sorted([*folder.glob("*-server.json"), *folder.glob("*-agent.json")]):
        r = json.loads(path.read_text())
        machines.add(_machine(r["machine"]))
        base = r["targets"].get("mlx-lm", {}).get("tok_s")
        for target, t in r["targets"].items():
            lat, first = t["latency_s"], t["first_token_s"]
            lines.append("| " + " | ".join([
                path.stem, r.get("architecture", "?"), r["mode"], str(r["clients"]), target, str(t["requests"]), str(len(t["errors"])),
                f"{t['tok_s']:.1f}", _ratio(t["tok_s"], base) if target != "mlx-lm" else "-",
                f"{t['copied_tokens'] / t['completion_tokens']:.0%}"
                if target == "lanes" and t.get("copied_tokens") is not None and t["completion_tokens"] else "-",
                f"{lat['p50']} / {lat['p90']} / {lat['p99']}", f"{first['p50']} / {first['p90']}", r["measured"],
            ]) + " |")
    if len(lines) == 2:
        return "No results yet."
    return "\n".join([*lines, "", *[f"Machine: {m}." for m in sorted(machines)]])


def update(page: Path, folder: Path) -> bool:
    """Replace each device's generated block (and the server's) in ``page``; returns whether it changed."""
    text = page.read_text()
    new = text
    for device in (*DEVICES, "server"):
        begin = SERVER_BEGIN if device == "server" else BEGIN.format(device=device)
        end = END.format(device=device)
        if begin not in new or end not in new:
            raise ValueError(f"{page} has no block for {device} (lines '{begin}' ... '{end}')")
        head, rest = new.split(begin, 1)
        _, tail = rest.split(end, 1)
        made = server_table(folder) if device == "server" else table(device, folder)
        new = f"{head}{begin}\n{made}\n{end}{tail}"
    if new != text:
        page.write_text(new)
    return new != text
