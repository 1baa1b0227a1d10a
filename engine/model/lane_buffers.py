"""How a ``LaneCache``'s buffers are sized and grown: capacity in steps of positions, as mlx-lm's
``KVCache`` grows, and a stream's rows stacked onto the others'."""

from __future__ import annotations

import mlx.core as mx

STEP = 256  # capacity grows in steps, as mlx-lm's KVCache does


def stack(old: mx.array | None, new: mx.array | None, rows: int, spare: int = 0) -> mx.array | None:
    """A buffer's ``rows`` rows with a stream's (``new``, ``spare`` rows after it) appended. Rows with
    nothing cached yet (None, as in mlx-lm's fresh caches) get zeros, what mlx-lm's layers start from,
    once another stream shows the shape; until then the buffer stays None (``_put`` makes it)."""
    if new is None:
        return None if old is None else mx.concatenate([old, mx.zeros((1 + spare, *old.shape[1:]), old.dtype)])
    if old is None:
        return new if rows == 0 else mx.concatenate([mx.zeros((rows, *new.shape[1:]), new.dtype), new])
    return mx.concatenate([old, new])


def capacity_for(positions: int) -> int:
    """The lanes' length for a stream that holds ``positions``, with room for its next one: 300 -> 512,
    and every stream's row is that long while the longest is."""
    return round_up(positions + 1)


def round_up(n: int) -> int:
    return (n + STEP - 1) // STEP * STEP
