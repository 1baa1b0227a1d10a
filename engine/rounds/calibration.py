"""Calibration: the forward pass timed at a few shapes on this machine before any stream, so the
cost model (``engine.drafts.cost_model``) prices rows with what this device really charges.

A few shapes are timed at a long context too, to price each key of context first
(``engine.drafts.context_cost``); the short timings are then folded in net of their context. The
passes timed are the ones the rounds run (``LoadedModel.passes``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine.drafts.context_cost import ContextSample, fit
from engine.drafts.cost_model import (
    CALIBRATION_KEYS,
    CALIBRATION_SHAPES,
    CONTEXT_CALIBRATION_SHAPES,
    GROUPED_CALIBRATION_SHAPES,
    LONG_CALIBRATION_KEYS,
)
from engine.model.cache_kinds import cache_arrays, length_of, make_caches
from engine.passes.grouped import grouped_logits

if TYPE_CHECKING:
    from engine.rounds.scheduler import Scheduler


def calibrate(sched: Scheduler, repeats: int = 2) -> None:
    """Time the forward pass at a few shapes on this machine (before any stream).

    A few shapes are timed at a long context too, to price each key of context first
    (``engine.drafts.context_cost``); the short timings are then folded in net of their context.
    """
    short_ctx = _filler_context(sched, CALIBRATION_KEYS)
    long_ctx = _filler_context(sched, LONG_CALIBRATION_KEYS)
    short = {(b, w): _time_pass(sched, short_ctx, [w] * b, grouped=False, repeats=repeats)
             for b, w in CALIBRATION_SHAPES}
    sched.costs.context = fit([
        ContextSample(b, w, CALIBRATION_KEYS, short[(b, w)], LONG_CALIBRATION_KEYS,
                      _time_pass(sched, long_ctx, [w] * b, grouped=False, repeats=1))
        for b, w in CONTEXT_CALIBRATION_SHAPES
    ])
    for (batch, width), seconds in short.items():
        sched.costs.observe(batch, width, seconds, keys=CALIBRATION_KEYS)
    if sched.costs.grouped:
        for batch, width, wide in GROUPED_CALIBRATION_SHAPES:
            widths = [width] * wide + [1] * (batch - wide)
            seconds = _time_pass(sched, short_ctx, widths, grouped=True, repeats=repeats)
            sched.costs.observe(batch, width, seconds, wide, keys=CALIBRATION_KEYS)


def _filler_context(sched: Scheduler, keys: int) -> list[Any]:
    """Per-layer caches holding ``keys`` tokens of context, for timing passes (the values don't matter)."""
    caches = make_caches(list(sched.loaded.kinds))
    sched.model(mx.zeros((1, CALIBRATION_KEYS), dtype=mx.int32), cache=caches)
    if keys > CALIBRATION_KEYS:  # the rest as zeros: computing it would cost a long prefill
        for c in caches:
            if not isinstance(c, KVCache):
                continue  # a recurrent state is as large at any length
            k, v = c.keys, c.values
            c.update_and_fetch(mx.zeros((*k.shape[:2], keys - c.offset, k.shape[3]), dtype=k.dtype),
                               mx.zeros((*v.shape[:2], keys - c.offset, v.shape[3]), dtype=v.dtype))
    mx.eval(cache_arrays(caches))
    return caches


def _time_pass(sched: Scheduler, context: list[Any], widths: list[int], grouped: bool, repeats: int) -> float:
    """Best of ``repeats`` timings of one pass, every stream holding the filler ``context``."""
    lanes = sched.passes.lanes(sched.loaded.kinds)
    for _ in widths:
        lanes.add(context, length_of(context) or CALIBRATION_KEYS)
    width = max(widths)
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        if sched.passes.numpy_pass is not None:
            lanes.begin_host(widths)
            sched.passes.numpy_pass.logits(lanes, [[0] * w for w in widths]).argmax(axis=-1)
        elif grouped or (sched.passes.numpy_ops and width > 1):
            groups = lanes.begin_grouped(widths)
            logits = grouped_logits(sched.model, lanes, groups, [[0] * w for w in widths], sched.row_multiple,
                                    host_exp=sched.passes.numpy_ops, rope_table=sched.passes.rope_table)
        else:
            lanes.begin_round(width, fixed=width > 1 and sched.passes.draft_step > 1)  # as drafting rounds run
            logits = sched.passes.padded(sched.model, lanes, mx.zeros((len(widths), width), dtype=mx.int32))
        if sched.passes.numpy_pass is None:
            mx.eval(mx.argmax(logits, axis=-1))
        best = min(best, time.perf_counter() - t0)
        lanes.end_round()
    return best
