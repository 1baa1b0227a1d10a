"""``lanes export`` and ``lanes import``: transcripts to files and back, never half done.

Every target is checked before anything is written (an existing file needs --force), each file is
written atomically (temp file in the same folder, then renamed), and all files given to one import
go in one transaction, so a bad file leaves the store as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from pathlib import Path
from typing import Any

from engine.errors import LanesError
from engine.store import render, transcript
from engine.store.records import Conversation
from engine.store.store import Store

RENDER = {
    "json": lambda store, cid: json.dumps(transcript.conversation_to_json(store, cid), ensure_ascii=False,
                                          indent=2) + "\n",
    "md": render.conversation_to_markdown,
    "html": render.conversation_to_html,
}


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666: the umask applies as usual
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _refuse_existing(targets: list[Path], force: bool) -> None:
    for t in targets:
        if t.is_dir():
            raise LanesError(f"{t} is a folder; give a file name with -o")
    existing = [t for t in targets if t.exists()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise LanesError(f"{existing[0]} already exists{more}; add --force to overwrite")


def export_command(args: argparse.Namespace) -> int:
    """Export one conversation, or every one with --all (JSON only), to files."""
    out: Path = args.output
    with Store.open(args.data_dir) as store:
        if args.all:
            if args.conversation is not None:
                raise LanesError("give a conversation id or --all, not both")
            if args.format != "json":
                raise LanesError("--all exports JSON only (one file per conversation); use --format json")
            if out.exists() and not out.is_dir():
                raise LanesError(f"{out} is a file; --all needs a folder for -o")
            ids = sorted(s.id for s in store.list_conversations(limit=max(1, store.count_conversations())))
            jobs = [(cid, out / f"conversation-{cid}.json") for cid in ids]
        else:
            if args.conversation is None:
                raise LanesError("give a conversation id (see `lanes list`) or --all")
            store.conversation(args.conversation)  # NotFoundError before touching any file
            jobs = [(args.conversation, out)]
        _refuse_existing([path for _, path in jobs], args.force)
        render = RENDER[args.format]
        if args.all:
            out.mkdir(parents=True, exist_ok=True)
        for cid, path in jobs:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, render(store, cid))
            print(f"exported conversation {cid} to {path}")
        if not jobs:
            print(f"no conversations to export; {out} is empty")
    return 0


def read_document(path: Path) -> Any:
    """A file's JSON, or a LanesError that names the file and says what is wrong with it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LanesError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LanesError(f"{path} is a folder, not an exported JSON file") from None
    except OSError as exc:
        raise LanesError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LanesError(f"{path} is not UTF-8 text (byte {exc.start}); expected a Lanes JSON export") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise LanesError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise LanesError(f"{path} is not valid JSON (nested too deeply)") from None


def import_files(store: Store, paths: list[Path]) -> list[tuple[Path, Conversation]]:
    """Import every file, all in one transaction: one bad file (a LanesError naming it) and none is."""
    docs = [(path, read_document(path)) for path in paths]
    for path, data in docs:
        transcript.validate(data, str(path))  # every file checked before the first write
    with store.write():
        return [(path, transcript.import_conversation(store, data, str(path))) for path, data in docs]


def import_command(args: argparse.Namespace) -> int:
    with Store.open(args.data_dir) as store:
        for path, conv in import_files(store, list(args.files)):
            print(f"imported {path} as conversation {conv.id} ({conv.title or 'untitled'})")
    return 0
