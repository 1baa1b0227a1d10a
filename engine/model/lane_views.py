"""The views of a ``LaneCache`` that mlx-lm's layers call, one per cached layer: ``LayerView`` for
attention (``update_and_fetch``, ``offset``, ``make_mask``) and ``StateView`` for a recurrent layer
(``cache[i]``, ``lengths``, ``make_mask``). The lengths, masks and buffers live once in the
``LaneCache`` (engine.model.lane_cache's docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from engine.model import lane_attention
from engine.model.state_replay import Call

if TYPE_CHECKING:
    from engine.model.lane_cache import LaneCache


class LayerView:
    """One layer's slice of a ``LaneCache``; what the model's attention calls."""

    def __init__(self, lanes: LaneCache, layer: int) -> None:
        self._lanes = lanes
        self._layer = layer

    @property
    def offset(self) -> mx.array | int:
        # Per-row rotary positions: each stream's rows start at its own length. A lone stream's is
        # a number, as in mlx-lm's own cache (one rope call with fewer inputs, on every layer), unless
        # its length is still on the device (``LaneCache.begin_pending``) or a compiled pass's input.
        lanes = self._lanes
        return lanes.lengths[0] if lanes.batch == 1 and not (lanes.pending or lanes.fixed) else lanes.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return self._lanes.write(self._layer, keys, values)

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array | None:
        window = window_size or self._lanes.kinds[self._layer].window
        if n == 1 and not return_array and self._lanes.alone_within(window):
            return None  # what mlx-lm's cache gives one query row: nothing to hide, so no mask to apply
        return self._lanes.mask(n, window)

    def fused_attention(self, queries: mx.array, keys: mx.array, values: mx.array, scale: float,
                        mask: object) -> mx.array | None:
        """What ``engine.model.lane_attention``'s routing asks: where the lanes are ``fused`` and ``mask``
        is this round's own, attention by its kernel, reading the lengths; else None (mlx-lm's)."""
        lanes, window = self._lanes, self._lanes.kinds[self._layer].window
        if not lanes.fused or mask is None or not lane_attention.fits(queries, keys, values):
            return None
        if mask is not lanes.mask(queries.shape[2], window):  # a mask the layer made for itself
            return None
        return lane_attention.attend(queries, keys, values, lanes.offsets, scale, window)

    @property
    def nbytes(self) -> int:
        k, v = self._lanes.keys[self._layer], self._lanes.values[self._layer]
        return 0 if k is None or v is None else k.nbytes + v.nbytes


class StateView:
    """One recurrent layer's slice of a ``LaneCache``: the ``ArraysCache`` protocol mlx-lm's conv and
    SSM layers call, over every stream's state (axis 0: one row per stream)."""

    left_padding = None

    def __init__(self, lanes: LaneCache, layer: int) -> None:
        self._lanes = lanes
        self._layer = layer

    def __getitem__(self, idx: int) -> mx.array | None:
        return self._lanes.states[self._layer][idx]

    def __setitem__(self, idx: int, value: mx.array) -> None:
        self._lanes.states[self._layer][idx] = value

    @property
    def lengths(self) -> mx.array | None:
        # Each stream's real rows in this pass: its state stops there (None: every row is real).
        return self._lanes.state_lengths

    def advance(self, n: int) -> None:
        pass  # the lengths are the round's, set by LaneCache

    def make_mask(self, n: int, **kwargs: object) -> mx.array | None:
        lengths = self._lanes.state_lengths
        return None if lengths is None else mx.arange(n)[None] < lengths[:, None]

    def record(self, call: Call) -> None:
        self._lanes.calls[self._layer] = call

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._lanes.states[self._layer] if a is not None)
