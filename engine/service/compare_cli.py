"""``lanes compare``: the own-copy-rates A/B without the window; prints the saved comparison's A/B table
and verdict (engine/store/ab_report.py), and with ``--json`` writes its document (the pane's export)."""

from __future__ import annotations

import argparse
import json
import sys

from engine.errors import LanesError
from engine.service import comparisons
from engine.service.compare import run_comparison
from engine.service.session import ChatSession
from engine.store.ab_report import Run
from engine.store.store import Store


def compare_command(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.max_tokens < 1:
        raise LanesError("--repeats and --max-tokens must be at least 1")
    if args.message is not None and args.conversation is None:
        raise LanesError("--message needs --conversation (use --prompt for a new request)")
    from engine.rounds.engine_thread import Engine

    with Store.open(args.data_dir) as store:
        spec = comparisons.build_spec(
            store, prompt=args.prompt if args.conversation is None else args.message,
            conversation_id=args.conversation, max_tokens=args.max_tokens, repeats=args.repeats, plain=args.plain)
        print("Loading model...", file=sys.stderr)
        with Engine(args.model) as engine:
            info = engine.info()
            ChatSession(store, engine, info.name).load_recall()  # both sides see the same Recall

            def done(run: Run) -> None:
                speed = "no speed" if run.tok_s is None else f"{run.tok_s:.1f} tok/s"
                print(f"repeat {run.repeat + 1} {run.side}: {speed}, {run.status}", file=sys.stderr)

            runs = run_comparison(engine.submit, spec, info.copy_rate, on_run=done, doubt_prior=info.doubt_prior)
        status = "complete" if all(r.status == "complete" for r in runs) else "error"
        saved = comparisons.save(store, spec, runs, info.name, args.conversation, status)
    # The saved comparison, so the table and the JSON are those the pane shows for it.
    report = comparisons.report_of(saved)
    print(f"{info.name} on {info.device}, {len(spec.messages)} turn(s), up to {spec.max_tokens} tokens, "
          f"greedy, {spec.repeats} alternated rounds; tok/s by round (saved as comparison {saved.id}):\n")
    print(report.markdown())
    print(report.verdict())
    if args.json:
        doc = comparisons.comparison_document(saved, info.device)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, separators=(",", ":"), default=dict) + "\n")
    return 0 if status == "complete" else 1
