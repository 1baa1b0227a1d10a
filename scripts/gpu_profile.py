"""Where a decode step's time goes: mlx-lm's batched cache against Lanes' lane cache, and the whole
engine against ``batch_generate``, per step.

    PYTHONPATH=~/site:. python3 scripts/gpu_profile.py [--streams 4,8] [--steps 200] [--model M]
        [--workload W]

For each stream count it prints, in milliseconds per step:

- ``loop``: the bare decode loop (the last step's argmax fed back on the device, nothing read back),
  through mlx-lm's ``BatchKVCache`` and through a ``LaneCache`` whose rows are as long (one block
  write) or of different lengths (one scatter), and that last compiled (``engine.passes.compiled``): ``build`` is the Python that makes the graph,
  ``dispatch`` the time ``mx.async_eval`` takes to hand it to the device, ``wall`` the whole step
  once the device keeps pace. ``wall`` well above ``build + dispatch`` means the device is the limit.
- ``engine``: ``batch_generate`` and the scheduler's plain rounds on the same prompts, with the
  model's graph building (``model``), ``async_eval``/``eval`` calls and the rest (``other``) apart.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from engine.bench.cell_specs import parse_cell
from engine.bench.runner import _calibrated, prompts_for, run_lanes, run_mlx_lm_batch
from engine.bench.workloads import at_streams, load_workload
from engine.model.lane_cache import LaneCache
from engine.model.loading import LoadedModel, load_model
from engine.passes.compiled import CompiledPass

PROMPT = 300  # tokens each stream holds before the loop


class Timers:
    """Seconds spent inside wrapped callables, by name."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t0
        return timed


def _prefilled(loaded: LoadedModel, lengths: list[int]) -> list[list[KVCache]]:
    out = []
    for n in lengths:
        caches = [KVCache() for _ in range(loaded.n_layers)]
        loaded.model(mx.arange(n, dtype=mx.int32)[None] % 1000, cache=caches)
        mx.eval([c.keys for c in caches])
        out.append(caches)
    return out


def bare_loop(loaded: LoadedModel, kind: str, streams: int, steps: int) -> dict[str, float]:
    """Milliseconds per step of a decode loop that reads nothing back (see the module docstring)."""
    model = loaded.model
    ragged = kind != "lanes-even"
    compiled = CompiledPass(model) if kind == "lanes-compiled" else None
    lengths = [PROMPT - (7 * i if ragged else 0) for i in range(streams)]
    y = mx.zeros((streams, 1), dtype=mx.int32)
    if kind == "mlx-lm":
        pad = [PROMPT - n for n in lengths]
        caches: Any = [BatchKVCache(pad) for _ in range(loaded.n_layers)]
        model(mx.zeros((streams, PROMPT), dtype=mx.int32), cache=caches)
        mx.eval([c.keys for c in caches])
    else:
        lanes = LaneCache(list(loaded.kinds), fixed=compiled is not None)
        for c in _prefilled(loaded, lengths):
            lanes.add(c)
    build = dispatch = 0.0
    t_start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        if kind == "mlx-lm":
            logits = model(y, cache=caches)
        else:
            lanes.begin_round(1)
            logits = compiled(lanes, y) if compiled is not None else model(y, cache=lanes.views)
            for row in range(streams):
                lanes.advance(row, 1)
            lanes.end_round()
        y = mx.argmax(logits[:, -1:], axis=-1).astype(mx.int32)
        t1 = time.perf_counter()
        mx.async_eval(y)
        t2 = time.perf_counter()
        build, dispatch = build + t1 - t0, dispatch + t2 - t1
    mx.eval(y)
    wall = time.perf_counter() - t_start
    return {"build": 1e3 * build / steps, "dispatch": 1e3 * dispatch / steps, "wall": 1e3 * wall / steps}


def engine_steps(loaded: LoadedModel, streams: int, max_tokens: int, workload: Path) -> dict[str, dict[str, float]]:
    """``batch_generate`` and the scheduler's plain cell on the same prompts, timed by part."""
    items = at_streams(load_workload(workload, max_tokens), streams)
    prompts = prompts_for(loaded, items)
    costs = _calibrated(loaded)
    model_cls = type(loaded.model)
    out: dict[str, dict[str, float]] = {}
    originals = (model_cls.__call__, mx.async_eval, mx.eval)
    for name in ("mlx-lm-batch", "plain", "mlx-lm-batch", "plain"):  # the first of each warms up
        timers = Timers()
        model_cls.__call__ = timers.wrap("model", originals[0])
        mx.async_eval = timers.wrap("async_eval", originals[1])
        mx.eval = timers.wrap("eval", originals[2])
        try:
            if name == "plain":
                run = run_lanes(loaded, items, costs, parse_cell("plain"))
                steps = run.rounds
            else:
                run = run_mlx_lm_batch(loaded, items, prompts)
                steps = max(len(t) for t in run.tokens.values())
        finally:
            model_cls.__call__, mx.async_eval, mx.eval = originals
        parts = {k: 1e3 * v / steps for k, v in timers.spent.items()}
        parts["other"] = 1e3 * run.seconds / steps - sum(parts.values())
        parts["step"] = 1e3 * run.seconds / steps
        parts["tok_s"] = run.tok_s
        out[name] = parts
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="4,8")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--workload", type=Path, default=Path("resources/workloads/no-copy.jsonl"))
    args = ap.parse_args()
    loaded = load_model(args.model)
    print(f"{loaded.name} on {mx.default_device()}, passes {loaded.passes.name}")
    for b in [int(s) for s in args.streams.split(",")]:
        for kind in ("mlx-lm", "lanes-even", "lanes-ragged", "lanes-compiled"):
            bare_loop(loaded, kind, b, min(20, args.steps))  # compiles the kernels
            r = bare_loop(loaded, kind, b, args.steps)
            print(f"loop {b} {kind:12s} " + " ".join(f"{k} {v:6.2f}" for k, v in r.items()), flush=True)
        if not args.skip_engine:
            for name, parts in engine_steps(replace(loaded), b, args.max_tokens, args.workload).items():
                print(f"engine {b} {name:12s} " + " ".join(f"{k} {v:6.2f}" for k, v in parts.items()), flush=True)


if __name__ == "__main__":
    main()
