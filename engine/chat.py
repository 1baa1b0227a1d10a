"""A terminal chat on the engine (what ``make run`` opens until the window lands)."""

from __future__ import annotations

import sys

from engine.engine import Engine
from engine.events import Failed, Finished, Request, Tokens

HELP = "Commands: /new starts a new conversation, /quit leaves (or Ctrl-D). Ctrl-C stops a reply."
_COLOURS = {"model": "", "context": "\x1b[36m", "recall": "\x1b[35m"}


def stats_line(done: Finished) -> str:
    st = done.stats
    rows = ", ".join(f"{src} {c.accepted}/{c.tested}" for src, c in st.rows.items() if c.tested)
    ttft = f"{st.first_token_s:.2f}s" if st.first_token_s is not None else "-"
    return (
        f"[{st.generated} tokens, {st.tokens_per_s:.1f} tok/s, first token {ttft}, {done.reason}; "
        f"copied rows accepted/tested: {rows or 'none'}]"
    )


def run_chat(
    model: str | None, max_tokens: int, temperature: float, top_p: float, own: bool | None, system: str | None
) -> int:
    colour = sys.stdout.isatty()
    print("Loading model...", file=sys.stderr)
    with Engine(model) as engine:
        info = engine.info()
        for w in info.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"{info.name} on {info.device}. {HELP}", file=sys.stderr)
        conv = 0
        history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        copy_history = None
        while True:
            try:
                line = input("\nyou> ")
            except EOFError:
                print()
                return 0
            if not line.strip():
                continue
            if line.strip() == "/quit":
                return 0
            if line.strip() == "/new":
                conv += 1
                history = history[:1] if system else []
                copy_history = None
                print("(new conversation)", file=sys.stderr)
                continue
            history.append({"role": "user", "content": line})
            req = Request(
                messages=tuple(history), max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                own_copy_rates=own, copy_history=copy_history, conversation=f"chat{conv}",
            )
            handle = engine.submit(req)
            print("lanes> ", end="", flush=True)
            try:
                for ev in handle:
                    if isinstance(ev, Tokens):
                        c = _COLOURS.get(ev.origins[0], "") if colour and ev.origins else ""
                        print(f"{c}{ev.text}\x1b[0m" if c else ev.text, end="", flush=True)
                    elif isinstance(ev, Finished):
                        print(f"\n{stats_line(ev)}", file=sys.stderr)
                        history.append({"role": "assistant", "content": ev.text})
                        copy_history = ev.copy_history
                    elif isinstance(ev, Failed):
                        print(f"\nerror: {ev.message}", file=sys.stderr)
                        history.pop()
            except KeyboardInterrupt:
                handle.cancel()
                done = handle.wait()
                if isinstance(done, Finished):
                    history.append({"role": "assistant", "content": done.text})
                print("\n(stopped)", file=sys.stderr)
