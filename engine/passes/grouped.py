"""A round's forward pass for streams of different widths, without padding every stream to the widest.

A padded round runs B streams x W rows, W set by the longest draft. When one stream verifies a
16-row window and three verify none, 45 of its 68 rows are padding, and on a CPU they cost as much
as real rows. A *grouped* pass runs the same llama layers (mlx-lm's own modules, so the same
arithmetic per row) but:

- the linear layers (projections, MLP, output head) see only the real rows, flattened into one
  sequence, plus dummy rows up to a multiple of ``ROW_MULTIPLE``: OpenBLAS runs some row counts far
  slower than the next multiple of 16;
- attention runs per ``Group`` of the ``LaneCache``: the one-row streams together, the drafting
  streams together padded only to the widest of them;
- the rotary embedding runs once a layer over all rows, each row at its own position.

On the CPU (``host_exp``) the softmax and SiLU go through numpy (``engine.passes.numpy_ops``), all of a
layer's attention blocks in one sync, and a group of some streams but not all attends each
stream's cache row as a view rather than gathering the rows (MLX's CPU gather of them is slow).

Greedy tokens are what the padded pass gives up to float rounding (matrix products of other shapes
sum in another order, as the padded pass's already differ from a one-stream pass); the fidelity
tests and every benchmark cell check them against mlx-lm.

A round of one row per stream is never grouped. The scheduler groups a round when its cost model says so, when a
prompt chunk rides in it (below), and on the CPU whenever a stream has several rows, since only
this pass computes exponentials on numpy (``engine.passes.numpy_ops``). On the CPU numpy's own pass
(``engine.passes.numpy_pass``) now runs every round without a chunk, for the models it knows.

A ``Chunk`` of a joining stream's prompt can ride in the same pass: its rows join the flattened
rows of the linear layers and attend causally over that stream's own caches, as mlx-lm's prefill
does; they get no logits. On the CPU a pass of a few rows costs nearly what the weights take to
read, so the round's rows come almost free next to a chunk, and running streams keep their pace
while a long prompt joins. What each of these measured is in docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from engine.model.lane_cache import Group, LaneCache
from engine.model.lane_snapshot import Snapshot, put_back, snapshot
from engine.passes import numpy_ops
from engine.passes.rope_table import RopeTable

ROW_MULTIPLE = 16  # on the CPU, flattened rows beyond 8 are padded up to a multiple of this


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens of a joining stream, prefilled in a round's pass into its own ``caches``."""

    tokens: Sequence[int]
    caches: Sequence[KVCache]

    def save(self) -> list[tuple[Snapshot, Snapshot, int]]:
        """The caches as they are before the pass (what it may overwrite), for ``restore``."""
        n = len(self.tokens)
        return [(snapshot([c.keys], c.offset, c.offset + n), snapshot([c.values], c.offset, c.offset + n), c.offset)
                for c in self.caches]

    def restore(self, saved: list[tuple[Snapshot, Snapshot, int]]) -> None:
        """Undo a pass that raised: each cache holds again what it held at ``save``."""
        for c, (keys, values, offset) in zip(self.caches, saved, strict=True):
            (c.keys,), (c.values,), c.offset = put_back(keys), put_back(values), offset


def supports_grouped(model: nn.Module) -> bool:
    """Whether ``grouped_logits`` knows this model's layers: mlx-lm's llama, full attention only."""
    if type(model).__module__ != "mlx_lm.models.llama":
        return False
    return not any(getattr(layer, "use_sliding", False) for layer in model.model.layers)


def grouped_logits(
    model: nn.Module,
    lanes: LaneCache,
    groups: Sequence[Group],
    rows: Sequence[Sequence[int]],
    row_multiple: int = 1,
    chunk: Chunk | None = None,
    host_exp: bool = False,
    rope_table: bool = False,
) -> mx.array:
    """Logits ``[sum(len(r) for r in rows), vocab]``: stream i's rows ``rows[i]``, streams in order.

    ``groups`` come from ``lanes.begin_grouped([len(r) for r in rows])``; this writes each stream's
    new keys and values into ``lanes`` as a padded round would (the caller advances the lengths).
    A ``chunk`` is appended to its caches (their offsets advance by its length). ``host_exp`` runs
    softmax and SiLU through numpy (``engine.passes.numpy_ops``; CPU only); ``rope_table`` rotates with one
    ``engine.passes.rope_table.RopeTable`` a pass (CPU only; models ``engine.passes.padded.supports_padded`` accepts).
    """
    n = sum(len(r) for r in rows)
    # The output head sees as many rows as it would without a chunk (so the same matrix shapes).
    head = n + (-n % row_multiple if row_multiple > 1 and n > 8 else 0)
    h = _body(model, lanes, groups, rows, row_multiple, chunk, host_exp, rope_table)
    inner = model.model
    h = inner.norm(h[:, : min(head, h.shape[1])])
    out = inner.embed_tokens.as_linear(h) if model.args.tie_word_embeddings else model.lm_head(h)
    return out[0, :n]


