"""Attention of a lanes round in one CUDA kernel, each stream's keys bounded by its own length.

A round's rows attend keys up to their stream's length (``LaneCache``'s mask: query row j of
stream b sees keys ``t <= offsets[b] + j``, and with a sliding window ``t > offsets[b] + j - window``).
MLX's CUDA backend runs attention with an array mask on its unfused ops (a scale, two matmuls, the
mask, a softmax: some six kernels a layer where its one-kernel ``sdpa_vector`` serves a query with
no mask), and on an accelerator a round's cost is mostly its kernel launches. So every masked round
on CUDA (several streams, a drafting round, a round queued before its lengths reached the host) paid
for those launches on every layer (``pass_widths.py``'s pending lines; docs/benchmarks.md). This kernel reads the lengths themselves instead of a mask: one block per
(head, query row, stream), 32 warps striding the stream's keys with an online softmax in float32, as
``sdpa_vector`` does, then combined across warps.

Metal's ``sdpa_vector`` takes a mask itself, and the CPU computes rounds its own way, so only CUDA
routes here (``available``). mlx-lm's layers call ``mlx_lm.models.base.scaled_dot_product_attention``,
which already chooses by the cache it is given (a quantized cache's ``bits``); ``install`` extends that
choice to a lane cache's layer view, whose ``fused_attention`` answers with this kernel's output or
None (then mlx-lm's call runs as it is). Any other cache goes straight to mlx-lm's function.

Worked example: two streams of lengths [5, 3], a round of 2 rows each, keys 0..6 attended (the
longest length plus the width). Stream 0's rows see keys 0..5 and 0..6; stream 1's see 0..3 and 0..4,
its own two new rows written at 3 and 4; positions 5 and 6 of its row hold stale rows, never read.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from typing import Any

import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)

MAX_ROWS = 32  # query rows a stream may have here; wider passes (prefill chunks) re-read every key per row
HEAD_DIMS = (64, 96, 128, 256)  # a warp's 32 lanes split a head: a multiple of 32
THREADS = 1024  # 32 warps a block

_SOURCE = """
constexpr int WARPS = 32;
constexpr int PER = D / 32;
auto block = cg::this_thread_block();
auto warp = cg::tiled_partition<32>(block);
const int lane = warp.thread_rank();
const int w = warp.meta_group_rank();
const int head = blockIdx.x, row = blockIdx.y, b = blockIdx.z;
const int heads = q_shape[1], rows = q_shape[2];
const int kv_head = head / (heads / k_shape[1]);
int last = offsets[b] + row;  // the newest key this query row sees
if (last > k_shape[2] - 1) last = k_shape[2] - 1;
const int first = (WINDOW > 0 && last - WINDOW + 1 > 0) ? last - WINDOW + 1 : 0;

__shared__ float outputs[WARPS][WARPS + 1];
__shared__ float maxes[WARPS];
__shared__ float sums[WARPS];

const T* qp = q + b * q_strides[0] + head * q_strides[1] + row * q_strides[2];
float qv[PER], o[PER];
for (int i = 0; i < PER; i++) {
  qv[i] = SCALE_LOG2 * static_cast<float>(qp[(lane * PER + i) * q_strides[3]]);
  o[i] = 0.f;
}
float m = -3.0e38f, s = 0.f;
const T* kp = k + b * k_strides[0] + kv_head * k_strides[1];
const T* vp = v + b * v_strides[0] + kv_head * v_strides[1];
for (int t = first + w; t <= last; t += WARPS) {
  float score = 0.f;
  for (int i = 0; i < PER; i++) {
    score += qv[i] * static_cast<float>(kp[t * k_strides[2] + (lane * PER + i) * k_strides[3]]);
  }
  score = cg::reduce(warp, score, cg::plus<float>());
  const float top = fmaxf(m, score);
  const float f = exp2f(m - top), e = exp2f(score - top);
  m = top;
  s = s * f + e;
  for (int i = 0; i < PER; i++) {
    o[i] = o[i] * f + e * static_cast<float>(vp[t * v_strides[2] + (lane * PER + i) * v_strides[3]]);
  }
}
if (lane == 0) {
  maxes[w] = m;
  sums[w] = s;
}
block.sync();
const float mine = maxes[lane];
const float top = cg::reduce(warp, mine, cg::greater<float>());
const float f = exp2f(mine - top);
float total = cg::reduce(warp, sums[lane] * f, cg::plus<float>());
total = total == 0.f ? 0.f : 1.f / total;
for (int i = 0; i < PER; i++) {  // warp w sums element i of every warp's lane w: dimension w * PER + i
  outputs[lane][w] = o[i];
  block.sync();
  o[i] = cg::reduce(warp, outputs[w][lane] * f, cg::plus<float>()) * total;
  block.sync();
}
if (lane == 0) {
  T* op = out + ((static_cast<int64_t>(b) * rows + row) * heads + head) * D;
  for (int i = 0; i < PER; i++) {
    op[w * PER + i] = static_cast<T>(o[i]);
  }
}
"""


def on_cuda() -> bool:
    """Whether rounds run on MLX's CUDA backend, the one whose masked attention is unfused."""
    return mx.default_device() == mx.gpu and mx.cuda.is_available()


