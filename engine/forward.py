"""A round's forward pass for streams of different widths, without padding every stream to the widest.

A padded round runs B streams x W rows, W set by the longest draft. When one stream verifies a
16-row window and three verify none, 45 of its 68 rows are padding, and on a CPU they cost as much
as real rows. A *grouped* pass runs the same llama layers (mlx-lm's own modules, so the same
arithmetic per row) but:

- the linear layers (projections, MLP, output head) see only the real rows, flattened into one
  sequence, plus dummy rows up to a multiple of ``ROW_MULTIPLE``: OpenBLAS runs some row counts far
  slower than the next multiple of 16 (all linear layers of the model at 12 rows 87 ms, at 16 rows
  51 ms; ad hoc timing on the 2-core CI machine);
- attention runs per ``Group`` of the ``LaneCache``: the one-row streams together, the drafting
  streams together padded only to the widest of them.

Greedy tokens are what the padded pass gives up to float rounding (matrix products of other shapes
sum in another order, as the padded pass's already differ from a one-stream pass); the fidelity
tests and every benchmark cell check them against mlx-lm.

Measured (ad hoc, 2-core CPU, 4 streams at ~300 tokens of context, whole pass, ms): rows per
stream (9, 1, 1, 1) padded 186, grouped 115; (17, 1, 1, 1) 275 / 148; (17, 5, 3, 1) 274 / 191;
(1, 1, 1, 1) is never grouped. The scheduler groups a round only when its cost model says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from engine.lanecache import Group, LaneCache

ROW_MULTIPLE = 16  # on the CPU, flattened rows beyond 8 are padded up to a multiple of this


def supports_grouped(model: nn.Module) -> bool:
    """Whether ``grouped_logits`` knows this model's layers: mlx-lm's llama, full attention only."""
    if type(model).__module__ != "mlx_lm.models.llama":
        return False
    return not any(getattr(layer, "use_sliding", False) for layer in model.model.layers)


def grouped_logits(
    model: nn.Module, lanes: LaneCache, groups: Sequence[Group], rows: Sequence[Sequence[int]], row_multiple: int = 1
) -> mx.array:
    """Logits ``[sum(len(r) for r in rows), vocab]``: stream i's rows ``rows[i]``, streams in order.

    ``groups`` come from ``lanes.begin_grouped([len(r) for r in rows])``; this writes each stream's
    new keys and values into ``lanes`` as a padded round would (the caller advances the lengths).
    """
    starts, n = [], 0
    for r in rows:
        starts.append(n)
        n += len(r)
    flat = [t for r in rows for t in r]
    if row_multiple > 1 and n > 8:
        flat += [flat[-1]] * (-n % row_multiple)  # dummy rows: computed, never attended or kept
    # A group's padded slots read real rows of the flat sequence (a slot past a stream's own rows
    # repeats its last one, as a padded round does); the kept outputs are put back in flat order.
    pads = [mx.array([starts[row] + min(j, len(rows[row]) - 1) for row in g.rows for j in range(g.width)],
                     dtype=mx.int32) for g in groups]
    keeps = [mx.array([i * g.width + j for i, row in enumerate(g.rows) for j in range(len(rows[row]))],
                      dtype=mx.int32) for g in groups]
    kept = [(row, j) for g in groups for row in g.rows for j in range(len(rows[row]))]
    slot = {ij: p for p, ij in enumerate(kept)}
    unpad = mx.array([slot[(i, j)] for i, r in enumerate(rows) for j in range(len(r))], dtype=mx.int32)

    inner = model.model
    h = inner.embed_tokens(mx.array(flat, dtype=mx.int32)[None])
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = attn.q_proj(x)[0], attn.k_proj(x)[0], attn.v_proj(x)[0]
        outs = []
        for g, pad, keep in zip(groups, pads, keeps, strict=True):
            b, w = len(g.rows), g.width
            qg = q[pad].reshape(b, w, attn.n_heads, -1).transpose(0, 2, 1, 3)
            kg = k[pad].reshape(b, w, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            vg = v[pad].reshape(b, w, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            qg = attn.rope(qg, offset=g.offsets)
            kg = attn.rope(kg, offset=g.offsets)
            keys, values = lanes.write_group(li, g, kg, vg)
            o = mx.fast.scaled_dot_product_attention(qg, keys, values, scale=attn.scale, mask=g.mask)
            outs.append(o.transpose(0, 2, 1, 3).reshape(b * w, -1)[keep])
        o = (mx.concatenate(outs) if len(outs) > 1 else outs[0])[unpad]
        if len(flat) > n:
            o = mx.concatenate([o, mx.zeros((len(flat) - n, o.shape[1]), dtype=o.dtype)])
        h = h + attn.o_proj(o[None])
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.norm(h)
    out = inner.embed_tokens.as_linear(h) if model.args.tie_word_embeddings else model.lm_head(h)
    return out[0, :n]

