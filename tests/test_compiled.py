"""The compiled pass (engine/passes/compiled.py): traced once per shape, replayed with each round's
lengths, and bit for bit the uncompiled pass over the same fixed-shape lanes."""

from __future__ import annotations

import doctest
from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from engine.bench.cell_specs import parse_cell
from engine.bench.runner import cell_passes
from engine.model.lane_cache import LaneCache
from engine.passes import choice
from engine.passes.choice import GENERIC, accelerator, padded_width
from engine.passes.compiled import CompiledPass

pytestmark = pytest.mark.model

# Three streams just short of the first 256 positions, so the buffers grow during the rounds.
LENGTHS = (250, 241, 233)
# Each round's width: draft-free rounds, a drafting round, draft-free again (the shape seen before).
WIDTHS = (1, 1, 3, 1, 1, 1, 2, 1, 1, 1, 1)


def _lanes(loaded, fixed: bool) -> LaneCache:
    lanes = LaneCache(list(loaded.kinds), fixed=fixed)
    for n in LENGTHS:
        caches = [KVCache() for _ in range(loaded.n_layers)]
        loaded.model((mx.arange(n, dtype=mx.int32)[None] * 7) % 5000, cache=caches)
        mx.eval([c.keys for c in caches])
        lanes.add(caches)
    return lanes


def _rounds(loaded, lanes: LaneCache, run, leave_at: int | None = None, drafts: bool = False) -> tuple[list[mx.array], set]:
    """Run ``WIDTHS`` rounds, each stream keeping a different number of rows, its next inputs the
    last round's choices; the first stream leaves before round ``leave_at``; ``drafts``: drafting
    rounds padded and fixed, as the scheduler runs them compiled. Returns each round's logits and
    the shapes (batch, width, capacity) of its fixed-shape rounds."""
    out, shapes = [], set()
    tokens = mx.array([[11], [12], [13]], dtype=mx.int32)
    for i, width in enumerate(WIDTHS):
        if i == leave_at:
            lanes.remove(0)  # the last stream moves into its row
            tokens = mx.concatenate([tokens[2:], tokens[1:2]])
        if drafts and width > 1:
            width = padded_width(width)
        rows = mx.concatenate([tokens[:, :1]] * width, axis=1)
        lanes.begin_round(width, fixed=drafts and width > 1)
        if lanes.fixed:
            shapes.add((lanes.batch, width, lanes.capacity))
        logits = run(lanes, rows)
        mx.eval(logits, lanes.keys, lanes.values)
        out.append(logits)
        for row in range(lanes.batch):
            lanes.advance(row, 1 + (row + i) % width)  # each stream keeps its own number of rows
        lanes.end_round()
        tokens = mx.argmax(logits[:, -1:], axis=-1).astype(mx.int32)
    return out, shapes


@pytest.mark.parametrize("leave_at", [None, 8])
def test_replayed_rounds_equal_the_uncompiled_pass(loaded, monkeypatch, leave_at) -> None:
    """Draft-free rounds of one shape replay the first one's trace with new lengths: every round's
    logits equal the uncompiled pass's exactly, with drafting rounds (uncompiled, of their own width)
    between them, a stream leaving and the buffers growing."""
    calls = []
    model_call = type(loaded.model).__call__
    monkeypatch.setattr(type(loaded.model), "__call__", lambda self, *a, **k: calls.append(1) or model_call(self, *a, **k))
    compiled, lanes = CompiledPass(loaded.model), _lanes(loaded, fixed=True)
    calls.clear()
    got, shapes = _rounds(loaded, lanes, compiled, leave_at)
    traced = len(calls)
    want, _ = _rounds(loaded, _lanes(loaded, fixed=True), lambda lanes, rows: loaded.model(rows, cache=lanes.views), leave_at)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert mx.array_equal(g, w).item(), f"round {i} differs from the uncompiled pass"
    # Traced once per shape (batch, capacity), the buffers' growth and a leaving stream's shrinking
    # included, and replayed otherwise; each drafting round calls the model itself.
    assert any(cap > 256 for _, _, cap in shapes)
    drafting = sum(1 for w in WIDTHS if w > 1)
    assert traced - drafting == len(shapes) < len(WIDTHS) - drafting


