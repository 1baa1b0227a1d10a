"""A round's forward pass computed by numpy, for CPU rounds of a few rows per stream.

On the CPU a round of a few rows is bound by reading the weights, and numpy's own OpenBLAS reads
them faster than the one MLX is given: it runs a one-row product as a matrix-vector product, and a
product of a few rows as ``W @ X.T`` without copying the weights. Every op of the pass is cheap
next to that, and MLX charges some scheduling per op on the CPU (a pass has ~700), so the whole
pass runs here, reading the model's own weights as zero-copy numpy views (tests/test_hostpass.py
checks its logits; docs/benchmarks.md, "CPU rounds on numpy", what it saves).

The stream's new keys and values are written straight into the ``LaneCache``'s buffers through
numpy views of them, at each stream's own length, as a round's pass writes them: positions past the
lengths are rejected rows that the next round overwrites, so a pass that raises half way leaves
nothing the lanes would read. The pass evaluates the buffers first, and it runs on the one thread
that owns MLX, so no lazy MLX computation reads them while numpy writes.

Worked example, one layer for stream i with 2 rows at length 5: its queries are rows 5 and 6 of
its context; its keys and values are written at positions 5 and 6 of row i of the buffers; query
row j attends keys 0 .. 5 + j (the additive mask is 0 there, -inf after).

Greedy tokens equal the MLX pass's up to float rounding (products of other shapes sum in another
order); the fidelity tests and every benchmark cell check them against mlx-lm's own generation.
Prompt chunks keep MLX's prefill (long products, where MLX's BLAS is as fast).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.model.lane_cache import LaneCache
from engine.passes import numpy_ops
from engine.passes.padded import supports_padded
from engine.passes.rope_table import RopeTable


def supports_host(model: nn.Module) -> bool:
    """Whether ``HostPass`` knows this model: a llama ``supports_padded`` accepts, with float32
    unquantized linear layers and no biases (the CPU's dequantized GGUF models)."""
    if not supports_padded(model):
        return False
    inner = model.model
    linears = [m for layer in inner.layers for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    if not model.args.tie_word_embeddings:
        linears.append(model.lm_head)
    if any(type(m) is not nn.Linear or "bias" in m for m in linears):
        return False
    if type(inner.embed_tokens) is not nn.Embedding:
        return False
    return all(m.weight.dtype == mx.float32 for m in [*linears, inner.embed_tokens])


@dataclass(frozen=True)
class _Layer:
    norm_in: np.ndarray
    q: np.ndarray  # weights [out, in], as the model stores them
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    norm_post: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


def _linear(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x @ w.T`` as ``(w @ x.T).T``: numpy runs it as a matrix-vector product for one row and,
    for a few rows, faster than ``x @ w.T`` (which it runs with the weights transposed)."""
    return (w @ x.T).T


class HostPass:
    """numpy views of a llama model's weights, and ``logits`` for a round's rows."""

    def __init__(self, model: nn.Module) -> None:
        assert supports_host(model)
        inner = model.model
        mx.eval(model.parameters())
        attn = inner.layers[0].self_attn
        self.heads, self.kv_heads, self.scale = attn.n_heads, attn.n_kv_heads, attn.scale
        self.rope = attn.rope
        self.eps = inner.norm.eps
        self.layers = [
            _Layer(*(np.asarray(p) for p in (
                layer.input_layernorm.weight, layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                layer.self_attn.v_proj.weight, layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight, layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight,
                layer.mlp.down_proj.weight)))
            for layer in inner.layers
        ]
        self.embed = np.asarray(inner.embed_tokens.weight)
        self.head = self.embed if model.args.tie_word_embeddings else np.asarray(model.lm_head.weight)
        self.norm = np.asarray(inner.norm.weight)

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def logits(self, lanes: LaneCache, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Logits ``[sum(len(r) for r in rows), vocab]`` for stream i's ``rows[i]``, streams in order.

        Call after ``lanes.begin_host([len(r) for r in rows])``; writes each stream's new keys and
        values at its length (the caller advances the lengths after verification).
        """
        widths = [len(r) for r in rows]
        at = [lanes.lengths[i] + j for i, w in enumerate(widths) for j in range(w)]
        n = len(at)
        table = RopeTable(self.rope, mx.array(at, dtype=mx.int32), n, 1)
        mx.eval(table.cos, table.sin, lanes.keys, lanes.values)
        cos, sin = np.asarray(table.cos).reshape(n, 1, -1), np.asarray(table.sin).reshape(n, 1, -1)
        masks: dict[tuple[int, int], np.ndarray] = {}
        h = self.embed[[t for r in rows for t in r]]
        for li, lw in enumerate(self.layers):
            x = self._rms(h, lw.norm_in)
            q = self._rotate(_linear(lw.q, x).reshape(n, self.heads, -1), cos, sin)
            k = self._rotate(_linear(lw.k, x).reshape(n, self.kv_heads, -1), cos, sin)
            v = _linear(lw.v, x).reshape(n, self.kv_heads, -1)
            o = self._attend(lanes, li, widths, q, k, v, masks)
            h = h + _linear(lw.o, o)
            y = self._rms(h, lw.norm_post)
            g = _linear(lw.gate, y)
            with np.errstate(over="ignore"):  # exp(-g) overflows to inf for g < -88: SiLU is then -0
                silu = g / (1.0 + np.exp(-g))
            h = h + _linear(lw.down, silu * _linear(lw.up, y))
        return _linear(self.head, self._rms(h, self.norm))

    def _rotate(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rows ``[n, heads, head_dim]`` rotated as ``engine.passes.rope_table.RopeTable`` rotates them."""
        d = 2 * cos.shape[-1]
        if self.rope.traditional:
            x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
            out = np.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(*x.shape[:-1], d)
        else:
            x1, x2 = x[..., : d // 2], x[..., d // 2 : d]
            out = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
        return out if d == x.shape[-1] else np.concatenate([out, x[..., d:]], axis=-1)

    def _attend(self, lanes: LaneCache, layer: int, widths: Sequence[int], q: np.ndarray, k: np.ndarray,
                v: np.ndarray, masks: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        """Each stream's rows over its own cache row; returns ``[n, heads * head_dim]``."""
        kbuf, vbuf = np.asarray(lanes.keys[layer]), np.asarray(lanes.values[layer])
        group = self.heads // self.kv_heads
        outs, start = [], 0
        for row, w in enumerate(widths):
            length = lanes.lengths[row]
            span = slice(start, start + w)
            kbuf[row, :, length : length + w] = k[span].transpose(1, 0, 2)
            vbuf[row, :, length : length + w] = v[span].transpose(1, 0, 2)
            keys, values = kbuf[row, :, : length + w], vbuf[row, :, : length + w]
            # Query heads sharing a key head are rows of one product, as grouped-query attention shares them.
            qs = (q[span] * self.scale).transpose(1, 0, 2).reshape(self.kv_heads, group * w, -1)
            scores = qs @ keys.transpose(0, 2, 1)
            add = None
            if w > 1:
                add = masks.get((w, length + w))
                if add is None:
                    add = masks[(w, length + w)] = numpy_ops.causal(w, length + w)
                scores = scores.reshape(self.kv_heads, group, w, -1)
            probs = numpy_ops.softmax(scores, add).reshape(self.kv_heads, group * w, -1)
            o = (probs @ values).reshape(self.heads, w, -1).transpose(1, 0, 2)
            outs.append(o.reshape(w, -1))
            start += w
        return np.concatenate(outs) if len(outs) > 1 else outs[0]
