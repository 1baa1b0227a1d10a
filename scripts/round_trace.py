"""Where `on` spends its time against `plain`, round by round: every engine step of a workload is
timed whole and sorted by what kind of round it ran.

    PYTHONPATH=~/site:. python3 scripts/round_trace.py [--workload W] [--repeats N] [--cells plain,on]
        [--streams N] [--temperature T --top-p P]
        [--accelerator] [--costs TRACE_JSON] [--json OUT]

Kinds: ``ahead`` (a draft-free round whose pass ran ahead: the pipeline's steady state),
``continued`` (a round whose pass ran ahead with draft rows: copies' continuations or starts,
``engine.rounds.run_ahead``; wider, and masked), ``sync`` (a draft-free round computed when it
came, e.g. the round after one that drafted), ``draft`` (a round with draft rows), ``dropped`` (a
draft round that first waited for a pass run ahead and thrown away), ``waited`` (a draft-free round
that did), ``joining`` (a step that also prefilled a prompt).
Each step's time is also taken apart: ``build`` (making and queuing its own pass, nothing for a
round that ran ahead), ``next`` (making and queuing the round run ahead after it) and ``wait``
(until its choices reach the host); the rest is the host's planning and verification. A GPU that
keeps pace with the host leaves ``wait`` near nothing in the steady state: the host is the limit
(on a CPU, queuing the round run ahead waits for this one's pass: ``next`` holds it there).
For each cell it prints tok/s per repeat, and per kind the rounds per run and their median
milliseconds; with several cells, each cell's ratio to the first per repeat (cells alternate, after
one unmeasured run of each: the first run of a shape compiles its kernels on a GPU). The JSON
holds each run's summary, with what the allocator expected its drafting rounds to gain and cost,
the cost model's shapes as the run left them, each cell's calibrated costs (a cell on other passes,
e.g. ``on:round_costs=false``, is calibrated apart, as in ``lanes bench``), the last repeat's rounds
one by one, and the CPUs the process could run on.
``--temperature`` samples every reply (seeded by its place in the workload, so every cell and repeat
writes the same replies), top-p ``--top-p``; cells ``mlx-lm`` and ``mlx-lm-batch`` time mlx-lm
greedy, or with its own sampler at those settings, as ``lanes bench`` does. ``--accelerator`` runs
a GPU's round logic (passes that speculate ahead, prompt chunks of a GPU's length) on any device, to
try the paths on a CPU. ``--costs TRACE_JSON`` prices every round with the costs a device's run left
(the JSON of an earlier trace there: the last run of the last cell of ``--cells``, else of its
first cell), held fixed,
so that with ``--accelerator`` the CPU makes that device's choices; its times are still the CPU's,
so read its rounds, not its tok/s. What it measured on the H200 is in docs/engine.md ("What happens in
a round", item 7).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.bench.cell_specs import parse_cell
from engine.bench.runner import cell_costs, prompts_for, run_lanes
from engine.bench.workloads import at_streams, load_workload
from engine.drafts.cost_model import CostModel
from engine.model.loading import load_model
from engine.passes.choice import ACCELERATOR
from engine.rounds import scheduler as sched_mod


class Trace:
    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        self.gc_s = [0.0, 0.0, 0.0]  # seconds in the garbage collector, by generation
        self.gc_n = [0, 0, 0]
        self._gc_t0 = 0.0
        self.costs: Any = None  # the last cell's cost model, as its rounds left it

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            g = info["generation"]
            self.gc_s[g] += time.perf_counter() - self._gc_t0
            self.gc_n[g] += 1


TRACE = Trace()
_orig_allocate = sched_mod.allocate
_orig_prepare = sched_mod.Scheduler._prepare
_orig_step = sched_mod.Scheduler.step
_orig_verify = sched_mod.Scheduler._verify
_orig_plan = sched_mod.Scheduler._plan
_orig_submit = sched_mod.Scheduler.submit
_orig_forward = sched_mod.Scheduler._forward
_orig_choices = sched_mod.Scheduler._choices
_orig_start = sched_mod.run_ahead.start
SAMPLING: dict[str, Any] = {}  # temperature and top_p every request gets, with "seed", the next seed


def _plan(self: Any) -> Any:
    t0 = time.perf_counter()
    out = _orig_plan(self)
    TRACE.costs = self.costs
    TRACE.current["plan"] = time.perf_counter() - t0
    return out


def _allocate(offers: Any, n: int, cost: Any, overhead: float, **kw: Any) -> Any:
    a = _orig_allocate(offers, n, cost, overhead, **kw)
    TRACE.current.update(offers=len(offers), expected=a.expected_tokens - n, predicted=a.seconds,
                         keep=kw.get("keep_seconds"), dropping=kw.get("dropping", 0.0), granted=sum(a.rows))
    return a


def _prepare(self: Any, rider: Any) -> Any:
    r = _orig_prepare(self, rider)
    TRACE.current.update(kind=r.kind, width=r.width, batch=r.batch, waited=r.waited, keys=r.keys)
    return r


def _verify(self: Any, *a: Any) -> Any:
    before = sum(k * n for k, n in self.histogram.items())
    out = _orig_verify(self, *a)
    TRACE.current["accepted"] = sum(k * n for k, n in self.histogram.items()) - before
    return out


def _forward(self: Any, r: Any) -> Any:
    t0 = time.perf_counter()
    out = _orig_forward(self, r)
    TRACE.current["build"] = time.perf_counter() - t0 - TRACE.current.pop("choices", 0.0)
    return out


def _choices(self: Any, r: Any, choices: Any) -> Any:
    t0 = time.perf_counter()
    out = _orig_choices(self, r, choices)
    TRACE.current["choices"] = time.perf_counter() - t0
    TRACE.current["wait"] = TRACE.current["choices"] - TRACE.current.get("next", 0.0)
    return out


def _start(sched: Any, r: Any, choices: Any) -> Any:
    t0 = time.perf_counter()
    out = _orig_start(sched, r, choices)
    TRACE.current["next"] = time.perf_counter() - t0
    return out


def _submit(self: Any, request: Any) -> None:
    # Sampling set on the requests themselves, so that a base tree's engine (BASE in gpu-bench.sh)
    # samples the same way without knowing run_lanes's sampling argument.
    if SAMPLING:
        SAMPLING["seed"] += 1
        request = replace(request, **SAMPLING)
    _orig_submit(self, request)


def device_costs(path: Path, cell: str) -> CostModel:
    """The cost model a device's trace (``--json``) left after its run of ``cell`` (else of its first
    cell), every observation turned off: its pass samples, its round run ahead and its host time
    (not its cost per key of context, which a trace does not keep).

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "t.json"
    >>> _ = f.write_text(json.dumps({"runs": {"on": [{"observed_ms": {"8x1": 16.0, "8x32": 20.0},
    ...     "model_ms": {"kept8": 8.0, "pass8x1": 16.0, "overhead": 0.5}}]}}))
    >>> c = device_costs(f, "on")
    >>> c.observe(8, 1, 1.0); c.observe_kept(8, 1.0)
    >>> round(c.cost(8, 1) * 1e3, 1), round(c.kept(8) * 1e3, 1), round(c.overhead * 1e3, 1)
    (16.0, 8.0, 0.5)
    """
    runs = json.loads(path.read_text())["runs"]
    run = (runs.get(cell) or next(iter(runs.values())))[-1]
    costs = CostModel.from_snapshot({k: v / 1e3 for k, v in run["observed_ms"].items()})
    for key, ms in run["model_ms"].items():
        if key.startswith("kept"):
            costs.observe_kept(int(key.removeprefix("kept")), ms / 1e3)
    costs.observe_overhead(run["model_ms"]["overhead"] / 1e3)
    costs.observe = costs.observe_kept = costs.observe_overhead = lambda *a, **k: None  # type: ignore[method-assign]
    return costs


def _step(self: Any) -> None:
    TRACE.current = {"joining": bool(self.joining)}
    t0 = time.perf_counter()
    _orig_step(self)
    TRACE.current["seconds"] = time.perf_counter() - t0
    if "kind" in TRACE.current:
        TRACE.rounds.append(TRACE.current)


PARTS = ("build", "next", "wait")  # a step's parts (module docstring)
KINDS = ("ahead", "continued", "sync", "draft", "dropped", "waited", "joining")


def category(r: dict[str, Any]) -> str:
    """A traced round's kind (module docstring).

    >>> category({"joining": False, "kind": "ahead", "width": 1, "waited": False})
    'ahead'
    >>> category({"joining": False, "kind": "ahead", "width": 9, "waited": False})
    'continued'
    >>> category({"joining": False, "kind": "padded", "width": 9, "waited": True})
    'dropped'
    """
    if r["joining"]:
        return "joining"
    if r["kind"] == "ahead":
        return "continued" if r["width"] > 1 else "ahead"
    if r["width"] > 1:
        return "dropped" if r["waited"] else "draft"
    return "waited" if r["waited"] else "sync"


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": len(rounds), "seconds": sum(r["seconds"] for r in rounds),
                           "plan_ms": 1e3 * sum(r.get("plan", 0.0) for r in rounds),
                           "gc_ms": [round(1e3 * t, 2) for t in TRACE.gc_s], "gc_n": list(TRACE.gc_n)}
    for cat in KINDS:
        ts = [r["seconds"] for r in rounds if category(r) == cat]
        out[cat] = {"n": len(ts), "ms_median": 1e3 * statistics.median(ts) if ts else None,
                    "ms_total": 1e3 * sum(ts)}
        for part in PARTS:
            ps = [r.get(part, 0.0) for r in rounds if category(r) == cat]
            out[cat][f"{part}_ms_median"] = 1e3 * statistics.median(ps) if ps else None
    drafting = [r for r in rounds if r["width"] > 1]
    out["drafting"] = {
        "rounds": len(drafting),
        "granted": sum(r.get("granted", 0) for r in drafting),
        "expected": sum(r.get("expected", 0.0) for r in drafting),
        "accepted": sum(r.get("accepted", 0) for r in drafting),
        "predicted_ms": 1e3 * sum(r.get("predicted", 0.0) for r in drafting),
        "keep_ms_median": 1e3 * statistics.median([r["keep"] for r in drafting if r.get("keep")] or [0.0]),
    }
    return out


def mlx_lm_tok_s(loaded: Any, items: Any, batch: bool) -> float:
    """mlx-lm's own generation of the workload, greedy or with its sampler at SAMPLING's settings: tokens a second."""
    from engine.bench.runner import Sampling, run_mlx_lm, run_mlx_lm_batch  # this tree's runner: not a base's

    sampling = Sampling(SAMPLING["temperature"], SAMPLING["top_p"]) if SAMPLING else None
    return (run_mlx_lm_batch if batch else run_mlx_lm)(loaded, items, prompts_for(loaded, items), sampling).tok_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", type=Path, default=Path("resources/workloads/no-copy.jsonl"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--cells", default="plain,on")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--streams", type=int, default=None, help="the workload's first N lines, or its lines in turn")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--accelerator", action="store_true")
    ap.add_argument("--costs", type=Path, default=None, help="a device's trace JSON: its costs, held fixed")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sched_mod.allocate = _allocate
    sched_mod.Scheduler._prepare = _prepare
    sched_mod.Scheduler.step = _step
    sched_mod.Scheduler._verify = _verify
    sched_mod.Scheduler._plan = _plan
    sched_mod.Scheduler.submit = _submit
    sched_mod.Scheduler._forward = _forward
    sched_mod.Scheduler._choices = _choices
    sched_mod.run_ahead.start = _start
    gc.callbacks.append(TRACE.on_gc)
    loaded = load_model(args.model)
    if args.accelerator:
        loaded = replace(loaded, passes=ACCELERATOR)
        sched_mod.CPU_PREFILL_CHUNK = sched_mod.PREFILL_CHUNK
    items = load_workload(args.workload, args.max_tokens)
    if args.streams:
        items = at_streams(items, args.streams)
    specs = args.cells.split(",")
    lanes_cells = [parse_cell(s) for s in specs if not s.startswith("mlx-lm")]
    if args.costs is None:  # each cell priced by its own passes' calibration, as `lanes bench` does
        costs, costs_of = cell_costs(loaded, lanes_cells)
    else:
        costs = device_costs(args.costs, specs[-1])
        costs_of = {c.spec: costs for c in lanes_cells}
    print("costs ms", {k: round(v * 1e3, 2) for k, v in costs.snapshot().items()}, "context", costs.context,
          file=sys.stderr)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in specs}
    for rep in range(args.repeats + 1):
        order = specs[rep % len(specs):] + specs[: rep % len(specs)]
        for spec in order:
            TRACE.rounds, TRACE.gc_s, TRACE.gc_n = [], [0.0, 0.0, 0.0], [0, 0, 0]
            if args.temperature > 0:
                SAMPLING.update(temperature=args.temperature, top_p=args.top_p, seed=0)
            if spec.startswith("mlx-lm"):
                tok_s = mlx_lm_tok_s(loaded, items, batch=spec == "mlx-lm-batch")
                if rep:
                    runs[spec].append({**summarise([]), "tok_s": tok_s})
                continue
            run = run_lanes(loaded, items, costs_of[spec], parse_cell(spec))
            if rep == 0:
                continue
            s = summarise(TRACE.rounds)
            s["tok_s"] = run.tok_s
            c, n = TRACE.costs, len(items)
            s["model_ms"] = {k: round(1e3 * v, 3) for k, v in {
                f"kept{n}": c.kept(n), f"pass{n}x1": c.cost(n, 1, keys=400), f"pass{n}x16": c.cost(n, 16, keys=400),
                "overhead": c.overhead}.items()}
            s["observed_ms"] = {k: round(1e3 * v, 3) for k, v in c.snapshot().items()}  # as the run left them
            if rep == args.repeats:
                s["trace"] = TRACE.rounds  # the last repeat's rounds, each as the allocator saw it
            runs[spec].append(s)
            print(f"{rep} {spec}: {run.tok_s:.1f} tok/s {json.dumps({k: v for k, v in s.items() if k != 'trace'})}",
                  file=sys.stderr)
    for spec in specs:
        tok = [s["tok_s"] for s in runs[spec]]
        print(f"{spec}: median {statistics.median(tok):.1f} tok/s over {len(tok)}: {[round(t, 1) for t in tok]}")
        for cat in KINDS:
            ms = [s[cat]["ms_median"] for s in runs[spec] if s[cat]["ms_median"] is not None]
            if ms:
                n = sum(s[cat]["n"] for s in runs[spec]) / len(runs[spec])
                parts = {p: statistics.median(s[cat][f"{p}_ms_median"] for s in runs[spec] if s[cat]["n"])
                         for p in PARTS}
                print(f"  {cat:8s} {n:6.1f} rounds a run, median {statistics.median(ms):6.2f} ms ("
                      + ", ".join(f"{p} {v:.2f}" for p, v in parts.items()) + ")")
    if len(specs) > 1:
        base = runs[specs[0]]
        for spec in specs[1:]:
            ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(base, runs[spec], strict=True)]
            print(f"{spec}/{specs[0]} per repeat: {[round(x, 3) for x in ratios]}, median "
                  f"{statistics.median(ratios):.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        # Where processes of one tree run at different speeds, where each ran (gpu-bench.sh's TRACE_PIN).
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        calibrated = {spec: {**{k: v * 1e3 for k, v in c.snapshot().items()},
                             **{f"kept{b}": c.kept(b) * 1e3 for b in (1, 4)}} for spec, c in costs_of.items()}
        args.json.write_text(json.dumps({"costs_ms": {k: v * 1e3 for k, v in costs.snapshot().items()},
                                         "cell_costs_ms": calibrated, "runs": runs, "cpus": cpus}, indent=1) + "\n")


if __name__ == "__main__":
    main()
