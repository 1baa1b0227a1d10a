"""``lanes compare``: the own-copy-rates A/B without the window; prints the seed-style Markdown table."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from engine.errors import LanesError
from engine.service import comparisons
from engine.service.compare import Run, ab_table, first_difference, run_comparison, summarise
from engine.service.session import ChatSession
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
                print(f"repeat {run.repeat + 1} {run.side}: {run.tok_s:.1f} tok/s, {run.status}", file=sys.stderr)

            runs = run_comparison(engine.submit, spec, info.copy_rate, on_run=done, doubt_prior=info.doubt_prior)
        status = "complete" if all(r.status == "complete" for r in runs) else "error"
        saved = comparisons.save(store, spec, runs, info.name, args.conversation, status)
    table = ab_table(runs, spec.sides, spec.repeats)
    print(f"{info.name} on {info.device}, {len(spec.messages)} turn(s), up to {spec.max_tokens} tokens, "
          f"greedy, {spec.repeats} alternated rounds; tok/s by round (saved as comparison {saved.id}):\n")
    print(table, end="")
    if args.json:
        diff = first_difference(runs)
        doc = {"comparison": saved.id, "model": info.name, "device": info.device, "settings": spec.settings(),
               "runs": [asdict(r) for r in runs], "summary": [asdict(s) for s in summarise(runs, spec.sides)],
               "token_equal": diff is None, "first_difference": asdict(diff) if diff else None}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return 0 if status == "complete" else 1
