"""What attention of a drafting round's shape costs when the shape is new, against a shape seen
before, in one dtype: no model, MLX's attention alone.

    PYTHONPATH=~/site:. python3 scripts/attention_shapes.py [--dtype bfloat16] [--shapes 600]
        [--streams 4] [--width 4]

A drafting round attends ``width`` query rows per stream over keys as long as the longest stream,
under a mask, so its shape changes from one drafting round to the next. In MLX's CUDA source (read
at v0.32.1), attention of more than one query row in bfloat16 or float16 runs through a cuDNN graph
built for that exact shape and kept in a cache of ``MLX_CUDA_SDPA_CACHE_SIZE`` (256) graphs, and a
process whose misses in that cache pass twice its size raises "Cache thrashing is happening";
float32 takes MLX's own kernels. This prints the median milliseconds of a shape seen before, of the
first 50 and the first 200 new shapes (keys 300, 301, ...), and whether a new shape raised and after
how many. The shapes are those of the embedded model (9 query and 3 KV heads of 64). It runs with
MLX's own settings, the fuse on unless the environment turns it off, whereas Lanes turns it off
(``engine.model.machine.MLX_DEFAULTS``): whether it raises is what this looks for.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
FIRST_KEYS = 300


def attend(keys: int, streams: int, width: int, dtype: mx.Dtype) -> float:
    """Seconds one masked attention call of this shape takes, its inputs computed beforehand."""
    q = mx.random.normal((streams, HEADS, width, HEAD_DIM)).astype(dtype)
    k = mx.random.normal((streams, KV_HEADS, keys, HEAD_DIM)).astype(dtype)
    v = mx.random.normal((streams, KV_HEADS, keys, HEAD_DIM)).astype(dtype)
    query = mx.arange(width)[None, None, :, None] + (keys - width)
    mask = mx.arange(keys)[None, None, None, :] <= query  # every stream as long as the keys
    mx.eval(q, k, v, mask)
    t0 = time.perf_counter()
    mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=HEAD_DIM**-0.5, mask=mask))
    return time.perf_counter() - t0


def measure(dtype: mx.Dtype, shapes: int, streams: int, width: int) -> dict[str, float | int | str | None]:
    """Median ms of a repeated shape and of new ones; how many new shapes ran, and what one raised."""
    for _ in range(2):
        attend(FIRST_KEYS - 1, streams, width, dtype)
    same = [attend(FIRST_KEYS - 1, streams, width, dtype) for _ in range(20)]
    new: list[float] = []
    error = None
    try:
        for keys in range(FIRST_KEYS, FIRST_KEYS + shapes):
            new.append(attend(keys, streams, width, dtype))
    except Exception as exc:  # MLX raises a plain RuntimeError when its cache thrashes
        error = str(exc)
    return {"same_ms": 1e3 * statistics.median(same),
            "new_50_ms": 1e3 * statistics.median(new[:50]) if new else None,
            "new_200_ms": 1e3 * statistics.median(new[:200]) if new else None,
            "new_shapes": len(new), "error": error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--shapes", type=int, default=600, help="new shapes to run (keys 300, 301, ...)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--width", type=int, default=4, help="query rows per stream (1 + draft rows)")
    args = ap.parse_args()
    r = measure(getattr(mx, args.dtype), args.shapes, args.streams, args.width)
    ms = {k: "-" if r[k] is None else f"{r[k]:.3f}" for k in ("same_ms", "new_50_ms", "new_200_ms")}
    print(f"{args.dtype} on {mx.default_device()}, {args.streams} streams x {args.width} rows: "
          f"a shape seen before {ms['same_ms']} ms; new shapes: first 50 {ms['new_50_ms']} ms, "
          f"first 200 {ms['new_200_ms']} ms (medians)")
    print(f"raised after {r['new_shapes']} new shapes: {r['error']}" if r["error"]
          else f"no error after {r['new_shapes']} new shapes")


if __name__ == "__main__":
    main()