def test_drafting_rounds_padded_and_fixed_replay_one_trace_per_width(loaded, monkeypatch) -> None:
    """A drafting round on fixed shapes (``begin_round(fixed=True)``, its width a multiple of 8 as
    ``RoundPasses.draft_step`` pads it) runs compiled: its logits equal the uncompiled pass's over
    the same lanes, and it is traced once per (batch, width, capacity) like a draft-free round."""
    calls = []
    model_call = type(loaded.model).__call__
    monkeypatch.setattr(type(loaded.model), "__call__", lambda self, *a, **k: calls.append(1) or model_call(self, *a, **k))
    compiled, lanes = CompiledPass(loaded.model), _lanes(loaded, fixed=True)
    calls.clear()
    got, shapes = _rounds(loaded, lanes, compiled, drafts=True)
    traced = len(calls)
    uncompiled = _rounds(loaded, _lanes(loaded, fixed=True), lambda lanes, rows: loaded.model(rows, cache=lanes.views),
                         drafts=True)[0]
    for i, (g, w) in enumerate(zip(got, uncompiled, strict=True)):
        assert mx.array_equal(g, w).item(), f"round {i} differs from the uncompiled pass"
    assert {w for _, w, _ in shapes} == {1, 8} and traced == len(shapes) < len(WIDTHS)


def _pending_rounds(lanes: LaneCache, run, widths: tuple[int, ...]) -> tuple[list[mx.array], set]:
    """Rounds queued before their offsets reach the host (``begin_pending``, as
    ``run_ahead.continue_copies`` queues them), each stream keeping its own number of rows. Returns
    each round's logits and the shapes (batch, width, capacity) it ran at."""
    out, shapes = [], set()
    tokens = mx.array([[11 + r] for r in range(lanes.batch)], dtype=mx.int32)
    for i, width in enumerate(widths):
        offsets = mx.array(lanes.lengths, dtype=mx.int32)
        lanes.begin_pending(width, offsets, max(lanes.lengths))
        assert lanes.fixed
        shapes.add((lanes.batch, width, lanes.capacity))
        logits = run(lanes, mx.concatenate([tokens] * width, axis=1))
        mx.eval(logits, lanes.keys, lanes.values)
        out.append(logits)
        lanes.end_round()
        for row in range(lanes.batch):
            lanes.lengths[row] += 1 + (row + i) % width
        tokens = mx.argmax(logits[:, :1], axis=-1).astype(mx.int32)
    return out, shapes


@pytest.mark.parametrize("streams", [3, 1])
def test_rounds_queued_with_continuations_run_compiled(loaded, monkeypatch, streams: int) -> None:
    """A round queued ahead with copies' continuations (its offsets still on the device) runs
    compiled on fixed lanes, a lone stream's too: its logits equal the uncompiled pass's over the
    same lanes, and each (batch, width, capacity) is traced once (the widths a multiple of
    ``CONTINUED_STEP``, as ``RoundPasses.continued_width`` pads them), the buffers growing on the way."""
    assert doctest.testmod(choice).failed == 0
    widths = tuple(padded_width(w) for w in (5, 9, 3, 16, 2, 12, 7))
    assert set(widths) == {8, 16}
    calls = []
    model_call = type(loaded.model).__call__
    monkeypatch.setattr(type(loaded.model), "__call__", lambda self, *a, **k: calls.append(1) or model_call(self, *a, **k))

    def fresh() -> LaneCache:
        lanes = _lanes(loaded, fixed=True)
        for row in reversed(range(streams, lanes.batch)):
            lanes.remove(row)
        return lanes

    compiled = CompiledPass(loaded.model)
    lanes = fresh()
    calls.clear()
    got, shapes = _pending_rounds(lanes, compiled, widths)
    traced = len(calls)
    want, _ = _pending_rounds(fresh(), lambda lanes, rows: loaded.model(rows, cache=lanes.views), widths)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert mx.array_equal(g, w).item(), f"round {i} differs from the uncompiled pass"
    assert any(cap > 256 for _, _, cap in shapes)
    assert traced == len(shapes) < len(widths)


def test_a_lone_stream_runs_uncompiled_as_mlx_lm_s_cache(loaded) -> None:
    """One stream: mlx-lm's own graph (a number offset, no mask), the same logits as mlx-lm's cache."""
    lanes = LaneCache(list(loaded.kinds), fixed=True)
    caches = [KVCache() for _ in range(loaded.n_layers)]
    solo = [KVCache() for _ in range(loaded.n_layers)]
    prompt = mx.array([[5, 6, 7, 8, 9]], dtype=mx.int32)
    loaded.model(prompt, cache=caches)
    loaded.model(prompt, cache=solo)
    lanes.add(caches)
    assert not lanes.fixed
    lanes.begin_round(1)
    assert lanes.views[0].offset == 5 and lanes.views[0].make_mask(1) is None
    got = CompiledPass(loaded.model)(lanes, mx.array([[10]], dtype=mx.int32))
    want = loaded.model(mx.array([[10]], dtype=mx.int32), cache=solo)
    assert mx.array_equal(got, want).item()


