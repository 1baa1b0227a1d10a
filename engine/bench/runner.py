"""``lanes bench``: the same workload through mlx-lm and through Lanes, cell by cell.

Cells alternate round by round; every cell run starts from a fresh scheduler with
the same starting state (the calibrated cost model measured once up front, an empty
Recall index, no conversation caches). Greedy by default, so every stream's tokens
must equal mlx-lm's ``stream_generate``; a stream that differs is reported with the
position and the reference's top-2 logit margin there.

A sampled run (``Sampling``) samples in every cell: mlx-lm's cells with its own sampler, Lanes'
with each reply seeded by its workload line, so every Lanes cell must write the tokens the first
Lanes run wrote (``engine.rounds.sampling``: a seeded reply does not depend on copies); mlx-lm's
draws are its own and are not compared.
"""

from __future__ import annotations

import copy
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
from mlx_lm import batch_generate, stream_generate
from mlx_lm.sample_utils import make_sampler

from engine.bench.cell_specs import LANES_BASES, Cell
from engine.bench.workloads import WorkItem
from engine.drafts.cost_model import CALIBRATION_KEYS, CostModel
from engine.events import Event, Failed, Finished, Request
from engine.model import blas_threads, openblas
from engine.model.loading import LoadedModel
from engine.model.machine import changed_settings, cpu_model, mlx_settings, usable_cores
from engine.passes.choice import ACCELERATOR, GENERIC, RoundPasses
from engine.rounds.scheduler import Scheduler


