"""Open Lanes' SQLite file: refuse strangers' files and newer schemas untouched, then migrate.

Every check reads only, and only through SQLite: nothing is written to a file until it is known to be
Lanes' own (or new). The file is never opened outside SQLite while the process may hold a connection
to it: on POSIX, closing *any* descriptor of a file drops every advisory lock the process holds on it,
SQLite's included, and another process that then believes it is the last user checkpoints and deletes
the WAL under the live connection ("How To Corrupt An SQLite Database File", 2.2). That is how
``lanes list`` beside an open window once lost every chat.

Durability (docs/store.md): WAL with ``synchronous = NORMAL`` for the writes a reply makes while it
streams (a commit survives the process being killed; a power cut may lose the last ones), and
``synchronous = FULL`` for the commit that ends a reply (``Store.durable()``: the WAL is synced before
the window shows it complete). On macOS ``fullfsync`` makes those syncs reach the drive's platters.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import sqlite_utils

from engine.errors import NewerSchemaError, NotLanesDatabaseError, StoreError
from engine.store.schema import APPLICATION_ID, LATEST, MIGRATIONS

BUSY_TIMEOUT_S = 5.0


def _advice(path: Path) -> str:
    return (
        f"Lanes has not changed it. Move it aside and start fresh with `lanes move-aside --data-dir "
        f"{path.parent}`, or choose another folder with --data-dir or LANES_DATA_DIR."
    )


def _inspect(conn: sqlite3.Connection, path: Path) -> int:
    """The file's schema version; raises if the file is not Lanes' or is too new. Reads only, through
    SQLite (which reads the header first and says "file is not a database" for anything else)."""
    try:
        conn.execute("BEGIN")  # one snapshot: another process may be creating the file right now
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        if "file is not a database" in str(exc):
            raise NotLanesDatabaseError(f"{path} is not an SQLite database. {_advice(path)}") from exc
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


class MigrationError(StoreError):
    """A migration failed; the file is as it was before it (names the backup)."""


def backup_path(path: Path, version: int) -> Path:
    """Where the copy made before migrating from ``version`` goes: beside the file, dated."""
    return _free_name(path.with_name(f"{path.name}.backup-v{version}-{time.strftime('%Y%m%d-%H%M%S')}"))


def _backup(conn: sqlite3.Connection, target: Path) -> None:
    """A consistent copy of the database through SQLite's backup API (never a file copy: that would
    open the file outside SQLite and could copy it half-written)."""
    dest = sqlite3.connect(target)
    try:
        conn.backup(dest)
        dest.execute("PRAGMA journal_mode = DELETE")  # one self-contained file, no -wal beside it
    finally:
        dest.close()


def _migrate(conn: sqlite3.Connection, path: Path) -> Path | None:
    """Apply every pending migration in one transaction, taking the write lock first so two processes
    opening an old file at once do not both migrate it. A file with data is first copied through the
    backup API; a migration that fails rolls back, leaving the file as it was, and says where that copy
    is. Returns the backup's path (None when nothing was migrated or the file was new).

    The copy is made before the write lock (the backup API cannot read through this connection's own
    write transaction); ``PRAGMA data_version`` then tells whether another process committed in
    between, and if so the copy is made again, so it always holds what the migration started from.
    """
    backup: Path | None = None
    while True:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == LATEST or version > LATEST:
            break
        seen = conn.execute("PRAGMA data_version").fetchone()[0]
        if version > 0 and backup is None:
            backup = backup_path(path, version)
        if backup is not None:
            _backup(conn, backup)
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("PRAGMA data_version").fetchone()[0] == seen:
            break
        conn.execute("ROLLBACK")  # someone wrote after the copy: copy again
    if not conn.in_transaction:
        if version > LATEST:
            raise NewerSchemaError(f"{path} was just upgraded by a newer Lanes (schema {version}).")
        _drop_stale(backup)
        return None
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version >= LATEST:  # another process migrated it while this one copied
            conn.execute("COMMIT")
            _drop_stale(backup)
            if version > LATEST:
                raise NewerSchemaError(f"{path} was just upgraded by a newer Lanes (schema {version}).")
            return None
        for v in range(version, LATEST):
            for stmt in statements(MIGRATIONS[v]):
                conn.execute(stmt)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {LATEST}")
        conn.execute("COMMIT")
        return backup
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if backup is not None and isinstance(exc, sqlite3.Error | ValueError):
            raise MigrationError(
                f"could not upgrade {path} from schema version {version} to {LATEST} ({exc}); the file is as "
                f"it was, and a copy made before the upgrade is at {backup}"
            ) from exc
        raise


def _drop_stale(backup: Path | None) -> None:
    """A copy made for a migration that another process did first: it is not needed (it is a
    separate file of ours that no connection holds, so removing it is safe)."""
    if backup is not None:
        backup.unlink(missing_ok=True)


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


def _durability(conn: sqlite3.Connection) -> None:
    # WAL + NORMAL: a commit survives the process being killed (not a power cut) and costs no sync;
    # Store.durable() raises it to FULL for the commits that must survive a power cut too.
    conn.execute("PRAGMA synchronous = NORMAL")
    if sys.platform == "darwin":  # plain fsync leaves the data in the drive's cache there
        conn.execute("PRAGMA fullfsync = ON")
        conn.execute("PRAGMA checkpoint_fullfsync = ON")


def open_database(path: Path) -> sqlite_utils.Database:
    """Open (creating if needed) and migrate the database at ``path``.

    Raises NotLanesDatabaseError / NewerSchemaError without writing anything, MigrationError (naming
    the backup) when an upgrade failed and was undone, and StoreError when the file cannot be created
    or opened.
    """
    path = Path(path)
    if path.is_dir():
        raise StoreError(f"{path} is a folder, not a database file")
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
        _durability(conn)
        _migrate(conn, path)
        conn.isolation_level = ""  # sqlite-utils wants the driver's default transaction handling
        return sqlite_utils.Database(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"cannot use {path}: {exc}") from exc
    except BaseException:
        conn.close()
        raise


SIDE_FILES = ("-wal", "-shm", "-journal")


def _free_name(target: Path) -> Path:
    n, base = 1, target
    while target.exists() or any(target.with_name(target.name + s).exists() for s in SIDE_FILES):
        n += 1
        target = base.with_name(f"{base.name}-{n}")
    return target


def move_aside(path: Path) -> Path:
    """Rename a database that cannot be used, with its -wal, -shm and -journal files, to a dated name
    beside it (``lanes.db.moved-20261202-103000``) so Lanes can start fresh. Nothing is deleted or
    opened: only renamed, side files first (a fresh database must never find an old WAL beside it),
    and every rename is undone if a later one fails. Returns the new name of the main file.
    """
    path = Path(path)
    target = _free_name(path.with_name(f"{path.name}.moved-{time.strftime('%Y%m%d-%H%M%S')}"))
    done: list[tuple[Path, Path]] = []
    try:
        for suffix in SIDE_FILES:
            side = path.with_name(path.name + suffix)
            if side.exists():
                side.rename(target.with_name(target.name + suffix))
                done.append((side, target.with_name(target.name + suffix)))
        path.rename(target)
    except OSError:
        for old, new in reversed(done):
            new.rename(old)
        raise
    return target
