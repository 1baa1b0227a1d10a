"""Softmax and SiLU with their exponentials computed by numpy, for CPU passes.

MLX 0.32.4's CPU ``exp`` is a scalar polynomial (its ``fma`` is the software ``std::fma`` in this
wheel): 27 ns an element here, where numpy's vectorised ``exp`` takes 0.6. In a wide pass nearly all
of attention is the softmax's exponentials, and SiLU adds one per MLP unit and row. Moving those two
to numpy costs a sync of the lazy graph at each (the arrays cross by a copy) and pays from a few rows
up. Ad hoc, 2-core Xeon, whole grouped pass at ~500 keys of context (ms, MLX / numpy):

    rows per stream (1)              104 / 87
    (1, 1, 1, 1)                     132 / 136   <- one-row rounds keep MLX's path (and run ahead)
    (16, 1, 1, 1)                    305 / 213
    (16, 12, 9, 1)                   585 / 256
    (1, 1, 1) + a 128-token chunk    798 / 445

Logits differ from the MLX ones by float rounding (3e-5 at most in those passes, against 1e-3 for
matrix products of other shapes); greedy tokens are checked against mlx-lm's own generation by the
fidelity tests and every benchmark cell. Metal's ``exp`` is vectorised: this is for the CPU only.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float32, masked entries given as -inf.

    >>> softmax(np.array([[0.0, np.log(3.0), -np.inf]], dtype=np.float32)).round(3).tolist()
    [[0.25, 0.75, 0.0]]
    """
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | str | None) -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` with the softmax on the host.

    ``q`` [B, heads, L, D]; ``k``, ``v`` [B, kv_heads, S, D]; ``mask`` boolean [B, 1, L, S] (True
    attends), ``"causal"`` (queries are the last L of the S positions) or None. Query heads that
    share a key head are stacked as rows of one product, as grouped-query attention shares them.
    """
    b, heads, length, dims = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    share = heads // kv_heads
    scores = (q * scale).reshape(b, kv_heads, share * length, dims) @ k.swapaxes(-1, -2)
    if isinstance(mask, str):
        mask = (mx.arange(keys)[None, :] <= (keys - length + mx.arange(length))[:, None])[None, None]
    if mask is not None:
        mask = mx.tile(mask, (1, 1, share, 1))
        scores = mx.where(mask, scores, mx.array(-np.inf, dtype=scores.dtype))
    mx.eval(scores)
    probs = mx.array(softmax(np.asarray(scores)))
    return (probs @ v).reshape(b, heads, length, dims)


def mlp(block: Any, x: mx.array) -> mx.array:
    """A llama MLP block (``down(silu(gate(x)) * up(x))``) with SiLU's exponentials on the host."""
    gate, up = block.gate_proj(x), block.up_proj(x)
    mx.eval(gate, up)
    g = np.asarray(gate)
    with np.errstate(over="ignore"):  # exp(-g) overflows to inf for g < -88: SiLU is then -0, exactly
        silu = g / (1.0 + np.exp(-g))
    return block.down_proj(mx.array(silu * np.asarray(up)))