@dataclass
class CellRun:
    seconds: float
    tokens: dict[str, list[int]]
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    forward_s: float = 0.0
    host_s: float = 0.0
    rounds: int = 0
    rounds_ahead: int = 0  # rounds started before the previous round's tokens reached the host
    aheads_dropped: int = 0  # rounds run ahead, then dropped because the round drafted after all
    copies_continued: int = 0  # rounds run ahead after a drafting round (engine.rounds.run_ahead)
    probes_started: int = 0  # probes started in rounds run ahead (engine.rounds.run_ahead)
    rounds_grouped: int = 0  # rounds run as a grouped pass (engine.passes.grouped)
    rounds_host: int = 0  # rounds run by numpy (engine.passes.numpy_pass)
    chunks_ridden: int = 0  # prefill chunks computed inside a round's pass
    prefills_joined: int = 0  # passes that prefilled several joining streams (engine.rounds.joins)
    histogram: dict[int, int] = field(default_factory=dict)  # drafts accepted per window -> windows
    # Lanes cells: each stream's seconds from submit to finish and the rounds it took part in.
    finish_s: dict[str, float] = field(default_factory=dict)
    stream_rounds: dict[str, int] = field(default_factory=dict)
    blas_threads: int | None = None  # OpenBLAS's threads at the end (engine.model.blas_threads), CPU only

    @property
    def generated(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    @property
    def tok_s(self) -> float:
        return self.generated / self.seconds


@dataclass(frozen=True)
class Sampling:
    """Every cell of a run samples at these settings (module docstring)."""

    temperature: float
    top_p: float = 1.0

    def mlx_lm(self) -> dict[str, Any]:
        """mlx-lm's generation arguments: its sampler, its random state seeded alike for every run."""
        mx.random.seed(0)
        return {"sampler": make_sampler(self.temperature, self.top_p)}


def prompts_for(loaded: LoadedModel, items: list[WorkItem]) -> list[list[int]]:
    tok = loaded.tokenizer
    return [list(tok.apply_chat_template(list(it.messages), add_generation_prompt=True)) for it in items]


def run_mlx_lm(loaded: LoadedModel, items: list[WorkItem], prompts: list[list[int]],
               sampling: Sampling | None = None) -> CellRun:
    kwargs = sampling.mlx_lm() if sampling else {}
    t0 = time.perf_counter()
    out: dict[str, list[int]] = {}
    for it, p in zip(items, prompts, strict=True):
        toks = []
        for r in stream_generate(loaded.model, loaded.tokenizer, p, max_tokens=it.max_tokens, **kwargs):
            if r.finish_reason != "stop":
                toks.append(r.token)
        out[it.id] = toks
    return CellRun(time.perf_counter() - t0, out)


def run_mlx_lm_batch(loaded: LoadedModel, items: list[WorkItem], prompts: list[list[int]],
                     sampling: Sampling | None = None) -> CellRun:
    kwargs = sampling.mlx_lm() if sampling else {}
    t0 = time.perf_counter()
    res = batch_generate(
        loaded.model, loaded.tokenizer, prompts, max_tokens=[it.max_tokens for it in items], return_token_ids=True,
        **kwargs)
    assert res.token_ids is not None
    return CellRun(time.perf_counter() - t0, {it.id: list(t) for it, t in zip(items, res.token_ids, strict=True)})


def cell_passes(loaded: LoadedModel, cell: Cell) -> RoundPasses:
    """The passes a Lanes cell runs: the model's, the generic pass, or an accelerator's uncompiled,
    with MLX's own masked attention (and then a lone stream uncompiled), a lone stream compiled or
    not, drafting rounds compiled or not, or costs calibrated from bare passes or as rounds run."""
    if cell.generic_pass:
        return GENERIC
    passes = loaded.passes
    if not cell.compiled and passes.compiled is not None:
        passes = replace(ACCELERATOR, fused_attention=passes.fused_attention)
    if not cell.fused_attention:
        passes = replace(passes, fused_attention=False, compile_alone=False)
    if cell.compile_alone is not None and passes.compiled is not None:
        passes = replace(passes, compile_alone=cell.compile_alone)
    drafts = cell.compile_drafts
    if drafts is not None and passes.compiled is not None and drafts != passes.compile_drafts:  # calibrated apart
        passes = replace(passes, name=f"{passes.name}-drafts-{'compiled' if drafts else 'uncompiled'}",
                         compile_drafts=drafts)
    rounds = cell.round_costs
    if rounds is not None and passes.speculate_ahead and rounds != passes.round_costs:  # calibrated apart
        passes = replace(passes, name=f"{passes.name}-{'round' if rounds else 'pass'}-costs", round_costs=rounds)
    return passes


def run_lanes(loaded: LoadedModel, items: list[WorkItem], costs: CostModel, cell: Cell,
              sampling: Sampling | None = None) -> CellRun:
    finished: dict[str, Finished] = {}
    run = CellRun(0.0, {})
    ids: dict[str, str] = {}

    def emit(ev: Event) -> None:
        if isinstance(ev, Finished):
            finished[ids[ev.request_id]] = ev
        elif isinstance(ev, Failed):
            raise RuntimeError(f"stream {ids.get(ev.request_id)} failed: {ev.message}")

    costs = copy.deepcopy(costs) if cell.context_cost else costs.at_keys(CALIBRATION_KEYS)
    loaded = replace(loaded, family=cell.with_settings(loaded.family))
    loaded = replace(loaded, passes=cell_passes(loaded, cell))
    sched = Scheduler(loaded, emit, costs=costs)
    if cell.prefill_pass is not None:
        sched.prefill_pass = cell.prefill_pass
    sched.continue_copies, sched.start_copies = cell.continue_copies, cell.start_copies
    sched.probe_starts = cell.probe_starts
    t0 = time.perf_counter()
    for line, it in enumerate(items):
        sampled = {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": line} if sampling else {}
        req = Request(messages=it.messages, max_tokens=it.max_tokens, drafts=cell.drafts,
                      own_copy_rates=cell.own_copy_rates, **sampled)
        ids[req.id] = it.id
        sched.submit(req)
    while sched.busy:
        sched.step()
    run.seconds = time.perf_counter() - t0
    run.forward_s, run.host_s, run.rounds = sched.forward_s, sched.host_s, sched.round
    run.rounds_ahead = sched.rounds_ahead
    run.copies_continued = sched.copies_continued
    run.probes_started = sched.probes_started
    run.aheads_dropped = sched.aheads_dropped
    run.rounds_grouped = sched.rounds_grouped
    run.rounds_host = sched.rounds_host
    run.chunks_ridden = sched.chunks_ridden
    run.prefills_joined = sched.prefills_joined
    run.histogram = dict(sorted(sched.histogram.items()))
    for it in items:
        f = finished[it.id]
        run.tokens[it.id] = list(f.tokens)
        run.finish_s[it.id], run.stream_rounds[it.id] = f.stats.seconds, f.stats.rounds
        for src, c in f.stats.rows.items():
            add_rows(run.rows, src, {"tested": c.tested, "accepted": c.accepted, "granted": c.granted})
    return run


def add_rows(totals: dict[str, dict[str, int]], source: str, counts: dict[str, int]) -> None:
    """Add one stream's (or run's) row counts for ``source`` into ``totals``."""
    agg = totals.setdefault(source, {"tested": 0, "accepted": 0, "granted": 0})
    for key in agg:
        agg[key] += counts[key]


def top2_margin(loaded: LoadedModel, prompt: list[int], ref: list[int], pos: int) -> float:
    """Logit gap between the reference's top two choices at output position ``pos``."""
    logits = loaded.model(mx.array(prompt + ref[:pos])[None])[0, -1]
    top = mx.sort(logits)[-2:]
    return float(top[1] - top[0])


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "system": platform.system(),
        "machine": platform.machine(),
        "processor": cpu_model(),
        "cores": usable_cores(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "mlx_env": mlx_settings(),
    }
    if mx.default_device() == mx.cpu:
        info["blas"] = openblas.blas_backend()
        loaded = openblas.loaded_openblas()
        if loaded is not None:
            info["blas_core"] = openblas.openblas_corename(loaded)  # the kernels OpenBLAS runs
    else:
        try:
            info["gpu"] = mx.device_info().get("device_name", "")
        except Exception:
            info["gpu"] = "unknown"
    return info


def run_bench(
    loaded: LoadedModel,
    items: list[WorkItem],
    cells: list[Cell],
    rounds: int,
    progress: Callable[[str], None] = lambda s: None,
    warmup: int = 0,
    sampling: Sampling | None = None,
) -> dict[str, Any]:
    """Each cell ``rounds`` times, alternated, after ``warmup`` unmeasured runs of every cell (on a
    GPU the first run of a shape compiles its kernels); greedy, or sampled (module docstring)."""
    prompts = prompts_for(loaded, items)
    costs, costs_of = cell_costs(loaded, cells)
    reference: dict[str, list[int]] | None = None
    results: dict[str, dict[str, Any]] = {c.spec: {"rounds": [], "cell": c} for c in cells}
    for w in range(warmup):
        for cell in cells:
            run = _run_cell(loaded, items, prompts, costs_of[cell.spec], cell, sampling)
            progress(f"warm-up {w + 1} {cell.spec}: {run.tok_s:.1f} tok/s")
    for r in range(rounds):
        order = cells[r % len(cells) :] + cells[: r % len(cells)]  # no cell always goes first
        for cell in order:
            run = _run_cell(loaded, items, prompts, costs_of[cell.spec], cell, sampling)
            if reference is None and cell.base == ("plain" if sampling else "mlx-lm"):
                reference = run.tokens
            progress(f"round {r + 1} {cell.spec}: {run.tok_s:.1f} tok/s")
            results[cell.spec]["rounds"].append(run)
        if reference is None and sampling:  # no plain cell: the first Lanes cell's replies
            reference = next((res["rounds"][-1].tokens for res in results.values()
                              if res["cell"].base in LANES_BASES), None)
        if reference is None and not sampling:  # mlx-lm not among the cells: compute the reference once
            reference = run_mlx_lm(loaded, items, prompts).tokens
    out = _summarise(loaded, items, prompts, reference or {}, results, costs, sampling is not None)
    if sampling:
        out["sampling"] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    return out


def cell_costs(loaded: LoadedModel, cells: list[Cell]) -> tuple[CostModel, dict[str, CostModel]]:
    """The model's passes calibrated, and each cell's costs: cells on other passes (generic,
    uncompiled, calibrated otherwise) are priced by what those passes cost here."""
    costs = _calibrated(loaded)
    by_passes = {loaded.passes.name: costs}
    for p in (cell_passes(loaded, c) for c in cells):
        if p.name not in by_passes:
            by_passes[p.name] = _calibrated(replace(loaded, passes=p))
    return costs, {c.spec: by_passes[cell_passes(loaded, c).name] for c in cells}


def _calibrated(loaded: LoadedModel) -> CostModel:
    probe = Scheduler(loaded, lambda e: None)
    if probe.blas is not None:
        probe.blas.settle()
    probe.calibrate()
    return probe.costs


def _run_cell(loaded: LoadedModel, items: list[WorkItem], prompts: list[list[int]], costs: CostModel,
              cell: Cell, sampling: Sampling | None = None) -> CellRun:
    blas = blas_threads.tuner() if loaded.device == "cpu" else None
    if blas is not None:  # every cell starts with the threads the load leaves (mlx-lm's loops keep them)
        blas.settle()
    if cell.base == "mlx-lm":
        run = run_mlx_lm(loaded, items, prompts, sampling)
    elif cell.base == "mlx-lm-batch":
        run = run_mlx_lm_batch(loaded, items, prompts, sampling)
    else:
        run = run_lanes(loaded, items, costs, cell, sampling)
    run.blas_threads = None if blas is None else blas.threads
    return run


def _summarise(
    loaded: LoadedModel,
    items: list[WorkItem],
    prompts: list[list[int]],
    reference: dict[str, list[int]],
    results: dict[str, dict[str, Any]],
    costs: CostModel,
    sampled: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {"cells": {}, "machine": machine(), "model": loaded.name, "streams": len(items),
                           "passes": loaded.passes.name, "device": loaded.device,
                           "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    prompt_of = {it.id: p for it, p in zip(items, prompts, strict=True)}
    for cell, res in results.items():
        runs: list[CellRun] = res["rounds"]
        compared = not (sampled and res["cell"].base not in LANES_BASES)  # mlx-lm's own draws are not
        rounds_json = []
        rows: dict[str, dict[str, int]] = {}
        for run in runs:
            streams = []
            for it in items:
                toks, ref = run.tokens[it.id], reference.get(it.id)
                entry: dict[str, Any] = {"id": it.id, "tokens": toks, "equal": toks == ref if compared else None}
                if it.id in run.finish_s:  # a reply's own wait, which the aggregate tok/s hides
                    entry["seconds"], entry["engine_rounds"] = run.finish_s[it.id], run.stream_rounds[it.id]
                if compared and ref is not None and toks != ref:
                    pos = next((i for i, (a, b) in enumerate(zip(toks, ref, strict=False)) if a != b),
                               min(len(toks), len(ref)))
                    entry["first_difference"] = pos
                    if pos < len(ref) and not sampled:
                        entry["top2_margin"] = top2_margin(loaded, prompt_of[it.id], ref, pos)
                streams.append(entry)
            rounds_json.append({
                "tok_s": run.tok_s, "seconds": run.seconds, "tokens": run.generated, "streams": streams,
                "forward_s": run.forward_s, "host_s": run.host_s, "engine_rounds": run.rounds,
                "rounds_ahead": run.rounds_ahead, "aheads_dropped": run.aheads_dropped,
                "copies_continued": run.copies_continued, "probes_started": run.probes_started,
                "rounds_grouped": run.rounds_grouped, "rounds_host": run.rounds_host,
                "chunks_ridden": run.chunks_ridden,
                "prefills_joined": run.prefills_joined, "blas_threads": run.blas_threads,
                "accepted_per_window": run.histogram,
            })
            for src, c in run.rows.items():
                add_rows(rows, src, c)
        speeds = [r["tok_s"] for r in rounds_json]
        host = sum(r.host_s for r in runs)
        total = sum(r.host_s + r.forward_s for r in runs)
        out["cells"][cell] = {
            "median_tok_s": statistics.median(speeds),
            "spread": (max(speeds) - min(speeds)) / statistics.median(speeds) if speeds else 0.0,
            "rounds": rounds_json,
            "rows": rows,
            "equal_streams": min(sum(s["equal"] for s in r["streams"]) for r in rounds_json) if compared else None,
            "host_fraction": host / total if total > 0 else None,
            "settings": dict(res["cell"].settings),  # family settings this cell overrode
        }
    out["costs_ms"] = {k: v * 1000 for k, v in costs.snapshot().items()}
    out["grouped_costs_ms"] = {k: v * 1000 for k, v in costs.grouped_snapshot().items()}
    out["context_cost_us_per_key"] = {"per_stream": costs.context.per_stream * 1e6,
                                      "per_row": costs.context.per_row * 1e6}
    return out


def markdown(result: dict[str, Any]) -> str:
    cells = result["cells"]
    n_rounds = max(len(c["rounds"]) for c in cells.values())
    head = ["cell", *[f"round {i + 1}" for i in range(n_rounds)], "median tok/s", "spread",
            "token-equal", "context rows acc/tested/granted", "recall rows acc/tested/granted", "host %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    n = result["streams"]
    for name, c in cells.items():
        rows = c["rows"]

        def rowtxt(src: str, rows: dict[str, dict[str, int]] = rows) -> str:
            r = rows.get(src)
            if not r:
                return "-"
            return f"{r['accepted']}/{r['tested']}" + (f"/{r['granted']}" if "granted" in r else "")

        host = c["host_fraction"]
        lines.append("| " + " | ".join([
            name, *[f"{r['tok_s']:.1f}" for r in c["rounds"]], f"{c['median_tok_s']:.1f}",
            f"{c['spread'] * 100:.1f}%", "-" if c["equal_streams"] is None else f"{c['equal_streams']}/{n}", rowtxt("context"), rowtxt("recall"),
            "-" if host is None else f"{host * 100:.1f}%",
        ]) + " |")
    diffs = [
        f"- {name} round {i + 1}: stream {s['id']} differs at token {s['first_difference']}"
        + (f" (reference top-2 margin {s['top2_margin']:.4f})" if "top2_margin" in s else "")
        for name, c in cells.items() for i, r in enumerate(c["rounds"]) for s in r["streams"] if s["equal"] is False
    ]
    m = result["machine"]
    if "blas" in m:
        backend = f"BLAS {m['blas']}" + (f" ({m['blas_core']})" if m.get("blas_core") else "")
    else:
        backend = m.get("gpu", "")
    settings = changed_settings(m.get("mlx_env", {}))
    lines.append("")
    lines.append(f"Model {result['model']} ({result.get('passes', 'own')} passes); {n} streams; machine: "
                 f"{m.get('processor')}, {m.get('cores')} cores, {m.get('device')}, {backend}"
                 + (f", {settings}" if settings else ""))
    if diffs:
        reference = "the plain cell's seeded replies" if "sampling" in result else "mlx-lm"
        lines += ["", f"Streams not token-equal to {reference}:", *diffs]
    return "\n".join(lines)