def test_a_lone_stream_compiles_where_its_lanes_say_so(loaded) -> None:
    """``fixed_alone`` (CUDA, where the masked attention is one kernel): a lone stream's draft-free
    rounds replay one trace with the length as an input, a drafting round between them runs
    uncompiled, and the greedy tokens are mlx-lm's own cache's."""
    prompt = (mx.arange(250, dtype=mx.int32)[None] * 7) % 5000
    lanes, solo = LaneCache(list(loaded.kinds), fixed=True, fixed_alone=True), [KVCache() for _ in range(loaded.n_layers)]
    caches = [KVCache() for _ in range(loaded.n_layers)]
    loaded.model(prompt, cache=caches)
    want_logits = loaded.model(prompt, cache=solo)
    lanes.add(caches)
    compiled, token = CompiledPass(loaded.model), mx.argmax(want_logits[:, -1], axis=-1).astype(mx.int32)
    got, want = [], []
    for width in (1, 1, 2, 1, 1, 1, 1, 1, 1):  # across the buffers' growth at 256 positions
        lanes.begin_round(width)
        assert lanes.fixed == (width == 1)
        logits = compiled(lanes, mx.repeat(token[:, None], width, axis=1))
        lanes.advance(0, 1)  # a drafting round keeps its first row, as a rejected draft would leave it
        lanes.end_round()
        ref = loaded.model(token[:, None], cache=solo)
        got.append(mx.argmax(logits[:, 0], axis=-1).item())
        want.append(mx.argmax(ref[:, -1], axis=-1).item())
        token = mx.argmax(ref[:, -1], axis=-1).astype(mx.int32)
    assert got == want
    assert lanes.capacity > 256 and compiled.failed is None


def test_bench_cells_choose_compiled_or_not(loaded) -> None:
    """On an accelerator's passes a cell runs compiled unless it says ``compiled=false`` (then the same
    passes uncompiled, still run ahead), so `lanes bench` measures the two side by side."""
    gpu = replace(loaded, passes=accelerator(loaded.model, loaded.kinds))
    assert gpu.passes.compiled is not None and gpu.passes.speculate_ahead
    assert cell_passes(gpu, parse_cell("plain")) is gpu.passes
    uncompiled = cell_passes(gpu, parse_cell("plain:compiled=false"))
    assert uncompiled.compiled is None and uncompiled.speculate_ahead
    assert cell_passes(gpu, parse_cell("on:generic_pass=true")) is GENERIC
    assert cell_passes(loaded, parse_cell("on:compiled=false")) is loaded.passes  # the CPU's: nothing compiled
    assert parse_cell("on:compiled=false").with_settings(loaded.family) == loaded.family  # not a family setting


def test_a_model_that_cannot_be_traced_runs_uncompiled(loaded, monkeypatch, caplog) -> None:
    """A layer that reads an array's value cannot be traced: the round runs uncompiled instead, with
    the same logits and a warning, and later rounds do not try again."""
    model_call = type(loaded.model).__call__
    reads = []

    def reading(self, inputs, *args, **kwargs):
        reads.append(mx.max(inputs).item())  # an eval: refused inside a trace
        return model_call(self, inputs, *args, **kwargs)

    compiled = CompiledPass(loaded.model)
    got, _ = _rounds(loaded, _lanes(loaded, fixed=True), compiled)  # traced before the patch: works
    monkeypatch.setattr(type(loaded.model), "__call__", reading)
    fresh, lanes = CompiledPass(loaded.model), _lanes(loaded, fixed=True)
    reads.clear()
    with caplog.at_level("WARNING"):
        failing, _ = _rounds(loaded, lanes, fresh)
    assert fresh.failed is not None and compiled.failed is None
    assert sum("cannot be compiled" in r.getMessage() for r in caplog.records) == 1
    assert len(reads) == len(WIDTHS)  # after the failed trace every round ran the model itself
    for g, f in zip(got, failing, strict=True):
        assert mx.array_equal(g, f).item()