def float64_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, seen: Any) -> np.ndarray:
    """Softmax attention in float64 (numpy) where ``seen`` (boolean, broadcast to the scores) is
    true, grouped key heads repeated: the exact answer the kernel is held to.

    >>> q, k = mx.ones((1, 2, 1, 4)), mx.ones((1, 1, 3, 4))
    >>> v = mx.arange(3, dtype=mx.float32)[None, None, :, None] * mx.ones((1, 1, 3, 4))
    >>> float64_attention(q, k, v, 0.5, np.array([True, True, False])).tolist()
    [[[[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.5, 0.5, 0.5]]]]
    """
    qs, ks, vs = (np.array(a.astype(mx.float32), dtype=np.float64) for a in (queries, keys, values))
    ks, vs = (np.repeat(a, qs.shape[1] // a.shape[1], axis=1) for a in (ks, vs))
    scores = np.where(np.asarray(seen), qs @ ks.transpose(0, 1, 3, 2) * scale, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ vs


@functools.cache
def available() -> bool:
    """``on_cuda``, and the kernel builds and answers a small case as ``float64_attention`` does
    (not MLX's float32 attention: of several rows, on CUDA, it is ~1e-3 off; docs/engine.md): a
    kernel that fails to build (another CUDA, another MLX) must cost speed, never a reply."""
    if not on_cuda():
        return False
    offsets = [3, 0]
    q = mx.random.normal((2, 4, 2, 64), key=mx.random.key(0))
    k, v = (mx.random.normal((2, 2, 9, 64), key=mx.random.key(i))[:, :, :5] for i in (1, 2))
    seen = np.arange(5)[None, None, None, :] <= np.array(offsets)[:, None, None, None] + np.arange(2)[:, None]
    try:
        got = attend(q, k, v, mx.array(offsets, dtype=mx.int32), 0.125)
        if np.allclose(np.array(got), float64_attention(q, k, v, 0.125, seen), atol=1e-4):
            return True
        log.warning("lanes' attention kernel disagrees with float64 attention here: masked attention stays on MLX's ops")
    except Exception as exc:  # e.g. NVRTC refusing the source
        log.warning("lanes' attention kernel failed to build (%s): masked attention stays on MLX's ops", exc)
    return False


def fits(queries: mx.array, keys: mx.array, values: mx.array) -> bool:
    """Whether the kernel takes these shapes: a round's rows (not a prefill chunk), one dtype, a head
    size its warps split evenly, query heads a multiple of the key heads."""
    b, heads, rows, dim = queries.shape
    return (rows <= MAX_ROWS and dim in HEAD_DIMS and keys.shape[-1] == dim and values.shape[-1] == dim
            and queries.dtype == keys.dtype == values.dtype and queries.dtype in (mx.float16, mx.bfloat16, mx.float32)
            and heads % keys.shape[1] == 0 and keys.shape[0] >= b)


@functools.cache
def _kernel(scale: float) -> Any:
    header = f"#include <cooperative_groups/reduce.h>\nconstexpr float SCALE_LOG2 = {scale * math.log2(math.e)!r}f;\n"
    return mx.fast.cuda_kernel(name="lane_attention", input_names=["q", "k", "v", "offsets"], output_names=["out"],
                               source=_SOURCE, header=header, ensure_row_contiguous=False)


def attend(queries: mx.array, keys: mx.array, values: mx.array, offsets: mx.array, scale: float,
           window: int | None = None) -> mx.array:
    """``[B, heads, rows, D]`` attention of ``queries`` over ``keys``/``values`` ``[>=B, kv_heads, T, D]``
    (views, read through their strides), query row j of stream b attending keys up to ``offsets[b] + j``
    (and, with ``window``, after ``offsets[b] + j - window``)."""
    b, heads, rows, dim = queries.shape
    (out,) = _kernel(float(scale))(
        inputs=[queries, keys, values, offsets], template=[("T", queries.dtype), ("D", dim), ("WINDOW", window or 0)],
        grid=(heads * THREADS, rows, b), threadgroup=(THREADS, 1, 1),
        output_shapes=[(b, rows, heads, dim)], output_dtypes=[queries.dtype])
    return out.transpose(0, 2, 1, 3)  # the layout mlx-lm's attention transposes back without a copy


def _routed(queries: mx.array, keys: mx.array, values: mx.array, cache: Any, scale: float, mask: Any,
            sinks: mx.array | None = None) -> mx.array:
    fused = getattr(cache, "fused_attention", None)
    if fused is not None and sinks is None:
        out = fused(queries, keys, values, scale, mask)
        if out is not None:
            return out
    return _mlx_lm_attention()(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


@functools.cache
def _mlx_lm_attention() -> Any:
    from mlx_lm.models import base
    return base.scaled_dot_product_attention


def install() -> None:
    """Route every loaded mlx-lm model module's attention call through ``_routed`` (modules load
    with their model, so call this after loading one)."""
    original = _mlx_lm_attention()
    for name, module in list(sys.modules.items()):
        if name.startswith("mlx_lm.models.") and getattr(module, "scaled_dot_product_attention", None) is original:
            module.scaled_dot_product_attention = _routed