def prefill(
    model: nn.Module, chunk: Chunk, row_multiple: int = 1, host_exp: bool = False, rope_table: bool = False
) -> None:
    """Append ``chunk`` to its caches (the transformer body only: prefill needs no logits)."""
    _body(model, LaneCache(len(chunk.caches)), [], [], row_multiple, chunk, host_exp, rope_table)
    mx.eval([c.keys for c in chunk.caches], [c.values for c in chunk.caches])


def _body(
    model: nn.Module,
    lanes: LaneCache,
    groups: Sequence[Group],
    rows: Sequence[Sequence[int]],
    row_multiple: int,
    chunk: Chunk | None,
    host_exp: bool,
    rope_table: bool,
) -> mx.array:
    """The hidden states after the last layer, ``[1, flat rows, dims]``: the streams' rows in order,
    then the chunk's, then dummy rows."""
    starts, n = [], 0
    for r in rows:
        starts.append(n)
        n += len(r)
    flat = [t for r in rows for t in r]
    c = len(chunk.tokens) if chunk is not None else 0
    if chunk is not None:
        flat += list(chunk.tokens)
    if row_multiple > 1 and len(flat) > 8:
        flat += [flat[-1]] * (-len(flat) % row_multiple)  # dummy rows: computed, never attended or kept
    # A group's padded slots read real rows of the flat sequence (a slot past a stream's own rows
    # repeats its last one, as a padded round does); the kept outputs are put back in flat order.
    pads = [mx.array([starts[row] + min(j, len(rows[row]) - 1) for row in g.rows for j in range(g.width)],
                     dtype=mx.int32) for g in groups]
    keeps = [mx.array([i * g.width + j for i, row in enumerate(g.rows) for j in range(len(rows[row]))],
                      dtype=mx.int32) for g in groups]
    kept = [(row, j) for g in groups for row in g.rows for j in range(len(rows[row]))]
    slot = {ij: p for p, ij in enumerate(kept)}
    unpad = mx.array([slot[(i, j)] for i, r in enumerate(rows) for j in range(len(r))], dtype=mx.int32)

    at = [lanes.lengths[i] + j for i, r in enumerate(rows) for j in range(len(r))]
    at += [chunk.caches[0].offset + t for t in range(c)] if chunk is not None else []
    positions = mx.array(at, dtype=mx.int32)
    plan = _Layout(lanes, groups, pads, chunk, n)
    attend = _host_attention if host_exp else _mlx_attention

    inner = model.model
    table = RopeTable(inner.layers[0].self_attn.rope, positions, len(at), 1) if rope_table else None
    h = inner.embed_tokens(mx.array(flat, dtype=mx.int32)[None])
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        qkv = (*_rope_rows(attn, attn.q_proj(x)[0], attn.k_proj(x)[0], positions, table), attn.v_proj(x)[0])
        blocks, chunk_out = attend(attn, li, qkv, plan)
        outs = [blk[keep] for blk, keep in zip(blocks, keeps, strict=True)]
        tail = [(mx.concatenate(outs) if len(outs) > 1 else outs[0])[unpad]] if outs else []
        if chunk_out is not None:
            tail.append(chunk_out)
        if len(flat) > n + c:
            tail.append(mx.zeros((len(flat) - n - c, qkv[0].shape[1]), dtype=qkv[0].dtype))  # q: heads * D
        o = mx.concatenate(tail) if len(tail) > 1 else tail[0]
        h = h + attn.o_proj(o[None])
        y = layer.post_attention_layernorm(h)
        h = h + (numpy_ops.mlp(layer.mlp, y) if host_exp else layer.mlp(y))
    return h


QKV = tuple[mx.array, mx.array, mx.array]  # a layer's projections of the flat rows, each [rows, dims]


@dataclass(frozen=True)
class _Layout:
    """Where a pass's flat rows go, the same for every layer: the lanes and their groups, each
    group's padded row indices, the chunk, ``n`` (the streams' rows; the chunk's follow), and the
    masks' host forms, made at the first layer (``numpy_ops.attention_many``)."""

    lanes: LaneCache
    groups: Sequence[Group]
    pads: Sequence[mx.array]
    chunk: Chunk | None
    n: int
    host_masks: dict = field(default_factory=dict)


