"""The grouped forward pass (engine/passes/grouped.py) against the padded one, on the real model."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from engine.model.lane_cache import LaneCache
from engine.passes.grouped import ROW_MULTIPLE, Chunk, grouped_logits, supports_grouped

pytestmark = pytest.mark.model


def lanes_with(loaded, lengths: list[int]) -> LaneCache:
    lanes = LaneCache(loaded.n_layers)
    for b, n in enumerate(lengths):
        caches = [KVCache() for _ in range(loaded.n_layers)]
        loaded.model(mx.array([[(7 * b + 13 * i) % 5000 + 100 for i in range(n)]], dtype=mx.int32), cache=caches)
        lanes.add(caches)
    return lanes


@pytest.mark.parametrize("widths", [[9, 1, 1, 1], [1, 5, 1, 3], [4, 4, 1, 1], [2, 1]])
@pytest.mark.parametrize("row_multiple", [1, ROW_MULTIPLE])
def test_grouped_pass_matches_the_padded_pass(loaded, widths: list[int], row_multiple: int) -> None:
    assert supports_grouped(loaded.model)
    lengths = [40 + 9 * b for b in range(len(widths))]  # streams of different lengths
    rows = [[(31 * b + 5 * j) % 5000 + 50 for j in range(w)] for b, w in enumerate(widths)]
    width = max(widths)

    padded_lanes = lanes_with(loaded, lengths)
    padded_lanes.begin_round(width)
    inputs = mx.array([r + [r[-1]] * (width - len(r)) for r in rows], dtype=mx.int32)
    padded = loaded.model(inputs, cache=padded_lanes.views)
    padded_lanes.end_round()

    lanes = lanes_with(loaded, lengths)
    groups = lanes.begin_grouped(widths)
    assert [len(g.rows) for g in groups] == [sum(w > 1 for w in widths), sum(w == 1 for w in widths)]
    flat = grouped_logits(loaded.model, lanes, groups, rows, row_multiple)
    lanes.end_round()

    assert flat.shape == (sum(widths), padded.shape[-1])
    at = 0
    for b, w in enumerate(widths):
        mine, theirs = flat[at : at + w], padded[b, :w]
        at += w
        assert mx.array_equal(mx.argmax(mine, axis=-1), mx.argmax(theirs, axis=-1)).item()
        assert mx.abs(mine - theirs).max().item() < 1e-3  # float rounding of other matmul shapes
        # The stream's new keys went to the same positions, with the same values.
        for layer in (0, loaded.n_layers - 1):
            new = slice(lengths[b], lengths[b] + w)
            mk, pk = lanes.keys[layer][b, :, new], padded_lanes.keys[layer][b, :, new]
            assert mx.abs(mk - pk).max().item() < 1e-3
            old = slice(0, lengths[b])
            assert mx.array_equal(lanes.keys[layer][b, :, old], padded_lanes.keys[layer][b, :, old]).item()


@pytest.mark.parametrize("row_multiple", [1, ROW_MULTIPLE])
@pytest.mark.parametrize("chunk_len", [1, 37])
def test_a_prompt_chunk_rides_in_the_pass(loaded, row_multiple: int, chunk_len: int) -> None:
    """A chunk in a grouped pass leaves the rounds' logits as they were without it and fills its
    caches as mlx-lm's own prefill of those tokens does."""
    widths, lengths = [5, 1, 1], [40, 49, 58]
    rows = [[(31 * b + 5 * j) % 5000 + 50 for j in range(w)] for b, w in enumerate(widths)]
    before = [(11 * i) % 4000 + 70 for i in range(23)]
    tokens = [(17 * i) % 4000 + 90 for i in range(chunk_len)]

    def prefilled() -> list[KVCache]:
        caches = [KVCache() for _ in range(loaded.n_layers)]
        loaded.model.model(mx.array([before], dtype=mx.int32), cache=caches)
        return caches

    alone_lanes = lanes_with(loaded, lengths)
    alone = grouped_logits(loaded.model, alone_lanes, alone_lanes.begin_grouped(widths), rows, row_multiple)
    theirs = prefilled()
    loaded.model.model(mx.array([tokens], dtype=mx.int32), cache=theirs)

    lanes, mine = lanes_with(loaded, lengths), prefilled()
    riding = grouped_logits(loaded.model, lanes, lanes.begin_grouped(widths), rows, row_multiple,
                            Chunk(tokens, mine))

    assert riding.shape == alone.shape
    assert mx.array_equal(mx.argmax(riding, axis=-1), mx.argmax(alone, axis=-1)).item()
    assert mx.abs(riding - alone).max().item() < 1e-3
    for m, t in zip(mine, theirs, strict=True):
        assert m.offset == t.offset == len(before) + chunk_len
    for layer in (0, loaded.n_layers - 1):
        m, t = mine[layer], theirs[layer]
        assert mx.abs(m.keys[..., : m.offset, :] - t.keys[..., : t.offset, :]).max().item() < 1e-3
        assert mx.abs(m.values[..., : m.offset, :] - t.values[..., : t.offset, :]).max().item() < 1e-3


