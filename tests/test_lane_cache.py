"""engine.model.lane_cache on literal data: where a round's keys land, and what a lone stream's
layers are given (mlx-lm's own number offset, and no mask for one query row)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from engine.model.cache_kinds import LayerKind
from engine.model.lane_cache import LaneCache

HEADS, DIM = 2, 3


def stream(length: int, fill: float, heads: int = HEADS, dim: int = DIM) -> list[KVCache]:
    """One layer's cache of a stream (repeat it for more layers: the lanes copy what they take)."""
    c = KVCache()
    c.keys = mx.full((1, heads, length, dim), fill)
    c.values = mx.full((1, heads, length, dim), -fill)
    c.offset = length
    mx.eval(c.keys, c.values)
    return [c]


def lanes_of(lengths: list[int], kinds: list[LayerKind] | None = None) -> LaneCache:
    lanes = LaneCache(kinds or [LayerKind()])
    for i, n in enumerate(lengths):
        lanes.add(stream(n, float(i + 1)) * len(lanes.kinds), n)
    return lanes


def test_the_worked_example_writes_each_stream_at_its_own_length() -> None:
    lanes = lanes_of([5, 3])
    lanes.begin_round(4)
    new = mx.arange(2 * HEADS * 4 * DIM, dtype=mx.float32).reshape(2, HEADS, 4, DIM) + 100
    keys, values = lanes.views[0].update_and_fetch(new, -new)
    assert keys.shape == values.shape == (2, HEADS, 9, DIM)  # the longest length plus the round's rows
    k = np.array(lanes.keys[0])
    assert (k[0, :, :5] == 1).all() and (k[0, :, 5:9] == np.array(new[0])).all()
    assert (k[1, :, :3] == 2).all() and (k[1, :, 3:7] == np.array(new[1])).all()
    assert (k[1, :, 7:] == 0).all() and (k[0, :, 9:] == 0).all()
    assert (np.array(lanes.values[0])[1, :, 3:7] == -np.array(new[1])).all()
    lanes.advance(0, 2)
    lanes.advance(1, 4)
    assert lanes.lengths == [7, 7]


def test_a_group_of_some_streams_writes_only_theirs() -> None:
    lanes = lanes_of([4, 6, 2])
    (wide, narrow) = lanes.begin_grouped([3, 1, 2])
    assert wide.rows == (0, 2) and narrow.rows == (1,)
    new = mx.full((2, HEADS, 3, DIM), 9.0)
    lanes.put_group(0, wide, new, new)
    k = np.array(lanes.keys[0])
    assert (k[0, :, 4:7] == 9).all() and (k[2, :, 2:5] == 9).all()
    assert (k[1] != 9).all()  # the narrow group's stream is untouched


def test_a_lone_stream_gets_a_number_offset_and_no_mask_for_one_row() -> None:
    lanes = lanes_of([5])
    lanes.begin_round(1)
    view = lanes.views[0]
    assert view.offset == 5 and isinstance(view.offset, int)
    assert view.make_mask(1) is None
    assert view.make_mask(1, return_array=True).shape == (1, 1, 1, 6)
    lanes.end_round()
    lanes.begin_round(3)  # drafted rows attend causally: a mask
    assert lanes.views[0].make_mask(3).tolist() == lanes.mask(3).tolist()
    assert np.array(lanes.views[0].make_mask(3))[0, 0].sum(axis=-1).tolist() == [6, 7, 8]


def test_a_lone_stream_past_its_window_is_masked() -> None:
    lanes = lanes_of([5], [LayerKind(window=4)])
    lanes.begin_round(1)
    mask = lanes.views[0].make_mask(1)
    assert mask is not None and np.array(mask)[0, 0, 0].tolist() == [False, False, True, True, True, True]


def test_several_streams_get_offsets_and_masks() -> None:
    lanes = lanes_of([5, 3])
    lanes.begin_round(1)
    view = lanes.views[0]
    assert view.offset.tolist() == [5, 3]
    assert np.array(view.make_mask(1))[:, 0, 0].tolist() == [[True] * 6, [True] * 4 + [False] * 2]


def test_joins_leaves_and_growth_copy_the_lanes_a_few_layers_at_a_time() -> None:
    """Joining, leaving and a longer capacity copy every row (MLX arrays do not resize); done a group
    of layers at a time, the lanes are never held twice over: on a machine whose KV share is full
    that copy would be the one allocation too many. Rows keep their contents either way."""
    layers = 24
    lanes = LaneCache(layers)
    for i in range(6):
        lanes.add(stream(1000, float(i + 1), 4, 64) * layers)
    size = sum(k.nbytes + v.nbytes for k, v in zip(lanes.keys, lanes.values, strict=True))  # 6 x 24 x 2 MiB
    newcomer = stream(1000, 7.0, 4, 64) * layers
    for change in (lambda: lanes.add(newcomer), lambda: lanes.remove(2)):
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        change()
        row = size / 6
        assert mx.get_peak_memory() - before < row + size / 4, (mx.get_peak_memory() - before) / size
    assert lanes.lengths == [1000] * 6
    firsts = [float(lanes.keys[layers - 1][r, 0, 999, 0]) for r in range(6)]
    assert firsts == [1.0, 2.0, 7.0, 4.0, 5.0, 6.0] and float(lanes.values[0][2, 3, 0, 63]) == -7.0  # the last moved in
    # A round whose rows pass the capacity (1,024) grows every row to 1,280: a quarter more, and no
    # more than another quarter held at once on the way.
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    lanes.begin_round(30)
    mx.eval([view.update_and_fetch(mx.ones((6, 4, 30, 64)), mx.ones((6, 4, 30, 64))) for view in lanes.views])
    assert lanes.capacity == 1280 and mx.get_peak_memory() - before < size / 2, (mx.get_peak_memory() - before) / size
    assert float(lanes.keys[0][2, 0, 999, 0]) == 7.0 and float(lanes.keys[0][2, 0, 1029, 0]) == 1.0


