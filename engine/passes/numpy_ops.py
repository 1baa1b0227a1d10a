"""Softmax and SiLU with their exponentials computed by numpy, for CPU passes.

MLX 0.32.4's CPU ``exp`` is a scalar polynomial (its ``fma`` is the software ``std::fma`` in this
wheel), many times slower an element than numpy's vectorised ``exp``. In a wide pass nearly all of
attention is the softmax's exponentials, and SiLU adds one per MLP unit and row. Moving those two to
numpy costs a sync of the lazy graph at each (the arrays cross by a copy) and pays from a few rows
up (docs/benchmarks.md).

Logits differ from the MLX ones by float rounding; greedy tokens are checked against mlx-lm's own generation by the
fidelity tests and every benchmark cell. Metal's ``exp`` is vectorised: this is for the CPU only.
On the CPU, rounds without a prompt chunk now run wholly on numpy (``engine.passes.numpy_pass``); this
module serves the passes that carry a chunk, and prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

# q [B, heads, w, D], k and v [B, kv_heads, S, D], a boolean mask [B, 1, w, S] (True attends) or None
Attend = tuple[mx.array, mx.array, mx.array, mx.array | None]


def softmax(scores: np.ndarray, add: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis in float32 of ``scores + add`` (``add`` 0 where a key is attended,
    -inf where it is masked; broadcast), in a new array; ``scores`` is left alone.

    >>> softmax(np.array([[0.0, np.log(3.0), 5.0]], dtype=np.float32), np.array([0, 0, -np.inf], dtype=np.float32)).round(3).tolist()
    [[0.25, 0.75, 0.0]]
    """
    e = scores + add if add is not None else scores.copy()
    np.subtract(e, e.max(axis=-1, keepdims=True), out=e)  # in place: each pass over e is memory-bound
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e


def additive(mask: np.ndarray) -> np.ndarray:
    """A boolean mask (True attends) as the float32 0 / -inf that ``softmax`` adds.

    >>> additive(np.array([True, False])).tolist()
    [0.0, -inf]
    """
    return np.where(mask, np.float32(0), np.float32(-np.inf))


def causal(w: int, keys: int) -> np.ndarray:
    """The additive mask ``[w, keys]`` of w query rows that are the last w of ``keys`` positions:
    query j attends keys 0 .. keys - w + j.

    >>> causal(2, 3).tolist()
    [[0.0, 0.0, -inf], [0.0, 0.0, 0.0]]
    """
    return additive(np.arange(keys)[None, :] <= (keys - w + np.arange(w))[:, None])


def attention_many(items: Sequence[Attend], scale: float, masks: dict | None = None) -> list[mx.array]:
    """``mx.fast.scaled_dot_product_attention`` for several query blocks, the softmax on the host,
    with one sync of the lazy graph for all of them.

    Each item is ``(q, k, v, mask)``: ``q`` [B, heads, w, D]; ``k``, ``v`` [B, kv_heads, S, D];
    ``mask`` boolean [B, 1, w, S] (True attends) or None, meaning causal with the queries the last
    w of the S positions (query j attends keys 0 .. S - w + j), as one stream's rows or a prompt
    chunk. Query heads that share a key head are stacked as rows of one product, as grouped-query
    attention shares them. One sync a layer, not one per block.

    ``masks``, one dict a pass, keeps each mask's additive form from the first layer for the others:
    every layer of a pass attends the same positions (rebuilding them each layer costs time).
    """
    masks = {} if masks is None else masks
    scores = []
    for q, k, _, _ in items:
        b, heads, w, dims = q.shape
        kv_heads = k.shape[1]
        scores.append((q * scale).reshape(b, kv_heads, heads // kv_heads * w, dims) @ k.swapaxes(-1, -2))
    mx.eval(scores, [m for *_, m in items if m is not None and id(m) not in masks])
    outs = []
    for (q, k, v, mask), s in zip(items, scores, strict=True):
        b, heads, w, dims = q.shape
        kv_heads, keys = k.shape[1], k.shape[2]
        a = np.asarray(s).reshape(b, kv_heads, heads // kv_heads, w, keys)
        add = None
        if mask is not None:  # keyed by id: the pass's groups hold their masks while ``masks`` lives
            add = masks.get(id(mask))
            if add is None:
                add = masks[id(mask)] = additive(np.asarray(mask)[:, :, None])
        elif w > 1:
            add = masks.get((w, keys))
            if add is None:
                add = masks[(w, keys)] = causal(w, keys)
        probs = mx.array(softmax(a, add).reshape(b, kv_heads, heads // kv_heads * w, keys))
        outs.append((probs @ v).reshape(b, heads, w, dims))
    return outs


def mlp(block: Any, x: mx.array) -> mx.array:
    """A llama MLP block (``down(silu(gate(x)) * up(x))``) with SiLU's exponentials on the host."""
    gate, up = block.gate_proj(x), block.up_proj(x)
    mx.eval(gate, up)
    g = np.asarray(gate)
    with np.errstate(over="ignore"):  # exp(-g) overflows to inf for g < -88: SiLU is then -0, exactly
        silu = g / (1.0 + np.exp(-g))
    return block.down_proj(mx.array(silu * np.asarray(up)))
