"""The store's command-line verbs (``lanes ask/chat/list/search/export/import/move-aside/bench-store``)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd in ("export", "import"):
        from engine.service import transcript_cli

        return transcript_cli.export_command(args) if cmd == "export" else transcript_cli.import_command(args)
    if cmd == "compare":
        from engine.service.compare_cli import compare_command

        return compare_command(args)
    if cmd == "bench-store":
        from engine.bench.store_bench import run_store_bench_cli

        return run_store_bench_cli(args)
    from engine.service import terminal

    return terminal.run(args)