def test_a_leave_moves_the_last_row_and_a_join_fills_the_spare_one() -> None:
    """A leave copies one row (the last stream's, into the leaver's) and a join writes into the row
    that left spare, so neither copies every stream; with more spare rows than streams the buffers
    shrink to the streams'. Each stream's keys stay its own, and a round after writes at its length."""
    layers = 24
    lanes = LaneCache(layers)
    for i in range(6):
        lanes.add(stream(1000, float(i + 1), 4, 64) * layers)
    row = sum(k.nbytes + v.nbytes for k, v in zip(lanes.keys, lanes.values, strict=True)) / 6
    for change in (lambda: lanes.remove(1), lambda: lanes.add(stream(500, 9.0, 4, 64) * layers)):
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        change()
        assert mx.get_peak_memory() - before < 2 * row, (mx.get_peak_memory() - before) / row
        assert lanes.slots == 6
    assert lanes.lengths == [1000] * 5 + [500]
    assert [float(lanes.keys[layers - 1][r, 0, 0, 0]) for r in range(6)] == [1.0, 6.0, 3.0, 4.0, 5.0, 9.0]
    lanes.begin_round(2)
    keys, _ = lanes.views[0].update_and_fetch(mx.full((6, 4, 2, 64), 0.5), mx.full((6, 4, 2, 64), -0.5))
    assert keys.shape == (6, 4, 1002, 64)
    assert float(keys[5, 0, 499, 0]) == 9.0 and float(keys[5, 0, 500, 0]) == 0.5 and float(keys[1, 0, 1001, 0]) == 0.5
    lanes.end_round()
    for leaver in (0, 0, 0, 0):
        lanes.remove(leaver)
    assert lanes.batch == 2 and lanes.slots == 2  # four spare rows for two streams: copied down
    assert [float(lanes.keys[0][r, 0, 0, 0]) for r in range(2)] == [3.0, 6.0]  # 9, 5 and 4 moved in, then left


def test_streams_about_to_join_get_rows_made_with_the_copy_that_makes_room() -> None:
    """The scheduler passes how many admitted streams are still joining: the copy that makes room for
    one makes rows for them too, and each then writes only its own row."""
    layers = 8
    lanes = LaneCache(layers)
    lanes.add(stream(300, 1.0, 4, 64) * layers, spare=2)
    assert (lanes.batch, lanes.slots) == (1, 3)
    row = sum(k.nbytes + v.nbytes for k, v in zip(lanes.keys, lanes.values, strict=True)) / 3
    for fill in (2.0, 3.0):
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        lanes.add(stream(300, fill, 4, 64) * layers)
        assert mx.get_peak_memory() - before < 2 * row and lanes.slots == 3
    lanes.add(stream(200, 4.0, 4, 64) * layers)  # no row left: every row copied into four
    assert lanes.slots == lanes.batch == 4 and lanes.lengths == [300, 300, 300, 200]
    assert [float(lanes.keys[layers - 1][r, 3, 199, 63]) for r in range(4)] == [1.0, 2.0, 3.0, 4.0]


def test_a_pass_queued_ahead_writes_at_offsets_on_the_device() -> None:
    """``begin_pending``: rows start at offsets still being computed (here given), every key up to
    the bound is attended under the mask, and a lone stream too gets the mask and an array offset."""
    lanes = lanes_of([250, 600])
    new = mx.arange(2 * HEADS * 20 * DIM, dtype=mx.float32).reshape(2, HEADS, 20, DIM) + 100
    lanes.begin_pending(20, mx.array([240, 590]), 600)
    keys, _ = lanes.views[0].update_and_fetch(new, -new)
    assert keys.shape[2] == 620
    mask = np.array(lanes.views[0].make_mask(20))
    assert mask[0, 0, 0, 240] and not mask[0, 0, 0, 241] and mask[1, 0, 19, 609] and not mask[1, 0, 19, 610]
    k = np.array(lanes.keys[0])
    assert (k[0, :, 240:260] == np.array(new[0])).all() and (k[1, :, 590:610] == np.array(new[1])).all()
    lanes.end_round()
    alone = lanes_of([30])
    alone.begin_pending(3, mx.array([31]), 33)
    assert alone.views[0].offset is alone.offsets and alone.views[0].make_mask(1 + 2) is not None

def test_a_leave_keeps_what_a_pass_queued_ahead_wrote_past_the_host_lengths() -> None:
    """Without ``reach`` a leave would shrink the buffers to the host's lengths, losing the keys a
    pass queued ahead wrote past them (which its verification then keeps)."""
    for reach, capacity in ((0, 256), (270, 512)):
        lanes = lanes_of([250, 600, 10])
        new = mx.ones((3, HEADS, 20, DIM)) * 7
        lanes.begin_pending(20, mx.array([250, 600, 10]), 600)
        lanes.views[0].update_and_fetch(new, -new)
        lanes.end_round()
        lanes.remove(1, reach=reach)  # the long stream leaves; the one at 250 wrote up to 270
        assert lanes.capacity == capacity
        assert (np.array(lanes.keys[0])[0, :, 250 : min(270, capacity)] == 7).all()
