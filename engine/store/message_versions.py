"""A reply's versions: regenerate and edit-and-resend keep the earlier replies, browsable (< 1/2 >).

The message row always holds the version shown, so everything that reads messages (the next turn's
prompt, Recall, search, exports) sees that one. The others wait in ``message_versions`` with the
user message each one answered, as it was then. A part of ``Store`` (``engine.store.store``), which
runs these under its lock.

Worked example: a reply "Paris." (version 1) to "Capital of France?". Edit and resend as "Capital
of Italy?": ``new_version`` keeps (1, prompt "Capital of France?", "Paris.") aside and empties the
row as version 2, which the new reply "Rome." fills. ``show_version(reply, 1)`` swaps: the row holds
"Paris." again, the user message reads "Capital of France?" again, and (2, "Capital of Italy?",
"Rome.") waits aside.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.errors import NotFoundError
from engine.store.records import (
    MessageVersion,
    dumps,
    loads,
    pack_origins,
    pack_tokens,
    unpack_origins,
    unpack_tokens,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path

    import sqlite_utils

# A messages query's columns with the count of versions (``Store._message`` reads both).
MESSAGE_COLUMNS = "m.*, (SELECT count(*) FROM message_versions v WHERE v.message_id = m.id) + 1 AS versions"
_FIELDS = "content, status, error, stats, origins, tokens, tokens_model, created_at"


class VersionRows:
    db: sqlite_utils.Database
    path: Path

    def write(self) -> AbstractContextManager[None]:  # Store's transaction
        raise NotImplementedError

    def _prompt(self, message_id: int) -> tuple[int, str] | None:
        """The user message a reply answers: the conversation's last one before it."""
        row = self.db.execute(
            "SELECT id, content FROM messages WHERE role = 'user' AND id < ? AND conversation_id ="
            " (SELECT conversation_id FROM messages WHERE id = ?) ORDER BY id DESC LIMIT 1",
            (message_id, message_id)).fetchone()
        return None if row is None else (row[0], row[1])

    def _set_aside(self, message_id: int) -> int:
        """Copy the row's version into ``message_versions``; returns its number."""
        row = self.db.execute("SELECT version FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no message {message_id} in {self.path}")
        prompt = self._prompt(message_id)
        self.db.execute(f"INSERT INTO message_versions (message_id, number, prompt, {_FIELDS})"
                        f" SELECT id, version, ?, {_FIELDS} FROM messages WHERE id = ?",
                        (None if prompt is None else prompt[1], message_id))
        return int(row[0])

    def new_version(self, message_id: int) -> int:
        """Keep the message as it is as one of its versions and empty it as the next one (partial),
        for a new reply to fill; returns the new version's number."""
        now = time.time()
        with self.write():
            self._set_aside(message_id)
            number = self.db.execute("SELECT max(number) + 1 FROM message_versions WHERE message_id = ?",
                                     (message_id,)).fetchone()[0]
            self.db.execute(
                "UPDATE messages SET version = ?, content = '', status = 'partial', error = NULL, stats = NULL,"
                " origins = NULL, tokens = NULL, tokens_model = NULL, created_at = ?, updated_at = ? WHERE id = ?",
                (number, now, now, message_id))
        return int(number)

    def show_version(self, message_id: int, number: int) -> None:
        """Show version ``number`` of a message: it takes the row's place (and its user message's text
        as it was then), the one shown until now is kept aside. Nothing else in the conversation moves."""
        with self.write():
            aside = self.db.execute("SELECT prompt FROM message_versions WHERE message_id = ? AND number = ?",
                                    (message_id, number)).fetchone()
            if aside is None:
                shown = self.db.execute("SELECT version FROM messages WHERE id = ?", (message_id,)).fetchone()
                if shown is not None and shown[0] == number:
                    return
                raise NotFoundError(f"message {message_id} has no version {number} in {self.path}")
            prompt = self._prompt(message_id)
            self._set_aside(message_id)
            self.db.execute(f"UPDATE messages SET ({_FIELDS}) = (SELECT {_FIELDS} FROM message_versions"
                            " WHERE message_id = ? AND number = ?), version = ?, updated_at = ? WHERE id = ?",
                            (message_id, number, number, time.time(), message_id))
            self.db.execute("DELETE FROM message_versions WHERE message_id = ? AND number = ?", (message_id, number))
            if prompt is not None and aside[0] is not None and aside[0] != prompt[1]:
                # Its tokens belonged to the other text; Recall encodes the message again when it needs them.
                self.db.execute("UPDATE messages SET content = ?, tokens = NULL, tokens_model = NULL WHERE id = ?",
                                (aside[0], prompt[0]))

    def versions(self, message_id: int) -> list[MessageVersion]:
        """A message's versions other than the one shown, by number."""
        rows = self.db.query("SELECT * FROM message_versions WHERE message_id = ? ORDER BY number", (message_id,))
        return [MessageVersion(r["message_id"], r["number"], r["prompt"], r["content"], r["status"], r["error"],
                               loads(r["stats"]), unpack_origins(r["origins"]), unpack_tokens(r["tokens"]),
                               r["tokens_model"], r["created_at"]) for r in rows]

    def add_versions(self, message_id: int, shown: int, versions: Sequence[MessageVersion]) -> None:
        """Give a message (an imported one) its number and its other versions, in one transaction."""
        with self.write():
            self.db.execute("UPDATE messages SET version = ? WHERE id = ?", (shown, message_id))
            self.db.conn.executemany(
                f"INSERT INTO message_versions (message_id, number, prompt, {_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?, ?)",
                [(message_id, v.number, v.prompt, v.content, v.status, v.error, dumps(v.stats),
                  pack_origins(v.origins), pack_tokens(v.tokens), v.tokens_model, v.created_at) for v in versions])
