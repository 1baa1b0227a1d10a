"""Open Lanes' SQLite file: refuse strangers' files and newer schemas untouched, then migrate.

Every check reads only: nothing is written to a file until it is known to be Lanes' own (or new).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import sqlite_utils

from engine.errors import NewerSchemaError, NotLanesDatabaseError, StoreError
from engine.store.schema import APPLICATION_ID, LATEST, MIGRATIONS

SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 5.0


def _advice(path: Path) -> str:
    return (
        f"Lanes has not changed it. Move it aside and start fresh with `lanes move-aside --data-dir "
        f"{path.parent}`, or choose another folder with --data-dir or LANES_DATA_DIR."
    )


def _inspect(conn: sqlite3.Connection, path: Path) -> int:
    """The file's schema version; raises if the file is not Lanes' or is too new. Reads only."""
    try:
        conn.execute("BEGIN")  # one snapshot: another process may be creating the file right now
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise NotLanesDatabaseError(f"{path} could not be read as a database ({exc}). {_advice(path)}") from exc
    if app_id != APPLICATION_ID:
        if app_id == 0 and version == 0 and tables == 0:
            return 0  # an empty SQLite file: ours to set up
        raise NotLanesDatabaseError(
            f"{path} is an SQLite database that Lanes did not make (application id {app_id:#x}). {_advice(path)}"
        )
    if version > LATEST:
        raise NewerSchemaError(
            f"{path} was made by a newer Lanes (schema version {version}; this Lanes knows up to {LATEST}). "
            f"Update Lanes to open it. {_advice(path)}"
        )
    return version


def _check_header(path: Path) -> None:
    if path.is_dir():
        raise StoreError(f"{path} is a folder, not a database file")
    if path.exists() and path.stat().st_size > 0:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
        if head != SQLITE_HEADER:
            raise NotLanesDatabaseError(f"{path} is not an SQLite database. {_advice(path)}")


def statements(script: str) -> Iterator[str]:
    """Split a script into whole statements (a trigger's inner semicolons do not end it)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            yield buf.strip()
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement: {buf.strip()[:80]}")


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply each pending migration in its own transaction, taking the write lock first so two
    processes opening a new file at once do not both migrate it."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > LATEST:
                raise NewerSchemaError(f"{path} was just upgraded by a newer Lanes (schema {version}).")
            if version == LATEST:
                conn.execute("COMMIT")
                return
            for stmt in statements(MIGRATIONS[version]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # BEGIN itself may be what failed (locked): nothing to undo
                conn.execute("ROLLBACK")
            raise


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (it stays so). The switch needs the file to itself and SQLite reports a
    clash at once instead of waiting, so while another connection is creating the same new file,
    retry until it is in WAL already or the busy timeout has passed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def open_database(path: Path) -> sqlite_utils.Database:
    """Open (creating if needed) and migrate the database at ``path``.

    Raises NotLanesDatabaseError / NewerSchemaError without writing anything, and StoreError when the
    file cannot be created or opened.
    """
    path = Path(path)
    _check_header(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc
    try:
        _inspect(conn, path)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        _use_wal(conn)
        # WAL + NORMAL: a commit survives the process being killed (not a power cut), and costs no fsync.
        conn.execute("PRAGMA synchronous = NORMAL")
        _migrate(conn, path)
        conn.isolation_level = ""  # sqlite-utils wants the driver's default transaction handling
        return sqlite_utils.Database(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"cannot use {path}: {exc}") from exc
    except BaseException:
        conn.close()
        raise


def move_aside(path: Path) -> Path:
    """Rename a database that cannot be used (with its -wal and -shm files) so Lanes can start fresh.

    Returns the new name of the main file; nothing is deleted.
    """
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.moved-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.moved-{stamp}-{n}")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    path.rename(target)
    return target
