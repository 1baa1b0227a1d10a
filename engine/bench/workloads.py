"""Benchmark workloads: one stream per JSONL line."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import LanesError

ROLES = {"system", "user", "assistant"}


@dataclass(frozen=True)
class WorkItem:
    id: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int


def load_workload(path: Path, max_tokens: int | None = None) -> list[WorkItem]:
    """Parse ``path``; errors name the file and line."""
    if not path.is_file():
        raise LanesError(f"workload file not found: {path}")
    items: list[WorkItem] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            messages = tuple({"role": m["role"], "content": m["content"]} for m in data["messages"])
            if not messages or any(m["role"] not in ROLES for m in messages):
                raise ValueError("messages must be a non-empty list of system/user/assistant turns")
            limit = int(data.get("max_tokens", 256)) if max_tokens is None else max_tokens
            items.append(WorkItem(str(data.get("id", f"line{n}")), messages, limit))
        except (ValueError, KeyError, TypeError) as exc:
            raise LanesError(f"{path}:{n}: not a workload line ({exc})") from None
    if not items:
        raise LanesError(f"{path}: no streams in workload")
    return items


def at_streams(items: list[WorkItem], streams: int) -> list[WorkItem]:
    """``streams`` streams from a workload: its first ones, or all of them in turn again, each
    repeat with its own id (``refrigerator#2``), so one workload measures 1 to 16 streams.

    >>> w = [WorkItem("a", (), 8), WorkItem("b", (), 8)]
    >>> [i.id for i in at_streams(w, 1)], [i.id for i in at_streams(w, 5)]
    (['a'], ['a', 'b', 'a#2', 'b#2', 'a#3'])
    """
    if streams < 1:
        raise LanesError(f"--streams must be at least 1, got {streams}")
    out = []
    for n in range(streams):
        item, repeat = items[n % len(items)], n // len(items)
        out.append(replace(item, id=f"{item.id}#{repeat + 1}") if repeat else item)
    return out
