"""The schema: frozen copies, migrations from the first version, and files Lanes must not touch."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from engine.errors import NewerSchemaError, NotLanesDatabaseError, StoreError
from engine.store.db import MigrationError, move_aside
from engine.store.schema import APPLICATION_ID, LATEST
from engine.store.store import Store
from tests.store_schema import dump_schema

DATA = Path(__file__).parent / "data"


def test_a_new_database_matches_the_frozen_schema(tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store:
        assert dump_schema(store.db.conn) == (DATA / "schema.sql").read_text(), (
            "schema changed: add a migration, then refresh tests/data/schema.sql (see tests/store_schema.py)"
        )


def test_connection_settings(tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store:
        pragma = lambda name: store.db.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("busy_timeout") >= 1000
        assert pragma("user_version") == LATEST


def _first_version_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript((DATA / "schema-v1.sql").read_text())
    conn.executescript("""
        INSERT INTO conversations VALUES (1, 'Old chat', 'SmolLM2', 'Be brief.', '{"max_tokens":64}', 0, 100.0, 200.0);
        INSERT INTO messages (id, conversation_id, role, content, status, created_at, updated_at)
            VALUES (1, 1, 'user', 'Where do lighthouses stand?', 'complete', 100.0, 100.0),
                   (2, 1, 'assistant', 'On rocky headlands.', 'partial', 150.0, 200.0);
        INSERT INTO copy_history VALUES (1, 'context', 3.5, 4.0, 200.0);
        INSERT INTO settings VALUES ('recall_other_conversations', 'false');
    """)
    conn.commit()
    conn.close()


def test_a_first_version_database_is_upgraded_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    _first_version_db(path)
    with Store(path) as store:
        assert dump_schema(store.db.conn) == (DATA / "schema.sql").read_text()
        conv = store.conversation(1)
        assert (conv.title, conv.system_prompt, conv.settings, conv.recallable) == (
            "Old chat", "Be brief.", {"max_tokens": 64}, False)
        assert [(m.role, m.content, m.status) for m in store.messages(1)] == [
            ("user", "Where do lighthouses stand?", "complete"), ("assistant", "On rocky headlands.", "partial")]
        assert store.copy_history(1) == {"context": {"accepted": 3.5, "tested": 4.0}}
        assert store.recall_other_conversations is False
        # v2 indexed the rows that were already there; v3's tables work.
        assert [s.id for s in store.search("headlands")] == [1]
        assert store.add_comparison([{"role": "user", "content": "hi"}], [], conversation_id=1).conversation_id == 1


def test_an_upgrade_first_copies_the_file_through_the_backup_api(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    _first_version_db(path)
    Store(path).close()
    (backup,) = tmp_path.glob("lanes.db.backup-v1-*")
    conn = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("SELECT content FROM messages ORDER BY id").fetchall() == [
        ("Where do lighthouses stand?",), ("On rocky headlands.",)]
    conn.close()
    Store(path).close()  # already upgraded: no second copy
    assert len(list(tmp_path.glob("lanes.db.backup-*"))) == 1
    assert not list(tmp_path.glob("lanes.db.backup-*-wal"))


def test_a_failed_upgrade_leaves_the_file_as_it_was_and_names_the_backup(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    _first_version_db(path)
    conn = sqlite3.connect(path)  # a table in the way of migration 3 (its CREATE TABLE fails)
    conn.execute("CREATE TABLE comparisons (x)")
    conn.commit()
    dump = "\n".join(conn.iterdump())
    conn.close()
    with pytest.raises(MigrationError, match=r"from schema version 1 to .*as it was.*backup-v1-") as err:
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1  # migration 2 was undone with 3
    assert "\n".join(conn.iterdump()) == dump
    conn.close()
    (backup,) = tmp_path.glob("lanes.db.backup-v1-*")
    assert str(backup) in str(err.value)


def _untouched(path: Path, content: bytes) -> None:
    assert path.read_bytes() == content
    assert not path.with_name(path.name + "-wal").exists()


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    content = b"my shopping list: eggs, milk\n" * 50
    path.write_bytes(content)
    with pytest.raises(NotLanesDatabaseError, match=r"lanes\.db is not an SQLite database.*move-aside"):
        Store(path)
    _untouched(path, content)


def test_someone_elses_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    content = path.read_bytes()
    with pytest.raises(NotLanesDatabaseError, match="Lanes did not make"):
        Store(path)
    _untouched(path, content)


def test_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.execute("PRAGMA journal_mode = DELETE")  # fold the WAL in, so the bytes below are the whole database
    conn.close()
    content = path.read_bytes()
    with pytest.raises(NewerSchemaError, match=rf"schema version {LATEST + 1}; this Lanes knows up to {LATEST}"):
        Store(path)
    _untouched(path, content)


def test_move_aside_keeps_the_file_and_its_side_files_and_lets_lanes_start_fresh(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    path.write_bytes(b"not a database")
    (tmp_path / "lanes.db-wal").write_bytes(b"an old WAL")
    (tmp_path / "lanes.db-shm").write_bytes(b"an old index")
    moved = move_aside(path)
    assert moved.name.startswith("lanes.db.moved-") and moved.parent == tmp_path
    assert moved.read_bytes() == b"not a database" and not path.exists()
    assert moved.with_name(moved.name + "-wal").read_bytes() == b"an old WAL"
    assert moved.with_name(moved.name + "-shm").read_bytes() == b"an old index"
    assert not (tmp_path / "lanes.db-wal").exists() and not (tmp_path / "lanes.db-shm").exists()
    with Store(path) as store:
        assert store.count_conversations() == 0
    path.unlink()
    for side in ("-wal", "-shm"):
        path.with_name(path.name + side).unlink(missing_ok=True)
    path.write_bytes(b"damaged again")
    again = move_aside(path)
    assert again != moved and again.read_bytes() == b"damaged again" and moved.read_bytes() == b"not a database"


def test_a_move_aside_that_fails_half_way_puts_back_what_it_moved(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "lanes.db"
    path.write_bytes(b"damaged")
    (folder / "lanes.db-wal").write_bytes(b"its WAL")
    (folder / "lanes.db.moved-x").mkdir()  # not a clash of names: a clash of the main file's rename
    import engine.store.db as db

    real_rename = Path.rename

    def rename(self: Path, target: Path) -> Path:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_rename(self, target)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "rename", rename)
        with pytest.raises(PermissionError):
            db.move_aside(path)
    assert path.read_bytes() == b"damaged" and (folder / "lanes.db-wal").read_bytes() == b"its WAL"


def test_an_empty_file_becomes_a_lanes_database(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    path.touch()
    with Store(path) as store:
        assert store.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


def test_a_folder_in_the_way_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "lanes.db").mkdir()
    with pytest.raises(StoreError, match="is a folder"):
        Store(tmp_path / "lanes.db")


def _open_when_told(path: str, go: object, errors: object) -> None:
    go.wait()  # type: ignore[attr-defined]
    try:
        Store(Path(path)).close()
    except Exception as exc:  # reported to the parent, asserted there
        errors.put(repr(exc))  # type: ignore[attr-defined]


def test_processes_creating_the_database_at_once_all_succeed(tmp_path: Path) -> None:
    # Migrating and switching to WAL race here; the switch reports "locked" at once instead of
    # waiting on the busy timeout (seen: 2 attempts in 10 failed before engine/store/db.py _use_wal).
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(4):
        path = tmp_path / f"try{attempt}" / "lanes.db"
        go, errors = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_open_when_told, args=(str(path), go, errors)) for _ in range(6)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # let every process import and wait at the line
        go.set()
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs)
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        assert failures == [], failures
        with Store(path) as store:
            assert store.db.execute("PRAGMA user_version").fetchone()[0] == LATEST
            assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
