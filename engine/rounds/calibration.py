"""Calibration: the forward pass timed at a few shapes on this machine before any stream, so the
cost model (``engine.drafts.cost_model``) prices rows with what this device really charges.

A few shapes are timed at a long context too, to price each key of context first
(``engine.drafts.context_cost``); the short timings are then folded in net of their context. The
passes timed are the ones the rounds run (``LoadedModel.passes``).

Where rounds run ahead (``RoundPasses.round_costs``: an accelerator's), a shape is timed as such a
round runs, not as a bare pass: a round that did not run ahead queues the next one-row pass behind
its own before its choices reach the host (``engine.rounds.run_ahead``), so on a host-bound GPU it
pays two passes' building and dispatch, and the rounds observed later are timed that way too. A
round run ahead pays one: ``CostModel.kept`` is timed as a chain of one-row passes, each queued
before the one before it is read, and a drafting round that drops a round run ahead is charged
that (the scheduler's ``dropping``), not a one-row round's two passes. Timed bare, drafting rounds
were priced far under what they took until rounds of their shape were observed, and one that
drops a round run ahead never is (docs/engine.md, item 3, has the measurement).
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
    if sched.passes.round_costs:
        for batch in sorted({b for b, _ in CALIBRATION_SHAPES}):
            sched.costs.observe_kept(batch, _time_chain(sched, short_ctx, batch, repeats))
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
        if sched.passes.round_costs:  # its successor queued behind it, read after the timing
            choices = mx.argmax(logits, axis=-1)
            successor = _queue_one_row(sched, lanes, choices)
            mx.eval(choices)
            best = min(best, time.perf_counter() - t0)
            mx.eval(successor)
        else:
            if sched.passes.numpy_pass is None:
                mx.eval(mx.argmax(logits, axis=-1))
            best = min(best, time.perf_counter() - t0)
        lanes.end_round()
    return best


def _queue_one_row(sched: Scheduler, lanes: Any, choices: mx.array) -> mx.array:
    """Queue a one-row pass fed by ``choices`` (still on the device) behind the pass that makes them,
    as a round queues the round run ahead after it; returns its choices, not yet computed."""
    mx.async_eval(choices)
    lanes.end_round()
    lanes.begin_round(1)
    nxt = mx.argmax(sched.passes.padded(sched.model, lanes, choices[:, :1].astype(mx.int32)), axis=-1)
    mx.async_eval(nxt)
    return nxt


def _time_chain(sched: Scheduler, context: list[Any], batch: int, repeats: int, links: int = 4) -> float:
    """Seconds a link of a chain of one-row passes takes, each queued before the one before it
    is read (rounds run ahead, ``CostModel.kept``); the best of ``repeats`` chains of ``links``."""
    lanes = sched.passes.lanes(sched.loaded.kinds)
    for _ in range(batch):
        lanes.add(context, length_of(context) or CALIBRATION_KEYS)
    best = float("inf")
    for _ in range(repeats + 1):
        lanes.begin_round(1)
        choices = mx.argmax(sched.passes.padded(sched.model, lanes, mx.zeros((batch, 1), dtype=mx.int32)), axis=-1)
        mx.eval(choices)  # the chain starts from a pass already computed
        t0 = time.perf_counter()
        for _ in range(links):
            nxt = _queue_one_row(sched, lanes, choices)
            mx.eval(choices)
            choices = nxt
        best = min(best, (time.perf_counter() - t0) / links)
        mx.eval(choices)
        lanes.end_round()
    return best
