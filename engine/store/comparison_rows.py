"""The A/B comparisons' rows: one comparison with all its runs saved in one transaction, and read
back whole. A part of ``Store`` (``engine.store.store``), which runs these under its lock."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.errors import NotFoundError
from engine.store.records import (
    STATUSES,
    Comparison,
    ComparisonRun,
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


class ComparisonRows:
    db: sqlite_utils.Database
    path: Path

    def write(self) -> AbstractContextManager[None]:  # Store's transaction
        raise NotImplementedError

    def add_comparison(
        self,
        messages: Sequence[Mapping[str, str]],
        runs: Sequence[ComparisonRun],
        *,
        conversation_id: int | None = None,
        settings: Mapping[str, Any] | None = None,
        model: str = "",
        copy_history: Mapping[str, Any] | None = None,
        status: str = "complete",
        created_at: float | None = None,
    ) -> Comparison:
        """Save one comparison with all its runs, in one transaction."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        with self.write():
            cur = self.db.execute(
                "INSERT INTO comparisons (conversation_id, messages, settings, model, copy_history, status, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, dumps([dict(m) for m in messages]), dumps(dict(settings or {})), model,
                 dumps(copy_history), status, time.time() if created_at is None else created_at),
            )
            cid = int(cur.lastrowid or 0)
            for r in runs:
                self.db.execute(
                    "INSERT INTO comparison_runs (comparison_id, side, repeat, position, content, status, error,"
                    " stats, origins, tokens, copy_history_after, rates) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (cid, r.side, r.repeat, r.position, r.content, r.status, r.error, dumps(r.stats),
                     pack_origins(r.origins), pack_tokens(r.tokens), dumps(r.copy_history_after),
                     dumps(None if r.rates is None else [dict(x) for x in r.rates])),
                )
        return self.comparison(cid)

    def comparison(self, comparison_id: int) -> Comparison:
        rows = list(self.db.query("SELECT * FROM comparisons WHERE id = ?", (comparison_id,)))
        if not rows:
            raise NotFoundError(f"no comparison {comparison_id} in {self.path}")
        c = rows[0]
        runs = tuple(
            ComparisonRun(
                side=r["side"], repeat=r["repeat"], position=r["position"], content=r["content"],
                status=r["status"], error=r["error"], stats=loads(r["stats"]),
                origins=unpack_origins(r["origins"]), tokens=unpack_tokens(r["tokens"]),
                copy_history_after=loads(r["copy_history_after"]),
                rates=None if r["rates"] is None else tuple(loads(r["rates"])),
            )
            for r in self.db.query(
                "SELECT * FROM comparison_runs WHERE comparison_id = ? ORDER BY repeat, position", (comparison_id,)
            )
        )
        return Comparison(c["id"], c["conversation_id"], tuple(loads(c["messages"])), loads(c["settings"]) or {},
                          c["model"], loads(c["copy_history"]), c["status"], c["created_at"], runs)

    def comparisons(self, conversation_id: int | None = None, limit: int = 200) -> list[Comparison]:
        """A conversation's comparisons in order, or (None) the newest ``limit`` of all, newest first."""
        if conversation_id is None:
            ids = [r[0] for r in self.db.execute("SELECT id FROM comparisons ORDER BY id DESC LIMIT ?", (limit,))]
        else:
            ids = [r[0] for r in self.db.execute(
                "SELECT id FROM comparisons WHERE conversation_id = ? ORDER BY id", (conversation_id,))]
        return [self.comparison(i) for i in ids]
