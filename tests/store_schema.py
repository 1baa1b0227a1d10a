"""The schema as text, for the frozen copies in tests/data/.

Refresh after adding a migration (then read the diff):
    .venv/bin/python -m tests.store_schema > tests/data/schema.sql
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path


def dump_schema(conn: sqlite3.Connection) -> str:
    rows = conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name").fetchall()
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    head = f"-- user_version {version}, application_id {app_id:#x}\n"
    return head + "".join(f"{sql};\n" for (sql,) in rows)


if __name__ == "__main__":
    from engine.store.store import Store

    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "lanes.db") as store:
        sys.stdout.write(dump_schema(store.db.conn))
