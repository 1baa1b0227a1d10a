"""``lanes``: the command line (``lanes bench``, ``lanes chat``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine import blas


def main(argv: list[str] | None = None) -> int:
    blas.ensure_fast_blas()  # re-executes with OpenBLAS preloaded on Linux, before MLX loads
    parser = argparse.ArgumentParser(prog="lanes", description="Lanes: copy-speculative local chat on MLX")
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmark a workload through mlx-lm and Lanes")
    bench.add_argument("--workload", type=Path, required=True, help="JSONL file, one stream per line")
    bench.add_argument("--cells", default="mlx-lm,mlx-lm-batch,plain,off,on")
    bench.add_argument("--rounds", type=int, default=4)
    bench.add_argument("--max-tokens", type=int, default=None, help="override each line's max_tokens")
    bench.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    bench.add_argument("--json", type=Path, default=None, help="write full results here")

    chat = sub.add_parser("chat", help="chat in the terminal")
    chat.add_argument("--model", default=None)
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.0)
    chat.add_argument("--top-p", type=float, default=1.0)
    chat.add_argument("--own-copy-rates", choices=("on", "off", "family"), default="family")
    chat.add_argument("--system", default=None, help="system prompt")

    args = parser.parse_args(argv)
    from engine.errors import LanesError

    try:
        if args.command == "bench":
            return _bench(args)
        from engine.chat import run_chat

        own = None if args.own_copy_rates == "family" else args.own_copy_rates == "on"
        return run_chat(args.model, args.max_tokens, args.temperature, args.top_p, own, args.system)
    except LanesError as exc:
        print(f"lanes: {exc}", file=sys.stderr)
        return 2
    finally:
        if "mlx.core" in sys.modules:  # MLX wants every thread that used it to drop its streams
            sys.modules["mlx.core"].clear_streams()


def _bench(args: argparse.Namespace) -> int:
    from engine.bench import CELLS, markdown, run_bench
    from engine.errors import LanesError
    from engine.models import load_model
    from engine.workload import load_workload

    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        raise LanesError(f"unknown cell(s) {', '.join(unknown)}; choose from {', '.join(CELLS)}")
    if args.rounds < 1:
        raise LanesError("--rounds must be at least 1")
    items = load_workload(args.workload, args.max_tokens)
    loaded = load_model(args.model)
    for w in loaded.warnings:
        print(f"warning: {w}", file=sys.stderr)
    result = run_bench(loaded, items, cells, args.rounds, progress=lambda s: print(s, file=sys.stderr))
    result["workload"] = str(args.workload)
    print(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
