"""``lanes``: the command line.

``ask``/``chat`` talk to the model and save to the store; ``list``/``search``/``export``/``import``/
``delete``/``recall``/``move-aside`` work on the store alone; ``compare`` runs the own-copy-rates A/B;
``bench``/``bench-store`` measure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine.model import openblas
from engine.model.machine import use_mlx_defaults


def main(argv: list[str] | None = None) -> int:
    openblas.ensure_fast_blas()  # re-executes with OpenBLAS preloaded on Linux, before MLX loads
    use_mlx_defaults()
    parser = argparse.ArgumentParser(prog="lanes", description="Lanes: copy-speculative local chat on MLX")
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmark a workload through mlx-lm and Lanes")
    bench.add_argument("--workload", type=Path, required=True, help="JSONL file, one stream per line")
    bench.add_argument("--cells", default="mlx-lm,mlx-lm-batch,plain,off,on",
                       help="comma-separated cells; a Lanes cell may override family settings for itself, "
                            "e.g. on:doubt_prior=0.6 (engine/bench/cell_specs.py lists them)")
    bench.add_argument("--rounds", type=int, default=4)
    bench.add_argument("--warmup", type=int, default=0, help="unmeasured runs of every cell first (GPU kernels compile)")
    bench.add_argument("--max-tokens", type=int, default=None, help="override each line's max_tokens")
    bench.add_argument("--streams", type=int, default=None,
                       help="run this many streams: the workload's first ones, or its lines again in turn")
    bench.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    bench.add_argument("--json", type=Path, default=None, help="write full results here")
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="sample every cell at this temperature (Lanes' replies seeded per line; default greedy)")
    bench.add_argument("--top-p", type=float, default=1.0, help="top-p of a sampled run")

    soak = sub.add_parser("soak", help="many streams through the engine for a long time: errors and memory")
    soak.add_argument("--streams", type=int, default=8)
    soak.add_argument("--minutes", type=float, default=20.0)
    soak.add_argument("--warmup", type=float, default=120.0, help="seconds before memory growth is counted")
    soak.add_argument("--max-tokens", type=int, default=128, help="each reply's max_tokens")
    soak.add_argument("--workload", dest="workloads", type=Path, action="append", default=None,
                      help="JSONL workload (repeatable; default: copy-heavy, no-copy and mixed)")
    soak.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    soak.add_argument("--json", type=Path, default=None, help="write full results here")

    data = argparse.ArgumentParser(add_help=False)
    data.add_argument("--data-dir", default=None, help="folder of the database (default: $LANES_DATA_DIR, "
                      "else the platform's application data folder)")
    reply = argparse.ArgumentParser(add_help=False)
    reply.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    reply.add_argument("--max-tokens", type=int, default=512)
    reply.add_argument("--temperature", type=float, default=0.0)
    reply.add_argument("--top-p", type=float, default=1.0)
    reply.add_argument("--own-copy-rates", choices=("on", "off", "family"), default="family")

    chat = sub.add_parser("chat", parents=[data, reply], help="chat in the terminal (saved to the store)")
    chat.add_argument("--system", default=None, help="system prompt of a new conversation")
    chat.add_argument("--conversation", type=int, default=None, help="continue this conversation")

    ask = sub.add_parser("ask", parents=[data, reply], help="send one message, stream the reply, save both")
    ask.add_argument("message")
    which = ask.add_mutually_exclusive_group()
    which.add_argument("--conversation", type=int, default=None, help="continue this conversation")
    which.add_argument("--new", action="store_true", help="start a new conversation "
                       "(default: continue the most recently updated one)")
    ask.add_argument("--system", default=None, help="system prompt, for a new conversation")

    lst = sub.add_parser("list", parents=[data], help="list conversations, newest first")
    lst.add_argument("--limit", type=int, default=50)
    search = sub.add_parser("search", parents=[data], help="full-text search over every message")
    search.add_argument("text")
    search.add_argument("--limit", type=int, default=50)

    export = sub.add_parser("export", parents=[data], help="write a conversation as Markdown, JSON or HTML")
    export.add_argument("conversation", nargs="?", type=int, help="conversation id (see `lanes list`)")
    export.add_argument("--all", action="store_true", help="every conversation, one file each, into -o DIR")
    export.add_argument("--format", choices=("md", "json", "html"), required=True)
    export.add_argument("-o", "--output", type=Path, required=True, help="file (or folder with --all)")
    export.add_argument("--force", action="store_true", help="overwrite existing files")
    imp = sub.add_parser("import", parents=[data], help="add conversations from exported JSON files")
    imp.add_argument("files", nargs="+", type=Path)

    compare = sub.add_parser("compare", parents=[data], help="A/B: the same request with own copy rates off and on")
    target = compare.add_mutually_exclusive_group(required=True)
    target.add_argument("--prompt", default=None, help="a new single-turn request")
    target.add_argument("--conversation", type=int, default=None,
                        help="a stored conversation: answer its last message again (or --message as the next)")
    compare.add_argument("--message", default=None, help="with --conversation: the next message to answer")
    compare.add_argument("--repeats", type=int, default=3, help="rounds per side, order alternated (default 3)")
    compare.add_argument("--max-tokens", type=int, default=256)
    compare.add_argument("--plain", action="store_true", help="add a third side with no drafts at all")
    compare.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    compare.add_argument("--json", type=Path, default=None, help="write the runs and summary here")

    delete = sub.add_parser("delete", parents=[data], help="delete conversations with their messages and history")
    delete.add_argument("conversations", nargs="+", type=int)
    recall = sub.add_parser("recall", parents=[data], help="show or set whether Recall copies across conversations")
    recall.add_argument("state", nargs="?", choices=("on", "off"), help="set it (app-wide, or for --conversation)")
    recall.add_argument("--conversation", type=int, default=None,
                        help="let this conversation be recalled from (on) or not (off)")

    serve = sub.add_parser("serve", parents=[data], help="serve the model over a local OpenAI-compatible API")
    serve.add_argument("--host", default="127.0.0.1",
                       help="interface to listen on (default: this machine only; another needs --api-key)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free one)")
    serve.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M)")
    serve.add_argument("--api-key", default=os.environ.get("LANES_API_KEY"),
                       help="key every request must send as 'Authorization: Bearer KEY' (default: $LANES_API_KEY)")
    serve.add_argument("--cors-origin", action="append", default=[],
                       help="let web pages of this origin call the API (repeatable; default: none)")
    serve.add_argument("--max-requests", type=int, default=32, help="requests running or queued at once; "
                       "more are answered 429 (default 32)")
    serve.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body (default 8 MiB)")
    serve.add_argument("--memory-limit-gb", type=float, default=None,
                       help="memory the model and every reply's KV may take together, in GiB (default: 60%% of "
                       "this machine's); a request that could never fit is answered 503")
    serve.add_argument("--save-conversations", action="store_true",
                       help="save each chat request and its reply as a conversation in the store")

    sub.add_parser("move-aside", parents=[data], help="rename an unusable database so Lanes starts fresh")

    make = sub.add_parser("make-model", help="write a model folder for tests and benchmarks (engine/made_models.py)")
    make.add_argument("kind", help="embedded-as-llama, embedded-as-qwen2, embedded-8bit (bfloat16 and 8-bit as "
                      "mlx-community ships models), an architecture for tiny random weights "
                      "(qwen3, gemma3_text, gpt_oss, lfm2, qwen3_next, nemotron_h, mamba2), or a model's shape "
                      "with random weights, for speed only (llama-1b-4bit)")
    make.add_argument("folder", type=Path)

    bstore = sub.add_parser("bench-store", help="time the store at scale (synthetic data, temp folder)")
    bstore.add_argument("--conversations", type=int, default=10_000)
    bstore.add_argument("--messages", type=int, default=100_000)
    bstore.add_argument("--recall-messages", type=int, default=10_000)
    bstore.add_argument("--repeats", type=int, default=20)
    bstore.add_argument("--json", type=Path, default=None, help="write results here")

    bserver = sub.add_parser("bench-server", help="OpenAI clients on loopback against served models")
    bserver.add_argument("--mode", choices=("load", "agent"), default="load")
    bserver.add_argument("--targets", default="lanes", help="comma-separated: lanes, mlx-lm (mlx_lm.server)")
    bserver.add_argument("--clients", type=int, default=16)
    bserver.add_argument("--requests", type=int, default=64, help="load mode: requests in all")
    bserver.add_argument("--workload", type=Path, default=Path("resources/workloads/mixed.jsonl"))
    bserver.add_argument("--sessions", type=Path, default=Path("resources/workloads/agent.jsonl"))
    bserver.add_argument("--max-tokens", type=int, default=None, help="load mode: override each line's max_tokens")
    bserver.add_argument("--model", default=None, help="model (default: the embedded one; mlx-lm needs a folder)")
    bserver.add_argument("--json", type=Path, default=None)

    report = sub.add_parser("bench-report", help="remake docs/benchmarks.md's tables from the JSON in docs/bench/")
    report.add_argument("--page", type=Path, default=Path("docs/benchmarks.md"))
    report.add_argument("--results", type=Path, default=Path("docs/bench"))

    args = parser.parse_args(argv)
    from engine.errors import LanesError

    try:
        if args.command == "bench":
            return _bench(args)
        if args.command == "make-model":
            return _make_model(args)
        if args.command == "bench-report":
            from engine.bench.report import update

            print(f"{args.page}: {'updated' if update(args.page, args.results) else 'already current'}")
            return 0
        if args.command == "bench-server":
            from engine.bench import server_bench

            return server_bench.main(args)
        if args.command == "serve":
            from engine.service.serve_cli import serve_command

            return serve_command(args)
        if args.command == "soak":
            from engine.bench import soak

            args.workloads = args.workloads or soak.default_workloads()
            return soak.main(args)
        from engine.service import commands

        return commands.run(args)
    except LanesError as exc:
        print(f"lanes: {exc}", file=sys.stderr)
        return 2
    finally:
        from engine.model.machine import drop_mlx_streams

        drop_mlx_streams()


def _bench(args: argparse.Namespace) -> int:

    from engine.bench.cell_specs import parse_cells
    from engine.bench.runner import Sampling, markdown, run_bench
    from engine.bench.workloads import at_streams, load_workload
    from engine.errors import LanesError
    from engine.model.loading import load_model

    cells = parse_cells(args.cells)
    if args.rounds < 1:
        raise LanesError("--rounds must be at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise LanesError(f"--temperature must be >= 0 and --top-p in (0, 1]; got {args.temperature}, {args.top_p}")
    items = load_workload(args.workload, args.max_tokens)
    if args.streams is not None:
        items = at_streams(items, args.streams)
    loaded = load_model(args.model)
    for w in loaded.warnings:
        print(f"warning: {w}", file=sys.stderr)
    result = run_bench(loaded, items, cells, args.rounds, progress=lambda s: print(s, file=sys.stderr),
                       warmup=args.warmup,
                       sampling=Sampling(args.temperature, args.top_p) if args.temperature > 0 else None)
    result["workload"] = str(args.workload)
    print(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return 0


def _make_model(args: argparse.Namespace) -> int:
    from engine.errors import LanesError
    from engine.model import made_models
    from engine.model.loading import load_model

    if args.kind not in made_models.KINDS:
        raise LanesError(f"unknown model kind '{args.kind}' (known: {', '.join(made_models.KINDS)})")
    folder = made_models.make(args.kind, args.folder, load_model(None))
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
