"""The terminal front door: ``lanes ask``, ``lanes chat``, ``lanes list``, ``lanes search``,
``lanes move-aside``. Replies stream to stdout; progress, warnings and statistics go to stderr."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from engine.errors import LanesError, NewerSchemaError, NotLanesDatabaseError
from engine.events import Event, Notice, Tokens, Waiting
from engine.service.session import ChatSession, ReplySettings, delete_without_engine
from engine.store import paths, render
from engine.store.db import move_aside
from engine.store.records import ConversationSummary, Message, pack_origins
from engine.store.store import RECALL_SETTING, Store

HELP = "Commands: /new starts a new conversation, /quit leaves (or Ctrl-D). Ctrl-C stops a reply."
_COLOURS = {"model": "", "context": "\x1b[36m", "recall": "\x1b[35m"}


def run(args: argparse.Namespace) -> int:
    if args.command == "list":
        with Store.open(args.data_dir) as store:
            _print_conversations(store.list_conversations(args.limit), "no conversations yet")
        return 0
    if args.command == "search":
        with Store.open(args.data_dir) as store:
            _print_conversations(store.search(args.text, args.limit), f"nothing matches {args.text!r}")
        return 0
    if args.command == "move-aside":
        return _move_aside(args)
    if args.command == "delete":
        with Store.open(args.data_dir) as store:
            for cid in args.conversations:
                store.conversation(cid)  # all ids checked before the first delete
            for cid in args.conversations:
                delete_without_engine(store, cid)  # its KV files too
                print(f"deleted conversation {cid}")
        return 0
    if args.command == "recall":
        return _recall(args)
    return _ask(args) if args.command == "ask" else _chat(args)


def stats_line(message: Message) -> str:
    """A saved reply's statistics, bracketed (engine/store/render.py words them for every front end)."""
    return f"[{render.stats_line(message.stats, pack_origins(message.origins))}]"


def _settings(args: argparse.Namespace) -> ReplySettings:
    if args.max_tokens < 1:
        raise LanesError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    own = None if args.own_copy_rates == "family" else args.own_copy_rates == "on"
    return ReplySettings(args.max_tokens, args.temperature, args.top_p, own)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a reply the way Ctrl-C does, so it is saved as cancelled."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _printer(colour: bool):  # -> Callable[[Event], None]
    def show(ev: Event) -> None:
        if isinstance(ev, Tokens):
            c = _COLOURS.get(ev.origins[0], "") if colour and ev.origins else ""
            sys.stdout.write(f"{c}{ev.text}\x1b[0m" if c else ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Waiting):
            print(f"(waiting to start: {ev.reason})", file=sys.stderr)
        elif isinstance(ev, Notice):
            print(f"({ev.message})", file=sys.stderr)
    return show


def _start_engine(model: str | None, store: Store):  # -> tuple[Engine, ModelInfo]
    from engine.model import kv_files
    from engine.rounds.engine_thread import Engine

    print("Loading model...", file=sys.stderr)
    engine = Engine(model, kv_dir=kv_files.folder(store.path.parent))  # long chats' KV kept across runs
    try:
        info = engine.info()
    except BaseException:
        engine.close()
        raise
    for w in info.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return engine, info


def _reply(session: ChatSession, conversation_id: int, text: str, settings: ReplySettings) -> Message:
    """Stream one reply to stdout; Ctrl-C (or SIGTERM) stops it and keeps what it had."""
    show = _printer(sys.stdout.isatty())
    try:
        msg = session.ask(conversation_id, text, settings, on_event=show)
    except KeyboardInterrupt:
        msg = session.store.messages(conversation_id)[-1]
        print("\n(stopped)", file=sys.stderr)
    else:
        print()
    print(stats_line(msg), file=sys.stderr)
    return msg


def _ask(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not args.message.strip():
        raise LanesError("the message is empty: lanes ask \"your message\"")
    with Store.open(args.data_dir) as store:  # open (and check) the store before the slow model load
        if args.conversation is not None:
            store.conversation(args.conversation)
        engine, info = _start_engine(args.model, store)
        with engine:
            session = ChatSession(store, engine, info.name)
            session.load_recall()
            if args.conversation is not None:
                conv_id = args.conversation
            else:
                latest = None if args.new else store.latest_conversation()
                conv_id = latest.id if latest else session.new_conversation(args.system or "", settings).id
            print(f"(conversation {conv_id})", file=sys.stderr)
            with _sigterm_as_interrupt():
                msg = _reply(session, conv_id, args.message, settings)
    return 130 if msg.status == "cancelled" else (1 if msg.status == "error" else 0)


def _chat(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with Store.open(args.data_dir) as store:
        conv_id = args.conversation
        if conv_id is not None:
            store.conversation(conv_id)
        engine, info = _start_engine(args.model, store)
        with engine:
            session = ChatSession(store, engine, info.name)
            session.load_recall()
            print(f"{info.name} on {info.device}; saving to {store.path}. {HELP}", file=sys.stderr)
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
                    conv_id = None
                    print("(new conversation)", file=sys.stderr)
                    continue
                if conv_id is None:
                    conv_id = session.new_conversation(args.system or "", settings).id
                print("lanes> ", end="", flush=True)
                _reply(session, conv_id, line, settings)


def _print_conversations(rows: list[ConversationSummary], empty: str) -> None:
    if not rows:
        print(f"({empty})")
        return
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.updated_at))
        print(f"{r.id:>6}  {when}  {r.messages:>4} msgs  {r.title or '(untitled)'}")
        if r.snippet:
            print(f"        {' '.join(r.snippet.split())}")


def _recall(args: argparse.Namespace) -> int:
    with Store.open(args.data_dir) as store:
        if args.conversation is not None:
            if args.state is not None:
                store.update_conversation(args.conversation, recallable=args.state == "on")
            conv = store.conversation(args.conversation)
            print(f"conversation {conv.id} can {'' if conv.recallable else 'not '}be recalled from")
            return 0
        if args.state is not None:
            store.set_setting(RECALL_SETTING, args.state == "on")
        on = store.recall_other_conversations
        print(f"Recall {'copies' if on else 'does not copy'} from other conversations")
    return 0


def _move_aside(args: argparse.Namespace) -> int:
    path = paths.database_path(args.data_dir)
    if not path.exists():
        print(f"{path} does not exist; nothing to move")
        return 0
    try:
        Store(path).close()
    except (NotLanesDatabaseError, NewerSchemaError) as exc:  # not for "locked": that file is in use
        target = move_aside(path)
        print(f"{exc.__class__.__name__}: moved {path} (and any -wal/-shm beside it) to {target}, unchanged; "
              "Lanes starts a fresh database next time")
        return 0
    raise LanesError(f"{path} is a working Lanes database; nothing was moved")
