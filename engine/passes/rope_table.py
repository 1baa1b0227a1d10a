"""Rotary embeddings from a table made once a pass, for CPU passes; bit-identical to the rope.

MLX 0.32.4 has no CPU kernel for ``mx.fast.rope``: it runs its fallback, some twenty operations
that recompute the angles and their cosines and sines on every call. A pass calls it for queries
and keys in every layer (60 calls in the embedded model), each time for the same positions, and
each of MLX's CPU operations costs scheduling before any arithmetic. A ``RopeTable`` takes the cosines and
sines from one call of the model's own rope on unit pairs, then rotates each layer's queries and
keys with the fallback's own arithmetic (``x1 * cos - x2 * sin``, ``x1 * sin + x2 * cos``), so
the result is bit for bit what the rope gives.

Worked example: a pair (x1, x2) = (1, 0) at position p comes out of the rope as
(1 * cos - 0 * sin, 1 * sin + 0 * cos) = (cos p*f, sin p*f), exactly, for each frequency f; the
table keeps those and rotates any other pair at p with them.

Only ``mlx.nn.RoPE`` itself is tabled: scaled variants (YaRN's mscale and the like) multiply
inside the rope, so a table would round differently. On Metal and CUDA the rope is one fused
kernel and this would cost more, so passes use it on the CPU only.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def tabled(rope: object) -> bool:
    """Whether ``rope`` is a plain ``mlx.nn.RoPE`` (the kind a table reproduces exactly)."""
    return type(rope) is nn.RoPE


class RopeTable:
    """Cosines and sines for one pass's positions, applied as ``rope(x, offset)`` would.

    ``offset`` is what the rope would get: an int, or an array with one offset per batch entry;
    ``rows`` (batch entries) and ``width`` (positions per entry, from the offset on) give the
    shape of the queries and keys it will rotate, ``[rows, heads, width, dims]``.
    """

    def __init__(self, rope: nn.RoPE, offset: int | mx.array, rows: int, width: int) -> None:
        assert tabled(rope)
        self.dims, self.traditional = rope.dims, rope.traditional
        half = self.dims // 2
        if self.traditional:  # pairs are neighbours: (x0, x1), (x2, x3), ...
            unit = mx.stack([mx.ones((rows, 1, width, half)), mx.zeros((rows, 1, width, half))], axis=-1)
            unit = unit.reshape(rows, 1, width, self.dims)
            turned = rope(unit, offset=offset)
            self.cos, self.sin = turned[..., 0::2], turned[..., 1::2]
        else:  # pairs are halves: (x0, x_half), (x1, x_half+1), ...
            unit = mx.concatenate(
                [mx.ones((rows, 1, width, half)), mx.zeros((rows, 1, width, half))], axis=-1
            )
            turned = rope(unit, offset=offset)
            self.cos, self.sin = turned[..., :half], turned[..., half:]

    def __call__(self, x: mx.array) -> mx.array:
        """``x`` ``[rows, heads, width, head_dim]`` rotated, as the rope would rotate it."""
        d, c, s = self.dims, self.cos, self.sin
        head, tail = (x, None) if d == x.shape[-1] else (x[..., :d], x[..., d:])
        if self.traditional:
            x1, x2 = head[..., 0::2], head[..., 1::2]
            out = mx.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(head.shape)
        else:
            x1, x2 = head[..., : d // 2], head[..., d // 2 :]
            out = mx.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
        return out if tail is None else mx.concatenate([out, tail], axis=-1)
