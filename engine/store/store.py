"""``Store``: the repository over Lanes' database, one connection.

A Store may be shared by threads: every public method runs under the Store's lock, and a
``write()`` transaction holds it to the end, so the app keeps one Store (one connection) for the
window, its replies and the comparison pane. Other processes (the CLI, a second window) are ordinary
concurrent users of the file: WAL, a busy timeout, ``BEGIN IMMEDIATE``.

Every write that must be all-or-nothing runs in one transaction (``Store.write()``); the commit that
ends a reply is also made durable (``Store.durable()``). Deleting a conversation removes its
messages, copy history and comparisons by foreign-key cascade.

Typical use::

    store = Store.open()                       # --data-dir, $LANES_DATA_DIR or the platform folder
    conv = store.create_conversation(model="SmolLM2-135M-Instruct")
    store.add_message(conv.id, "user", "Fix the typos: ...")
    store.save_copy_history(conv.id, {"context": {"accepted": 5.6, "tested": 7.3}})
    store.copy_history(conv.id)                # the same mapping, in a later process too
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from engine.errors import NotFoundError
from engine.store import paths
from engine.store.comparison_rows import ComparisonRows
from engine.store.db import open_database
from engine.store.message_versions import MESSAGE_COLUMNS, VersionRows
from engine.store.records import (
    ROLES,
    STATUSES,
    Conversation,
    ConversationSummary,
    Message,
    dumps,
    loads,
    pack_origins,
    pack_tokens,
    unpack_origins,
    unpack_tokens,
)

RECALL_SETTING = "recall_other_conversations"
_UNSET: Any = object()
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    @functools.wraps(method)
    def run(self: Store, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def fts_query(text: str) -> str:
    """A user's search words as an FTS5 query: every word must appear (as a prefix of a word).

    ``'copy "rates'`` -> ``'"copy"* "rates"*'``: each word quoted so FTS5 syntax in the text is inert.
    """
    words = re.findall(r"\w+", text)
    return " ".join('"' + w.replace('"', '""') + '"*' for w in words)


def _conversation(row: Mapping[str, Any]) -> Conversation:
    return Conversation(
        id=row["id"], title=row["title"], model=row["model"], system_prompt=row["system_prompt"],
        settings=loads(row["settings"]) or {}, recallable=bool(row["recallable"]),
        created_at=row["created_at"], updated_at=row["updated_at"],
    )


def _message(row: Mapping[str, Any]) -> Message:
    return Message(
        id=row["id"], conversation_id=row["conversation_id"], role=row["role"], content=row["content"],
        status=row["status"], error=row["error"], stats=loads(row["stats"]),
        origins=unpack_origins(row["origins"]), tokens=unpack_tokens(row["tokens"]),
        tokens_model=row["tokens_model"], created_at=row["created_at"], updated_at=row["updated_at"],
        version=row["version"], versions=row["versions"],
    )


class Store(ComparisonRows, VersionRows):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self.db: sqlite_utils.Database = open_database(self.path)

    def run(self, fn: Callable[[Store], T]) -> T:
        """``fn(self)`` under the lock: several calls as one step no other thread can come between."""
        with self._lock:
            return fn(self)

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str] | None = None) -> Store:
        return cls(paths.database_path(data_dir))

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[None]:
        """A write transaction, taken with ``BEGIN IMMEDIATE``: several connections write in turn.

        A deferred transaction that reads before it writes fails at once with "database is locked"
        when another connection committed in between (WAL cannot upgrade a stale snapshot); taking
        the write lock first makes it wait (busy timeout) instead. Nested calls become savepoints.
        """
        with self._lock:
            if self.db.conn.in_transaction:
                with self.db.atomic():
                    yield
                return
            self.db.conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.db.conn.execute("COMMIT")
            except BaseException:
                if self.db.conn.in_transaction:  # also when COMMIT itself failed: never leave it open
                    self.db.conn.execute("ROLLBACK")
                raise

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that see one state of the file (a deferred transaction), under the lock."""
        with self._lock, self.db.atomic():
            yield

    @contextmanager
    def durable(self) -> Iterator[None]:
        """A ``write()`` whose commit also survives a power cut: ``synchronous = FULL`` syncs the WAL
        at commit (with ``fullfsync`` on macOS). For the commit that ends a reply: once the window
        shows a reply complete, it is on the disk. Streaming progress stays NORMAL (no sync per save)."""
        with self._lock:
            if self.db.conn.in_transaction:
                raise RuntimeError("durable() must begin the transaction (the level is per commit)")
            self.db.conn.execute("PRAGMA synchronous = FULL")
            try:
                with self.write():
                    yield
            finally:
                self.db.conn.execute("PRAGMA synchronous = NORMAL")

    # -- conversations -------------------------------------------------------
    def create_conversation(
        self,
        title: str = "",
        model: str = "",
        system_prompt: str = "",
        settings: Mapping[str, Any] | None = None,
        recallable: bool = True,
        created_at: float | None = None,
        updated_at: float | None = None,
    ) -> Conversation:
        now = time.time()
        created = now if created_at is None else created_at
        cur = self.db.execute(
            "INSERT INTO conversations (title, model, system_prompt, settings, recallable, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (title, model, system_prompt, dumps(dict(settings or {})), int(recallable), created,
             created if updated_at is None else updated_at),
        )
        return self.conversation(int(cur.lastrowid or 0))

    def conversation(self, conversation_id: int) -> Conversation:
        rows = list(self.db.query("SELECT * FROM conversations WHERE id = ?", (conversation_id,)))
        if not rows:
            raise NotFoundError(f"no conversation {conversation_id} in {self.path}")
        return _conversation(rows[0])

    def latest_conversation(self) -> Conversation | None:
        rows = list(self.db.query("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC LIMIT 1"))
        return _conversation(rows[0]) if rows else None

    def list_conversations(self, limit: int = 50, offset: int = 0) -> list[ConversationSummary]:
        """Newest first (by last update)."""
        rows = self.db.query(
            "SELECT c.id, c.title, c.model, c.updated_at,"
            " (SELECT count(*) FROM messages m WHERE m.conversation_id = c.id) AS n"
            " FROM conversations c ORDER BY c.updated_at DESC, c.id DESC LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return [ConversationSummary(r["id"], r["title"], r["model"], r["updated_at"], r["n"]) for r in rows]

    def count_conversations(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM conversations").fetchone()[0])

    def update_conversation(
        self,
        conversation_id: int,
        *,
        title: str = _UNSET,
        model: str = _UNSET,
        system_prompt: str = _UNSET,
        settings: Mapping[str, Any] = _UNSET,
        recallable: bool = _UNSET,
    ) -> Conversation:
        # updated_at is the last message's time (the sidebar's order): a rename or a setting moves nothing.
        given = {"title": title, "model": model, "system_prompt": system_prompt,
                 "settings": settings if settings is _UNSET else dumps(dict(settings)),
                 "recallable": recallable if recallable is _UNSET else int(recallable)}
        fields = {k: v for k, v in given.items() if v is not _UNSET}
        if not fields:
            return self.conversation(conversation_id)
        sets = ", ".join(f"{k} = ?" for k in fields)
        cur = self.db.execute(f"UPDATE conversations SET {sets} WHERE id = ?", (*fields.values(), conversation_id))
        if cur.rowcount == 0:
            raise NotFoundError(f"no conversation {conversation_id} in {self.path}")
        return self.conversation(conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        """Remove a conversation with its messages, copy history and comparisons, in one transaction."""
        with self.write():
            cur = self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            if cur.rowcount == 0:
                raise NotFoundError(f"no conversation {conversation_id} in {self.path}")

    # -- messages --------------------------------------------------------------
    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        status: str = "complete",
        error: str | None = None,
        stats: Mapping[str, Any] | None = None,
        origins: Sequence[str] | None = None,
        tokens: Sequence[int] | None = None,
        tokens_model: str | None = None,
        created_at: float | None = None,
        updated_at: float | None = None,
    ) -> Message:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        now = time.time()
        created = now if created_at is None else created_at
        with self.write():
            self._touch(conversation_id, now if updated_at is None else updated_at)
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, error, stats, origins, tokens,"
                " tokens_model, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, status, error, dumps(stats), pack_origins(origins),
                 pack_tokens(tokens), tokens_model, created, created if updated_at is None else updated_at),
            )
        return self.message(int(cur.lastrowid or 0))

    def update_message(
        self,
        message_id: int,
        *,
        content: str = _UNSET,
        status: str = _UNSET,
        error: str | None = _UNSET,
        stats: Mapping[str, Any] | None = _UNSET,
        origins: Sequence[str] | None = _UNSET,
        tokens: Sequence[int] | None = _UNSET,
        tokens_model: str | None = _UNSET,
    ) -> None:
        """Change a message (a growing reply) and touch its conversation, in one transaction."""
        now = time.time()
        fields: dict[str, Any] = {"updated_at": now}
        if content is not _UNSET:
            fields["content"] = content
        if status is not _UNSET:
            if status not in STATUSES:
                raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
            fields["status"] = status
        for name, value, pack in (
            ("error", error, None), ("stats", stats, dumps), ("origins", origins, pack_origins),
            ("tokens", tokens, pack_tokens), ("tokens_model", tokens_model, None),
        ):
            if value is not _UNSET:
                fields[name] = pack(value) if pack is not None else value
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.write():
            row = self.db.execute("SELECT conversation_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no message {message_id} in {self.path}")
            self.db.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*fields.values(), message_id))
            self._touch(row[0], now)

    def delete_message(self, message_id: int) -> None:
        """Delete one message (the person's choice, anywhere in the conversation)."""
        with self.write():
            self._touch(self.message(message_id).conversation_id, time.time())
            self.db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def delete_messages_after(self, message_id: int) -> int:
        """Delete the conversation's messages after ``message_id`` (regenerate, edit); returns how many."""
        msg = self.message(message_id)
        with self.write():
            cur = self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id > ?",
                                  (msg.conversation_id, message_id))
            self._touch(msg.conversation_id, time.time())
        return cur.rowcount

    def save_progress(self, message_id: int, content: str) -> None:
        """A growing reply's text (every half second while it streams): one UPDATE, nothing else."""
        cur = self.db.execute("UPDATE messages SET content = ?, updated_at = ? WHERE id = ?",
                              (content, time.time(), message_id))
        if cur.rowcount == 0:
            raise NotFoundError(f"no message {message_id} in {self.path}")

    def message(self, message_id: int) -> Message:
        rows = list(self.db.query(f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE id = ?", (message_id,)))
        if not rows:
            raise NotFoundError(f"no message {message_id} in {self.path}")
        return _message(rows[0])

    def messages(self, conversation_id: int) -> list[Message]:
        """A conversation's messages in order."""
        self.conversation(conversation_id)  # NotFoundError for a wrong id, not an empty list
        rows = self.db.query(f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE conversation_id = ? ORDER BY id",
                             (conversation_id,))
        return [_message(r) for r in rows]

    def _touch(self, conversation_id: int, when: float) -> None:
        cur = self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (when, conversation_id))
        if cur.rowcount == 0:
            raise NotFoundError(f"no conversation {conversation_id} in {self.path}")

    # -- copy history ----------------------------------------------------------
    def copy_history(self, conversation_id: int) -> dict[str, dict[str, float]] | None:
        """The conversation's stored decayed copy history by source, or None (use the family prior)."""
        rows = self.db.query(
            "SELECT source, accepted, tested FROM copy_history WHERE conversation_id = ? ORDER BY source",
            (conversation_id,),
        )
        history = {r["source"]: {"accepted": r["accepted"], "tested": r["tested"]} for r in rows}
        return history or None

    def save_copy_history(self, conversation_id: int, snapshot: Mapping[str, Mapping[str, float]]) -> None:
        """Replace the conversation's copy history with an engine snapshot (``CopyRates.snapshot()``)."""
        now = time.time()
        with self.write():
            self.db.execute("DELETE FROM copy_history WHERE conversation_id = ?", (conversation_id,))
            self.db.conn.executemany(
                "INSERT INTO copy_history (conversation_id, source, accepted, tested, updated_at) VALUES (?, ?, ?, ?, ?)",
                [(conversation_id, source, float(c.get("accepted", 0.0)), float(c.get("tested", 0.0)), now)
                 for source, c in snapshot.items()])

    # -- settings --------------------------------------------------------------
    def setting(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return default if row is None else loads(row[0])

    def set_setting(self, key: str, value: Any) -> None:
        self.db.execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, dumps(value)),
        )

    @property
    def recall_other_conversations(self) -> bool:
        """Whether Recall may copy from other conversations (on unless turned off)."""
        return bool(self.setting(RECALL_SETTING, True))

    # -- search and Recall -----------------------------------------------------
    def search(self, text: str, limit: int = 50) -> list[ConversationSummary]:
        """Conversations whose messages hold every word of ``text``, best match first, with a snippet."""
        query = fts_query(text)
        if not query:
            return []
        # Rank inside the FTS table alone, then look up the conversations of the top rows only: joining
        # messages before the sort costs a lookup per match (~40 ms for a common word at 100,000 messages).
        hits = self.db.execute(
            "SELECT rowid, snippet(messages_fts, 0, '[', ']', '…', 12) FROM messages_fts"
            " WHERE messages_fts MATCH ? ORDER BY bm25(messages_fts) LIMIT ?",
            (query, limit * 8),
        ).fetchall()
        if not hits:
            return []
        marks = ",".join("?" * len(hits))
        owner = dict(self.db.execute(
            f"SELECT id, conversation_id FROM messages WHERE id IN ({marks})", [h[0] for h in hits]).fetchall())
        best: dict[int, str] = {}
        for rowid, snip in hits:
            if rowid not in owner:
                continue  # deleted by another connection between the two reads
            best.setdefault(owner[rowid], snip)
            if len(best) == limit:
                break
        if not best:
            return []
        marks = ",".join("?" * len(best))
        convs = {
            r["id"]: r
            for r in self.db.query(
                "SELECT c.id, c.title, c.model, c.updated_at,"
                " (SELECT count(*) FROM messages m WHERE m.conversation_id = c.id) AS n"
                f" FROM conversations c WHERE c.id IN ({marks})",
                tuple(best),
            )
        }
        return [
            ConversationSummary(cid, convs[cid]["title"], convs[cid]["model"], convs[cid]["updated_at"],
                                convs[cid]["n"], snip)
            for cid, snip in best.items()
            if cid in convs
        ]

    def recall_rows(self, conversation_id: int | None = None) -> list[tuple[int, int, str, bytes | None, str | None]]:
        """(conversation id, message id, content, token blob, tokens' model) of every message Recall may
        copy from: recallable conversations (or just ``conversation_id``), non-empty, not failed; oldest
        first. A list, not a cursor: no read may outlive the lock."""
        only = "" if conversation_id is None else " AND c.id = ?"
        return self.db.execute(
            "SELECT m.conversation_id, m.id, m.content, m.tokens, m.tokens_model FROM messages m"
            " JOIN conversations c ON c.id = m.conversation_id"
            f" WHERE c.recallable = 1 AND m.content != '' AND m.status != 'error'{only} ORDER BY m.id",
            () if conversation_id is None else (conversation_id,),
        ).fetchall()

    def set_tokens(self, updates: Sequence[tuple[int, Sequence[int], str]]) -> None:
        """Store token ids for messages: (message id, tokens, model), in one transaction."""
        with self.write():
            self.db.conn.executemany(
                "UPDATE messages SET tokens = ?, tokens_model = ? WHERE id = ?",
                [(pack_tokens(t), m, mid) for mid, t, m in updates],
            )


# Every public method runs under the Store's lock (write(), durable() and run() take it themselves).
for _name, _method in [*vars(ComparisonRows).items(), *vars(VersionRows).items(), *vars(Store).items()]:
    if not _name.startswith("_") and inspect.isfunction(_method) and _name not in ("write", "snapshot", "durable", "run"):
        setattr(Store, _name, _locked(_method))
