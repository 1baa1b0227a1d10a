"""Export from the window, through the store's transcript formats (runs on the store thread)."""

from __future__ import annotations

import re
from pathlib import Path

from engine.service.transcript_cli import RENDER, write_atomically
from engine.store.store import Store


def export_to(store: Store, conversation_id: int | None, fmt: str, path: Path) -> int:
    """One conversation to the file ``path``, or (``conversation_id`` None) every one as JSON files in
    the folder ``path``; returns how many. The file dialog has already asked about overwriting."""
    if conversation_id is not None:
        write_atomically(path, RENDER[fmt](store, conversation_id))
        return 1
    path.mkdir(parents=True, exist_ok=True)
    ids = [c.id for c in store.list_conversations(limit=store.count_conversations())]
    for cid in ids:
        write_atomically(path / f"conversation-{cid}.{fmt}", RENDER[fmt](store, cid))
    return len(ids)


def file_name(title: str, limit: int = 80) -> str:
    """A conversation's title as a file name: characters no file system takes replaced, Markdown
    marks dropped, at most ``limit`` characters ("What is `ls`? / notes" -> "What is ls - notes")."""
    name = re.sub(r'[\\/:*?"<>|\x00-\x1f]+', " - ", re.sub(r"[`*_#~]", "", title))
    name = re.sub(r"(?:\s*-\s*){2,}", " - ", " ".join(name.split())).strip(" .-")
    return name[:limit].rstrip(" .-")