def _rope_rows(
    attn: nn.Module, q: mx.array, k: mx.array, positions: mx.array, table: RopeTable | None
) -> tuple[mx.array, mx.array]:
    """Rotary embeddings for the first ``len(positions)`` flat rows of ``q`` and ``k``, row i at
    ``positions[i]``, in one call: each row is its own batch entry with its own offset. Per row it
    is the same arithmetic as per stream, and one call a layer instead of two per group and chunk
    on the CPU; with ``table`` (made once a pass for ``positions``) not
    even that. The dummy rows after them are dropped: nothing attends them."""
    n, heads, kv_heads = positions.shape[0], attn.n_heads, attn.n_kv_heads
    both = mx.concatenate([q[:n].reshape(n, heads, 1, -1), k[:n].reshape(n, kv_heads, 1, -1)], axis=1)
    both = table(both) if table is not None else attn.rope(both, offset=positions)
    return both[:, :heads].reshape(n, -1), both[:, heads:].reshape(n, -1)


def _heads(x: mx.array, b: int, w: int, count: int) -> mx.array:
    """``[b * w, count * D]`` rows as ``[b, count, w, D]``."""
    return x.reshape(b, w, count, -1).transpose(0, 2, 1, 3)


def _flat(o: mx.array) -> mx.array:
    """``[b, heads, w, D]`` attention output as ``[b * w, heads * D]`` rows."""
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0] * o.shape[2], -1)


def _mlx_attention(
    attn: nn.Module, layer: int, qkv: QKV, plan: _Layout
) -> tuple[list[mx.array], mx.array | None]:
    """One layer's attention through MLX: each group's padded block ``[rows * width, dims]``, and
    the chunk's rows."""
    q, k, v = qkv
    blocks = []
    for g, pad in zip(plan.groups, plan.pads, strict=True):
        b, w = len(g.rows), g.width
        qg, kg = _heads(q[pad], b, w, attn.n_heads), _heads(k[pad], b, w, attn.n_kv_heads)
        keys, values = plan.lanes.write_group(layer, g, kg, _heads(v[pad], b, w, attn.n_kv_heads))
        blocks.append(_flat(mx.fast.scaled_dot_product_attention(qg, keys, values, scale=attn.scale, mask=g.mask)))
    if plan.chunk is None:
        return blocks, None
    qc, kc, vc = _chunk_qkv(attn, layer, qkv, plan)
    mask = "causal" if len(plan.chunk.tokens) > 1 else None
    return blocks, _flat(mx.fast.scaled_dot_product_attention(qc, kc, vc, scale=attn.scale, mask=mask))


def _host_attention(
    attn: nn.Module, layer: int, qkv: QKV, plan: _Layout
) -> tuple[list[mx.array], mx.array | None]:
    """``_mlx_attention`` with the softmax on numpy (``numpy_ops.attention_many``), in one sync.

    Every group is written before any is read, so each write updates the cache in place. A group
    of some rows but not all (e.g. three one-row streams beside a drafting one) is attended row by
    row over views of the cache: MLX's CPU gather of those rows is slow.
    """
    q, k, v = qkv
    lanes, queries = plan.lanes, []
    for g, pad in zip(plan.groups, plan.pads, strict=True):
        b, w = len(g.rows), g.width
        queries.append(_heads(q[pad], b, w, attn.n_heads))
        lanes.put_group(layer, g, _heads(k[pad], b, w, attn.n_kv_heads), _heads(v[pad], b, w, attn.n_kv_heads))
    items: list[numpy_ops.Attend] = []
    for g, qg in zip(plan.groups, queries, strict=True):
        if g.index is None:
            items.append((qg, *lanes.attended(layer, g.rows[0] if len(g.rows) == 1 else None, g.end), g.mask))
        else:  # each row over its own keys, its queries the last g.width of them: causal
            items += [(qg[i : i + 1], *lanes.attended(layer, r, lanes.lengths[r] + g.width), None)
                      for i, r in enumerate(g.rows)]
    if plan.chunk is not None:
        items.append((*_chunk_qkv(attn, layer, qkv, plan), None))
    outs = numpy_ops.attention_many(items, attn.scale, plan.host_masks)
    blocks, at = [], 0
    for g in plan.groups:
        count = 1 if g.index is None else len(g.rows)
        blocks.append(_flat(mx.concatenate(outs[at : at + count]) if count > 1 else outs[at]))
        at += count
    return blocks, _flat(outs[at]) if plan.chunk is not None else None


def _chunk_qkv(attn: nn.Module, layer: int, qkv: QKV, plan: _Layout) -> QKV:
    """The chunk's queries, and its cache's keys and values with the chunk appended, as mlx-lm's llama
    prefill computes them; the chunk's rows follow the streams' in the flat rows, already rotated."""
    assert plan.chunk is not None
    span = slice(plan.n, plan.n + len(plan.chunk.tokens))
    c = span.stop - span.start
    q, k, v = (x[span] for x in qkv)
    keys, values = plan.chunk.caches[layer].update_and_fetch(
        _heads(k, 1, c, attn.n_kv_heads), _heads(v, 1, c, attn.n_kv_heads)
    )
    return _heads(q, 1, c, attn.n_heads), keys, values
