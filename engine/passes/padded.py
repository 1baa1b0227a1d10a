"""A padded round's pass through mlx-lm's llama on the CPU, with the rotary table made once.

``padded_logits(model, lanes, tokens)`` is ``model(tokens, cache=lanes.views)`` operation for
operation (mlx-lm's own modules and ``scaled_dot_product_attention``), except that queries and
keys are rotated by one ``engine.passes.rope_table.RopeTable`` for the pass instead of 60 rope calls, which
on the CPU each rebuild the same cosines and sines: bit for bit the same logits (tested).

A lone stream's one-row pass skips the mask: every key it attends is its own, and a mask that
keeps every score changes none of them.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention

from engine.model.lane_cache import LaneCache
from engine.passes.grouped import supports_grouped
from engine.passes.rope_table import RopeTable, tabled


def supports_padded(model: nn.Module) -> bool:
    """Whether ``padded_logits`` knows this model: mlx-lm's llama, full attention, plain rope."""
    if not supports_grouped(model):
        return False
    ropes = [layer.self_attn.rope for layer in model.model.layers]
    if not all(tabled(r) for r in ropes):
        return False
    return len({(r.dims, r.traditional, r.base, r.scale) for r in ropes}) == 1  # one table serves every layer


def padded_logits(model: nn.Module, lanes: LaneCache, tokens: mx.array) -> mx.array:
    """Logits ``[batch, width, vocab]`` of ``tokens`` ``[batch, width]`` after ``lanes.begin_round(width)``."""
    b, w = tokens.shape
    inner = model.model
    table = RopeTable(inner.layers[0].self_attn.rope, lanes.offsets, b, w)
    mask = None if b == 1 and w == 1 else lanes.mask(w)
    h = inner.embed_tokens(tokens)
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = table(q.reshape(b, w, attn.n_heads, -1).transpose(0, 2, 1, 3))
        k = table(k.reshape(b, w, attn.n_kv_heads, -1).transpose(0, 2, 1, 3))
        keys, values = lanes.write(li, k, v.reshape(b, w, attn.n_kv_heads, -1).transpose(0, 2, 1, 3))
        o = scaled_dot_product_attention(q, keys, values, cache=None, scale=attn.scale, mask=mask)
        h = h + attn.o_proj(o.transpose(0, 2, 1, 3).reshape(b, w, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    return inner.embed_tokens.as_linear(h) if model.args.tie_word_embeddings else model.lm_head(h)