def grouped_pass_with_chunk(
    loaded, widths: list[int], with_chunk: bool, host_exp: bool, rope_table: bool = False
) -> tuple[mx.array, list[KVCache]]:
    """A grouped pass over streams of lengths 300, 41, 77, 120 (and a 40-token chunk): logits, chunk caches."""
    lengths = [300, 41, 77, 120][: len(widths)]
    rows = [[(31 * b + 5 * j) % 5000 + 50 for j in range(w)] for b, w in enumerate(widths)]
    lanes, caches = lanes_with(loaded, lengths), [KVCache() for _ in range(loaded.n_layers)]
    chunk = Chunk([(17 * i) % 4000 + 90 for i in range(40)], caches) if with_chunk else None
    logits = grouped_logits(loaded.model, lanes, lanes.begin_grouped(widths), rows, ROW_MULTIPLE, chunk, host_exp,
                            rope_table)
    return logits, caches


@pytest.mark.parametrize("with_chunk", [False, True])
def test_host_exp_pass_matches_the_mlx_one(loaded, with_chunk: bool) -> None:
    """Softmax and SiLU on numpy (engine.passes.numpy_ops) give the logits and keys MLX's own do, to rounding."""
    (mlx_pass, mlx_caches), (host_pass, host_caches) = (
        grouped_pass_with_chunk(loaded, [9, 1, 4, 1], with_chunk, host_exp) for host_exp in (False, True)
    )
    assert mx.array_equal(mx.argmax(mlx_pass, axis=-1), mx.argmax(host_pass, axis=-1)).item()
    assert mx.abs(mlx_pass - host_pass).max().item() < 1e-3
    if with_chunk:
        for layer in (0, loaded.n_layers - 1):
            m, h = mlx_caches[layer], host_caches[layer]
            assert m.offset == h.offset == 40
            assert mx.abs(m.keys[..., : m.offset, :] - h.keys[..., : h.offset, :]).max().item() < 1e-3


def test_prefill_fills_caches_as_mlx_lm_does(loaded) -> None:
    from engine.passes.grouped import prefill

    tokens = [(13 * i) % 4000 + 60 for i in range(150)]
    theirs = [KVCache() for _ in range(loaded.n_layers)]
    loaded.model.model(mx.array([tokens], dtype=mx.int32), cache=theirs)
    mine = [KVCache() for _ in range(loaded.n_layers)]
    prefill(loaded.model, Chunk(tokens[:100], mine), ROW_MULTIPLE, host_exp=True)
    prefill(loaded.model, Chunk(tokens[100:], mine), ROW_MULTIPLE, host_exp=True)
    for m, t in zip(mine, theirs, strict=True):
        assert m.offset == t.offset == len(tokens)
        assert mx.abs(m.keys[..., : m.offset, :] - t.keys[..., : t.offset, :]).max().item() < 1e-3
        assert mx.abs(m.values[..., : m.offset, :] - t.values[..., : t.offset, :]).max().item() < 1e-3


def test_other_architectures_are_not_grouped() -> None:
    import mlx.nn as nn

    assert not supports_grouped(nn.Linear(2, 2))


