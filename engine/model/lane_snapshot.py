"""What a pass may overwrite in a ``LaneCache``, saved before it runs, so that a pass that raises can
be undone exactly (``LaneCache.save`` / ``restore``, and a prompt chunk's caches in a grouped pass)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Snapshot:
    """Buffers as they were before a pass, for ``put_back``: the buffer objects and copies of the
    positions ``start:end`` (axis 2) that the pass may overwrite.

    A reference alone would not do: MLX's slice assignment rewrites the buffer's own array object,
    so a kept reference shows the pass's writes too. Copying only the region a pass writes costs a
    few small copies instead of the whole cache, and leaves the buffers free to be updated in place.
    """

    buffers: tuple[mx.array | None, ...]
    copies: tuple[mx.array | None, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Saved:
    """A ``LaneCache`` before a pass, for ``LaneCache.restore``."""

    keys: Snapshot
    values: Snapshot
    states: list[list[mx.array | None]]


def snapshot(buffers: Sequence[mx.array | None], start: int, end: int) -> Snapshot:
    """Copy positions ``start:end`` of each buffer (evaluated now, before a pass writes there)."""
    copies = tuple(None if b is None or start >= min(end, b.shape[2]) else
                   mx.contiguous(b[:, :, start : min(end, b.shape[2]), :]) for b in buffers)
    mx.eval([c for c in copies if c is not None])
    return Snapshot(tuple(buffers), copies, start, end)


def put_back(snap: Snapshot) -> list[mx.array | None]:
    """The buffers of ``snap`` with their saved positions written back, evaluated."""
    for b, c in zip(snap.buffers, snap.copies, strict=True):
        if b is not None and c is not None:
            b[:, :, snap.start : snap.start + c.shape[2], :] = c
    out = list(snap.buffers)
    mx.eval([b for b in out if b is not None])
    return out
