"""A batched KV cache whose rows (streams) each have their own length.

mlx-lm's ``BatchKVCache.trim`` trims every row alike; a shared round accepts a
different number of rows per stream, so rollback here is per row and free:

    keys    # [batch, kv_heads, capacity, head_dim], one row per stream
    lengths # [batch] host ints: how many positions of each row are real

A round writes each stream's Q query rows at positions ``lengths[i] ..
lengths[i] + Q - 1`` and masks every key at or past ``lengths[i] + j`` for its
query row j. After verification the scheduler calls ``advance(i, kept)``:
positions past the new length are rejected rows, which the mask hides and the
next round overwrites, so they leave no trace.

Worked example: two streams of lengths [5, 3] run a round of width 4. Row 0
writes positions 5..8, row 1 writes 3..6. Row 0 keeps 2 (its next token and one
accepted draft) and row 1 keeps 4: lengths become [7, 7].

Streams join and leave by copying one row where they can (``add``, ``remove``): a leave moves
the last stream into the leaver's row, leaving a spare row (``slots``) the next join fills.

The model sees one view per cached layer, the interface mlx-lm's layers call:
``LayerView`` for attention (``update_and_fetch``, ``offset``, ``make_mask``; a
sliding-window layer's mask also hides keys older than its window; on CUDA
``fused_attention``, ``engine.model.lane_attention``) and
``StateView`` for a recurrent layer (``cache[i]`` reads and writes, ``lengths``,
``make_mask``: what mlx-lm's batched generation gives its conv and SSM layers).
The lengths and masks live once in ``LaneCache``. A recurrent layer's state cannot be
overwritten later like a rejected row's keys: a round stops each stream's state at its real
rows, and ``settle`` replays the kept rows of streams that rejected some (``state_replay``).

A *grouped* round (``begin_grouped``, used by ``engine.passes.grouped``) gives each
stream its own width instead: streams with one row are attended as one group,
the others as a second group padded to the widest of them, so one long window
does not make every stream attend a long block of padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from engine.model.cache_kinds import LayerKind, cache_arrays, length_of
from engine.model.lane_buffers import STEP, capacity_for, round_up, stack
from engine.model.lane_snapshot import Saved, put_back, snapshot
from engine.model.lane_views import LayerView, StateView
from engine.model.state_replay import Call


@dataclass(frozen=True)
class Group:
    """Streams attended together in a grouped round, each with ``width`` query rows."""

    rows: tuple[int, ...]  # rows of the LaneCache, ascending
    width: int
    offsets: mx.array  # [len(rows)] each stream's length: its rotary offset and first position written
    mask: mx.array  # [len(rows), 1, width, end]
    end: int  # keys attended: the longest length in the group + width
    index: mx.array | None  # rows as an array when they are neither all rows nor one


class LaneCache:
    """Cache storage for every active stream, with a length per row.

    ``kinds``: one ``LayerKind`` per cached layer (``engine.model.cache_kinds``), or a layer count for a
    model of plain attention layers only. ``fixed``: a draft-free round (one row per stream) of
    several streams, and a round queued before its offsets reach the host (``begin_pending``), has
    a graph that depends on its shapes alone (``place``), as a compiled pass needs
    (``engine.passes.compiled``); a lone stream's draft-free round keeps mlx-lm's own cache's graph,
    which has fewer kernels (``fixed_alone``: unless its attention is one kernel either way), and a
    drafting round the graph of its own width unless ``begin_round(fixed=True)`` says it is compiled
    too. ``fused``: ``LayerView.fused_attention``."""

    def __init__(self, kinds: int | list[LayerKind], fixed: bool = False, fused: bool = False,
                 fixed_alone: bool = False) -> None:
        self._fixed, self.fixed_alone, self.fused = fixed, fixed_alone, fused
        self._forced = False  # this round's shapes fixed whatever its width (``begin_round``)
        self.kinds = [LayerKind()] * kinds if isinstance(kinds, int) else list(kinds)
        self.n_layers = n_layers = len(self.kinds)
        self.keys: list[mx.array | None] = [None] * n_layers
        self.values: list[mx.array | None] = [None] * n_layers
        # Recurrent layers: their arrays of state, each [batch, ...]; rows as in ``lengths``.
        self.states: list[list[mx.array | None]] = [[None] * k.states for k in self.kinds]
        self.recurrent = [i for i, k in enumerate(self.kinds) if k.recurrent]
        self.lengths: list[int] = []
        self.views = [StateView(self, i) if k.recurrent else LayerView(self, i) for i, k in enumerate(self.kinds)]
        self.state_lengths: mx.array | None = None
        self.calls: dict[int, Call] = {}  # each recurrent layer's mixer call in this round
        self._width = 0
        self._real: list[int] = []  # each row's real (unpadded) rows in this round
        self._kept: list[int] = []
        self._before: list[list[mx.array | None]] | None = None  # states at the round's start
        self._offsets: mx.array | None = None
        self._pending: int | None = None  # keys attended by a round whose offsets are on the device
        self._mask: mx.array | None = None
        self._masks: dict[int, mx.array] = {}  # by sliding window
        self._scatter: dict[tuple[tuple[int, ...], int, int], tuple[mx.array, ...]] = {}  # (rows, heads, width)

    # -- shape ---------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def fixed(self) -> bool:  # whether this round's shapes alone decide its graph (class docstring)
        compiled = self._forced or (self._width == 1 and (self.batch > 1 or self.fixed_alone))
        return self._fixed and (self._pending is not None or compiled)

    @property
    def slots(self) -> int:
        """Rows the buffers have: the streams' and spare ones a leave left at the end (it moves the last
        stream into its row, a join fills one: each copies a row, not all: MLX arrays do not resize)."""
        k = next((k for k in self.keys if k is not None), None)
        return self.batch if k is None else k.shape[0]

    @property
    def capacity(self) -> int:
        k = next((k for k in self.keys if k is not None), None)
        return 0 if k is None else k.shape[2]

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views)

    # -- round protocol ------------------------------------------------------
    def begin_round(self, width: int, real: Sequence[int] | None = None, fixed: bool = False) -> None:
        """Prepare a pass of ``width`` query rows per stream, row i's first ``real[i]`` real (the rest pad
        it; by default all). ``fixed``: on fixed lanes, fixed shapes whatever the width (compiled drafts)."""
        self._reserve(width)
        self._forced = fixed
        if self.fixed:
            self.place(mx.array(self.lengths, dtype=mx.int32))
        else:
            everyone = self._group(tuple(range(self.batch)), width)
            self._offsets, self._mask = everyone.offsets, everyone.mask  # mask: [batch, 1, width, keys]
        self._real = list(real) if real is not None else [width] * self.batch
        self._kept = list(self._real)
        if self.recurrent:
            self._before = [list(s) for s in self.states]
            if any(r < width for r in self._real):
                self.state_lengths = mx.array(self._real, dtype=mx.int32)

    def place(self, offsets: mx.array) -> None:
        """This round's rows start at ``offsets`` (an array: a compiled pass's input, or a pending
        round's); with ``fixed`` shapes every stream attends the whole capacity, masked, and writes
        by one scatter, so no Python number of the lengths enters the graph.
        The mask is made when a layer first asks for it: inside the compiled pass, from its input."""
        self._offsets, self._mask = offsets, None
        self._masks, self._scatter = {}, {}

    def begin_pending(self, width: int, offsets: mx.array, most: int) -> None:
        """Prepare a pass queued before the previous round's verification reaches the host: each
        stream's ``width`` rows start at ``offsets`` (an array still being computed), at most ``most``;
        every key up to ``most + width`` is attended under the mask, a lone stream's too. On
        ``fixed`` lanes every key of the capacity is, so that the graph depends on the width alone."""
        self._reserve_to(most + width, width)
        self._pending = most + width
        self.place(offsets)  # the mask is made when a layer first asks for it
        self._real = [width] * self.batch
        self._kept = list(self._real)

    @property
    def pending(self) -> bool:  # this round's offsets are on the device (``begin_pending``)
        return self._pending is not None

    def begin_grouped(self, widths: Sequence[int]) -> list[Group]:
        """Prepare a round where row i has ``widths[i]`` query rows (see the module docstring)."""
        assert len(widths) == self.batch
        self._reserve(max(widths))
        groups = []
        for rows in ([r for r, w in enumerate(widths) if w > 1], [r for r, w in enumerate(widths) if w == 1]):
            if rows:
                groups.append(self._group(tuple(rows), max(widths[r] for r in rows)))
        return groups

    def begin_host(self, widths: Sequence[int]) -> None:
        """Prepare a round whose pass writes the buffers itself (``engine.passes.numpy_pass``): room for the
        widest stream's rows, and no masks (it makes its own)."""
        assert len(widths) == self.batch
        self._reserve(max(widths))

    def _reserve(self, width: int) -> None:
        self._reserve_to(max(self.lengths) + width, width)

    def _reserve_to(self, need: int, width: int) -> None:
        if need > self.capacity:
            self._grow(need)
        self._width = width
        self._scatter = {}

    def _group(self, rows: tuple[int, ...], width: int) -> Group:
        lengths = [self.lengths[r] for r in rows]
        end = max(lengths) + width
        offsets = mx.array(lengths, dtype=mx.int32)
        query = mx.arange(width, dtype=mx.int32)[None, None, :, None]
        keypos = mx.arange(end, dtype=mx.int32)[None, None, None, :]
        mask = keypos <= offsets[:, None, None, None] + query
        index = None if len(rows) in (1, self.batch) else mx.array(rows, dtype=mx.int32)
        return Group(rows, width, offsets, mask, end, index)

    def write_group(self, layer: int, group: Group, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write a group's new keys and values ([len(rows), kv_heads, width, head_dim]); return the
        keys and values its rows attend."""
        kbuf, vbuf = self._put(layer, group.rows, keys, values)
        if group.index is not None:
            return kbuf[group.index, :, : group.end, :], vbuf[group.index, :, : group.end, :]
        return self.attended(layer, group.rows[0] if len(group.rows) == 1 else None, group.end)

    def put_group(self, layer: int, group: Group, keys: mx.array, values: mx.array) -> None:
        """``write_group`` without the read: write every group of a layer first, then read with
        ``attended``, so that each write can update the buffer in place (MLX reuses a buffer only
        when nothing else still reads it)."""
        self._put(layer, group.rows, keys, values)

    def attended(self, layer: int, row: int | None, end: int) -> tuple[mx.array, mx.array]:
        """Keys and values of one row (or, ``row`` None, of every row) up to ``end``: views, no copy."""
        kbuf, vbuf = self.keys[layer], self.values[layer]
        assert kbuf is not None and vbuf is not None
        if row is None:
            return kbuf[: self.batch, :, :end, :], vbuf[: self.batch, :, :end, :]
        return kbuf[row : row + 1, :, :end, :], vbuf[row : row + 1, :, :end, :]

    def _put(self, layer: int, rows: Sequence[int], keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write ``keys[i]`` / ``values[i]`` at row ``rows[i]``'s length; return the layer's buffers."""
        kbuf, vbuf = self.keys[layer], self.values[layer]
        width = keys.shape[2]
        if kbuf is None or vbuf is None:  # every stream joined with nothing cached (``add``)
            cap = capacity_for(max(self.lengths) + width - 1)
            kbuf, vbuf = (mx.zeros((self.batch, a.shape[1], cap, a.shape[3]), a.dtype) for a in (keys, values))
            self.keys[layer], self.values[layer] = kbuf, vbuf
        at = {self.lengths[r] for r in rows}
        if len(rows) == self.batch and len(at) == 1 and not (self.fixed or self.pending):  # one block write when every row is as long
            (start,) = at
            kbuf[: self.batch, :, start : start + width, :] = keys
            vbuf[: self.batch, :, start : start + width, :] = values
        else:  # one scatter for all rows: a write per row costs a kernel each, per layer, on a GPU
            index = self._scatter_index(tuple(rows), keys.shape[1], width)
            kbuf[index] = keys
            vbuf[index] = values
        return kbuf, vbuf

    def _scatter_index(self, rows: tuple[int, ...], heads: int, width: int) -> tuple[mx.array, ...]:
        """Indices that put a ``[len(rows), heads, width, head_dim]`` block at each row's length
        (the same for every layer of a round, so made once): row ``rows[i]``, every head, positions
        ``lengths[rows[i]] ..`` ``+ width - 1``."""
        key = (rows, heads, width)
        if key not in self._scatter:
            at = self.offsets if self.fixed or self.pending else mx.array([self.lengths[r] for r in rows], dtype=mx.int32)
            self._scatter[key] = (mx.array(rows, dtype=mx.int32)[:, None, None],
                                  mx.arange(heads, dtype=mx.int32)[None, :, None],
                                  (at[:, None] + mx.arange(width, dtype=mx.int32)[None])[:, None, :])
        return self._scatter[key]

    @property
    def offsets(self) -> mx.array:
        assert self._offsets is not None, "begin_round() first"
        return self._offsets

    def mask(self, n: int, window: int | None = None) -> mx.array:
        """The round's attention mask ``[batch, 1, width, keys]``; with ``window``, keys more than
        ``window - 1`` positions before a query are hidden too (a sliding-window layer)."""
        assert self._offsets is not None and n == self._width, "mask asked for another width"
        if self._mask is None:  # ``place``: every key of the capacity (or up to a pending round's end), to each row's own
            query = mx.arange(n, dtype=mx.int32)[None, None, :, None]
            keypos = mx.arange(self.capacity if self.fixed else self._pending, dtype=mx.int32)[None, None, None, :]
            self._mask = keypos <= self._offsets[:, None, None, None] + query
        if window is None:
            return self._mask
        if window not in self._masks:
            end = self._mask.shape[-1]
            query = self._offsets[:, None, None, None] + mx.arange(n, dtype=mx.int32)[None, None, :, None]
            keypos = mx.arange(end, dtype=mx.int32)[None, None, None, :]
            self._masks[window] = self._mask & (keypos > query - window)
        return self._masks[window]

    def alone_within(self, window: int | None) -> bool:
        """Whether this round attends one stream's keys, every one of them real and within ``window``
        (a lone stream's keys end at its own length plus the round's rows)."""
        return self.batch == 1 and not (self.pending or self.fixed) and (window is None or self.lengths[0] + self._width <= window)

    def write(self, layer: int, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        kbuf, vbuf = self._put(layer, range(self.batch), keys, values)
        if self.fixed and self.slots == self.batch:
            return kbuf, vbuf
        end = kbuf.shape[2] if self.fixed else self._pending or max(self.lengths) + keys.shape[2]
        return kbuf[: self.batch, :, :end, :], vbuf[: self.batch, :, :end, :]

    def advance(self, row: int, kept: int) -> None:
        """After verification: row ``row`` keeps ``kept`` of this round's positions."""
        assert 0 <= kept <= self._width
        self.lengths[row] += kept
        if self._kept:
            self._kept[row] = kept

    def settle(self) -> None:
        """After every row has advanced: stop each recurrent layer's state at the rows each stream
        kept, replaying the round's mixer calls where some stream kept fewer than its real rows
        (``engine.model.state_replay``). Nothing to do for attention layers: the mask hides rejected rows."""
        if not self.recurrent or self._before is None:
            return
        masked = [i for i in self.recurrent if self.kinds[i].masked]
        alone = [i for i in self.recurrent if not self.kinds[i].masked]
        if masked and self._kept != self._real:
            self.state_lengths = mx.array(self._kept, dtype=mx.int32)
            mask = mx.arange(self._width)[None] < self.state_lengths[:, None]
            for layer in masked:
                self.states[layer] = list(self._before[layer])
                self.calls[layer].replay(self.views[layer], mask)
        rows = [r for r, kept in enumerate(self._kept) if kept < self._width]
        for layer in alone if rows else ():
            states = self.states[layer]
            for row in rows:
                before = [a[row : row + 1] if a is not None else None for a in self._before[layer]]
                after = self.calls[layer].replay_row(row, self._kept[row], before)
                for j, a in enumerate(after):
                    states[j] = mx.concatenate([states[j][:row], a, states[j][row + 1 :]])  # type: ignore[index]
        mx.eval([a for layer in self.recurrent for a in self.states[layer] if a is not None])

    def save(self, width: int) -> Saved:
        """What a pass of up to ``width`` rows a stream may overwrite (from the shortest row's length
        on), for ``restore``; call it before ``begin_*``, which may grow the buffers. Recurrent
        states are kept by reference: layers replace them, never write into them."""
        start, end = min(self.lengths, default=0), max(self.lengths, default=0) + width
        return Saved(snapshot(self.keys, start, end), snapshot(self.values, start, end),
                     [list(s) for s in self.states])

    def restore(self, saved: Saved) -> None:
        """Undo a pass that raised: every buffer and state holds again what it held at ``save``."""
        self.keys, self.values = put_back(saved.keys), put_back(saved.values)
        self.states = [list(s) for s in saved.states]
        self.end_round()

    def end_round(self) -> None:
        self._offsets, self._pending, self._forced = None, None, False
        self._mask, self._masks, self._scatter, self._width = None, {}, {}, 0
        self._real, self._kept, self._before = [], [], None
        self.state_lengths = None
        self.calls = {}

    # -- membership ----------------------------------------------------------
    def add(self, caches: Sequence[KVCache | ArraysCache], length: int | None = None, spare: int = 0) -> int:
        """Append a stream whose per-layer caches hold its first ``length`` tokens (by default what
        its KV caches hold); returns its row. Where the buffers must be copied to make room,
        ``spare`` more rows are made for streams about to join (rows their admission reserved)."""
        length = length if length is not None else length_of(caches)
        assert length is not None, "a model of recurrent layers only: give the length"
        cap = max(self.capacity, capacity_for(length))
        if self.capacity < cap and self.batch:
            self._grow(cap)
        row, fill = self.batch, self.batch < self.slots  # a spare row to fill

        def append(i: int) -> None:
            c = caches[i]
            if isinstance(c, ArraysCache):
                self.states[i] = [stack(old, a, row) for old, a in zip(self.states[i], c.cache, strict=True)]
                return
            assert c.offset == length, "caches of one stream hold as many tokens each"
            kb, vb = self.keys[i], self.values[i]
            if fill and kb is not None and vb is not None:  # positions past its length are masked
                if c.keys is not None:
                    kb[row : row + 1, :, :length, :] = c.keys[..., :length, :]
                    vb[row : row + 1, :, :length, :] = c.values[..., :length, :]
                return
            pad = [(0, spare), (0, 0), (0, cap - length), (0, 0)]
            k, v = (None, None) if c.keys is None else (mx.pad(a[..., :length, :], pad) for a in (c.keys, c.values))
            self.keys[i], self.values[i] = stack(kb, k, row, spare), stack(vb, v, row, spare)

        self._rebuild(append)
        self.lengths.append(length)
        return row

    def remove(self, row: int, reach: int = 0) -> None:
        """Drop a stream: the last stream moves into its row (a caller's own list of rows follows
        with ``rows[row] = rows[-1]; rows.pop()``), leaving the buffers' last row spare. Positions
        under ``reach`` are kept (a pass queued ahead wrote there: ``begin_pending``)."""
        last = self.batch - 1
        order = [last if r == row else r for r in range(last)]
        self.lengths[row] = self.lengths[last]
        self.lengths.pop()
        if not self.lengths:
            self.keys = [None] * self.n_layers
            self.values = [None] * self.n_layers
            self.states = [[None] * k.states for k in self.kinds]
            return
        idx = mx.array(order, dtype=mx.int32)
        self.states = [[a[idx] if a is not None else None for a in layer] for layer in self.states]
        # After a long stream leaves the capacity shrinks, and with more spare rows than streams the
        # buffers do: then every row is copied.
        top = max(*self.lengths, reach)
        cap = capacity_for(top) if top + STEP < self.capacity else self.capacity
        if cap < self.capacity or self.slots > 2 * self.batch:
            self._rebuild(lambda i: self._take(i, idx, cap))
            return
        buffers = [b for b in (*self.keys, *self.values) if b is not None]
        if row != last:
            moved = [b[last] * 1 for b in buffers]  # buffers of their own, so the writes below are in place
            mx.eval(moved)
            for b, m in zip(buffers, moved, strict=True):
                b[row] = m
        mx.eval(buffers, self.states)

    def _take(self, i: int, idx: mx.array, cap: int) -> None:
        k, v = self.keys[i], self.values[i]
        if k is not None and v is not None:
            self.keys[i], self.values[i] = k[idx, :, :cap, :], v[idx, :, :cap, :]

    def _rebuild(self, change: Callable[[int], None]) -> None:
        """``change(i)`` replaces layer i's buffers (or writes a row into them), an eighth of the
        layers evaluated at a time: where every row is copied, each group's old buffers are freed
        before the next group's copy, so the lanes are held twice over an eighth at a time, not all."""
        group = -(-self.n_layers // 8)
        for start in range(0, self.n_layers, group):
            layers = range(start, min(start + group, self.n_layers))
            for i in layers:
                change(i)
            mx.eval([self.keys[i] for i in layers], [self.values[i] for i in layers], [self.states[i] for i in layers])

    def extract(self, row: int) -> list[KVCache | ArraysCache]:
        """A copy of one stream's real positions (and states) as plain mlx-lm caches."""
        length = self.lengths[row]
        out: list[KVCache | ArraysCache] = []
        for kind, k, v, states in zip(self.kinds, self.keys, self.values, self.states, strict=True):
            if kind.recurrent:
                a = ArraysCache(kind.states)
                a.cache = [mx.contiguous(s[row : row + 1]) if s is not None else None for s in states]
                out.append(a)
                continue
            c = KVCache()
            if k is not None and v is not None:  # None: it joined with nothing cached, and no pass ran since
                c.keys = mx.contiguous(k[row : row + 1, :, :length, :])
                c.values = mx.contiguous(v[row : row + 1, :, :length, :])
                c.offset = length
            out.append(c)
        mx.eval(cache_arrays(out))
        return out

    def _grow(self, need: int) -> None:
        cap = round_up(need)

        def pad(i: int) -> None:  # spare rows are dropped on the way
            k, v = self.keys[i], self.values[i]
            if k is not None and v is not None:
                widths = [(0, 0), (0, 0), (0, cap - k.shape[2]), (0, 0)]
                self.keys[i], self.values[i] = mx.pad(k[: self.batch], widths), mx.pad(v[: self.batch], widths)

        self._rebuild(pad)