@pytest.mark.parametrize(("lengths", "width"), [([40], 1), ([40], 4), ([40, 77, 300, 12], 1), ([40, 77, 5], 5)])
def test_padded_pass_is_mlx_lms_bit_for_bit(loaded, lengths: list[int], width: int) -> None:
    """engine.passes.padded's pass (the rotary table made once) gives mlx-lm's logits and keys exactly."""
    from engine.passes.padded import padded_logits, supports_padded

    assert supports_padded(loaded.model)
    tokens = mx.array([[(31 * b + 5 * j) % 5000 + 50 for j in range(width)] for b in range(len(lengths))],
                      dtype=mx.int32)
    theirs, mine = lanes_with(loaded, lengths), lanes_with(loaded, lengths)
    theirs.begin_round(width)
    mine.begin_round(width)
    expected = loaded.model(tokens, cache=theirs.views)
    assert mx.array_equal(padded_logits(loaded.model, mine, tokens), expected).item()
    for layer in range(loaded.n_layers):
        assert mx.array_equal(mine.keys[layer], theirs.keys[layer]).item()
        assert mx.array_equal(mine.values[layer], theirs.values[layer]).item()


@pytest.mark.parametrize("host_exp", [False, True])
def test_rotary_table_leaves_the_grouped_pass_unchanged(loaded, host_exp: bool) -> None:
    (rope_pass, rope_caches), (table_pass, table_caches) = (
        grouped_pass_with_chunk(loaded, [12, 1, 5, 1], True, host_exp, rope_table) for rope_table in (False, True)
    )
    assert mx.array_equal(rope_pass, table_pass).item()
    for layer in range(loaded.n_layers):
        assert mx.array_equal(rope_caches[layer].keys, table_caches[layer].keys).item()


def test_other_models_keep_mlx_lms_own_pass() -> None:
    import mlx.nn as nn

    from engine.passes.padded import supports_padded

    assert not supports_padded(nn.Linear(2, 2))


def test_a_pass_that_raises_after_writing_is_undone_exactly(loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """``save`` / ``restore`` around a pass that wrote five layers of lane buffers and chunk caches and
    then raised: every buffer holds again exactly what it held (MLX's slice assignment rewrites the
    arrays in place, so keeping references would keep the pass's writes)."""
    import numpy as np

    import engine.passes.grouped as forward_mod

    widths, lengths = [4, 1, 2], [40, 49, 58]
    rows = [[(31 * b + 5 * j) % 5000 + 50 for j in range(w)] for b, w in enumerate(widths)]
    lanes = lanes_with(loaded, lengths)
    caches = [KVCache() for _ in range(loaded.n_layers)]
    loaded.model.model(mx.array([[(11 * i) % 4000 + 70 for i in range(23)]], dtype=mx.int32), cache=caches)
    chunk = Chunk([(17 * i) % 4000 + 90 for i in range(12)], caches)
    copy = lambda arrays: [None if a is None else np.array(a) for a in arrays]  # noqa: E731
    lane_keys, lane_values = copy(lanes.keys), copy(lanes.values)
    chunk_keys, chunk_values = copy(c.keys for c in caches), copy(c.values for c in caches)

    real, calls = forward_mod._chunk_qkv, {"n": 0}

    def faulty(*args):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("injected")
        return real(*args)

    saved = (lanes.save(max(widths)), chunk.save())
    monkeypatch.setattr(forward_mod, "_chunk_qkv", faulty)
    with pytest.raises(RuntimeError, match="injected"):
        logits = grouped_logits(loaded.model, lanes, lanes.begin_grouped(widths), rows, ROW_MULTIPLE, chunk)
        mx.eval(logits)
    assert not np.array_equal(np.array(lanes.keys[0]), lane_keys[0])  # the pass did write before it raised
    lanes.restore(saved[0])
    chunk.restore(saved[1])
    for now, before in ((lanes.keys, lane_keys), (lanes.values, lane_values),
                        ([c.keys for c in caches], chunk_keys), ([c.values for c in caches], chunk_values)):
        assert all(np.array_equal(np.array(a), b) for a, b in zip(now, before, strict=True))
    assert [c.offset for c in caches] == [23] * loaded.n_layers and lanes.lengths == lengths
