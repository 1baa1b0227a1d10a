"""What a drafting round's pass costs by its width, and which quantized matmul kernel MLX picks for it.

    PYTHONPATH=~/site:. python3 scripts/pass_widths.py [--streams 1,4] [--widths 1,2,4,7,8,16,33]
        [--steps 100] [--model M] [--matmuls]

For each stream count and width it prints, in milliseconds per pass of the model through the
lanes the scheduler makes (``RoundPasses.padded``: a draft-free round of several streams compiled
where the passes compile, lanes not advanced so every pass writes the same positions): ``build`` (the Python that makes the graph), ``dispatch`` (``mx.async_eval``), ``piped``
(the whole pass when passes are queued back to back, reading nothing: the host or the device,
whichever is slower) and ``sync`` (the pass when each one is waited for, as a round whose successor
could not run ahead; ``sync - build - dispatch`` is about the device's own time). A ``pending``
line times the same pass queued as a round run ahead after a drafting one is (its offsets on the
device, so every key is attended under a mask, a lone stream's too).

``--unfused`` adds each pass with masked attention on MLX's own ops (``unfused`` lines) where the
passes run it as one kernel (``engine.model.lane_attention``: CUDA), alternating the two; unfused, a
lone stream's draft-free pass is uncompiled too (``RoundPasses.compile_alone``), as the engine runs it.

``--matmuls`` also times ``mx.quantized_matmul`` alone for each distinct shape of the model's
quantized layers at those rows (streams x width): microseconds per call, 64 calls in one graph, and
for comparison a float matmul with the weight dequantized once. MLX's CUDA backend computes up to 7
rows of float32 input by its vector kernel (``qmv``) and 8 or more by a tiled one (``qmm``), whose
speed for few rows is what a drafting round of 8 or more rows pays for.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import mlx.nn as nn

from engine.model.lane_cache import LaneCache
from engine.model.loading import LoadedModel, load_model

PROMPT = 300  # tokens each stream holds before the loop


def _lanes(loaded: LoadedModel, streams: int) -> LaneCache:
    from mlx_lm.models.cache import KVCache
    lanes = loaded.passes.lanes(loaded.kinds)  # as the scheduler's: fixed shapes where passes compile
    for i in range(streams):
        caches = [KVCache() for _ in range(loaded.n_layers)]
        loaded.model(mx.arange(PROMPT - 7 * i, dtype=mx.int32)[None] % 1000, cache=caches)
        mx.eval([c.keys for c in caches])
        lanes.add(caches)
    return lanes


def pass_times(loaded: LoadedModel, lanes: LaneCache, width: int, steps: int,
               pending: bool = False) -> dict[str, float]:
    """Milliseconds per pass of ``width`` rows per stream (module docstring); ``pending``: as a round
    queued before the previous one's verification, its offsets an array on the device
    (``LaneCache.begin_pending``: every key up to the longest stream's end attended under a mask)."""
    tokens = mx.ones((lanes.batch, width), dtype=mx.int32)
    offsets = mx.array(lanes.lengths, dtype=mx.int32)
    out = {}
    for mode in ("piped", "sync"):
        build = dispatch = 0.0
        y = None
        t_start = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            if pending:
                lanes.begin_pending(width, offsets, max(lanes.lengths))
            else:
                lanes.begin_round(width)
            logits = loaded.passes.padded(loaded.model, lanes, tokens)
            lanes.end_round()
            y = mx.argmax(logits, axis=-1)
            t1 = time.perf_counter()
            mx.async_eval(y)
            t2 = time.perf_counter()
            if mode == "sync":
                y.tolist()
            build, dispatch = build + t1 - t0, dispatch + t2 - t1
        mx.eval(y)
        out[mode] = 1e3 * (time.perf_counter() - t_start) / steps
        out["build"], out["dispatch"] = 1e3 * build / steps, 1e3 * dispatch / steps
    return {k: out[k] for k in ("build", "dispatch", "piped", "sync")}


def _product(layer: nn.QuantizedLinear, x: mx.array, dense: mx.array | None) -> mx.array:
    return layer(x) if dense is None else x @ dense.T


def activation_dtype(model: nn.Module) -> mx.Dtype | None:
    """The dtype the first layer's projections receive (a model whose norms are float32 computes in
    float32 whatever its scales' dtype), where the model is laid out as mlx-lm's llama is."""
    inner = getattr(model, "model", None)
    try:
        layer = inner.layers[0]  # type: ignore[union-attr]
        return layer.input_layernorm(inner.embed_tokens(mx.array([[1]]))).dtype  # type: ignore[union-attr]
    except AttributeError:
        return None


def matmul_times(model: nn.Module, rows: list[int], calls: int = 64) -> list[dict[str, float]]:
    """Microseconds per quantized matmul of each distinct layer shape of ``model``, and of the same
    product with the weight dequantized once, at each count of ``rows`` (module docstring), with
    activations of the dtype the model's layers receive (else its scales')."""
    seen = activation_dtype(model)
    shapes: dict[tuple[tuple[int, ...], int, int], nn.QuantizedLinear] = {}
    for _, m in model.named_modules():
        if isinstance(m, nn.QuantizedLinear):
            shapes.setdefault((tuple(m.weight.shape), m.bits, m.group_size), m)
    out = []
    for (shape, bits, group), m in shapes.items():
        out_dim, in_dim, dtype = shape[0], shape[1] * 32 // bits, seen or m.scales.dtype
        dense = mx.dequantize(m.weight, m.scales, m.biases, group_size=group, bits=bits).astype(dtype)
        for n in rows:
            x = mx.random.normal((1, n, in_dim)).astype(dtype)
            mx.eval(x, dense)
            times = []
            for weight in (None, dense):
                mx.eval([_product(m, x, weight) for _ in range(4)])  # compiles the kernel
                t0 = time.perf_counter()
                mx.eval([_product(m, x, weight) for _ in range(calls)])
                times.append(1e6 * (time.perf_counter() - t0) / calls)
            out.append({"in": in_dim, "out": out_dim, "bits": bits, "rows": n, "quantized_us": times[0],
                        "dequantized_us": times[1]})
            print(f"matmul {in_dim}->{out_dim} {bits}-bit {dtype} rows {n:3d}: quantized {times[0]:7.1f} us, "
                  f"dequantized {times[1]:7.1f} us", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--widths", default="1,2,4,7,8,16,33")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--model", default=None)
    ap.add_argument("--matmuls", action="store_true")
    ap.add_argument("--unfused", action="store_true",
                    help="also time each pass with masked attention on MLX's own ops (lanes whose passes fuse it)")
    args = ap.parse_args()
    loaded = load_model(args.model)
    widths = [int(w) for w in args.widths.split(",")]
    print(f"{loaded.name} on {mx.default_device()}, passes {loaded.passes.name}")
    for b in [int(s) for s in args.streams.split(",")]:
        lanes = _lanes(loaded, b)
        for w in widths:
            for fused in (lanes.fused, False) if args.unfused and lanes.fused else (lanes.fused,):
                lanes.fused, lanes.fixed_alone = fused, fused and loaded.passes.compile_alone  # as cell_passes does
                tag = "" if fused == loaded.passes.fused_attention else " unfused"
                for kind, pending in (("pass", False), ("pending", True)):
                    pass_times(loaded, lanes, w, 3, pending=pending)  # compiles the kernels
                    r = pass_times(loaded, lanes, w, args.steps, pending=pending)
                    print(f"{kind} {b}x{w:<3d}{tag} " + " ".join(f"{k} {v:6.2f}" for k, v in r.items()), flush=True)
            lanes.fused, lanes.fixed_alone = loaded.passes.fused_attention, loaded.passes.compile_alone
    if args.matmuls:
        matmul_times(loaded.model, sorted({b * w for b in [int(s) for s in args.streams.split(",")] for w in widths}))


if __name__ == "__main__":
    main()
