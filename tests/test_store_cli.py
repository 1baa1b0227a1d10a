"""The store's terminal verbs that need no model, through the real ``lanes`` command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine.store.store import Store

ROOT = Path(__file__).resolve().parent.parent


def lanes(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args, "--data-dir", str(data)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _seed(data: Path) -> tuple[int, int]:
    with Store.open(data) as store:
        old = store.create_conversation(title="Lighthouse notes", created_at=100.0)
        store.add_message(old.id, "user", "Where do lighthouses stand?", created_at=100.0, updated_at=100.0)
        new = store.create_conversation(title="Baking")
        store.add_message(new.id, "user", "How long does a sponge cake bake?")
        store.save_copy_history(new.id, {"context": {"accepted": 1.0, "tested": 2.0}})
        return old.id, new.id


def test_list_and_search(tmp_path: Path) -> None:
    _seed(tmp_path)
    res = lanes(tmp_path, "list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "Baking" in lines[0] and "Lighthouse notes" in lines[1]  # newest first
    res = lanes(tmp_path, "search", "lighthouses")
    assert res.returncode == 0 and "Lighthouse notes" in res.stdout and "[lighthouses]" in res.stdout
    assert "Baking" not in res.stdout
    assert "nothing matches" in lanes(tmp_path, "search", "zeppelin").stdout


def test_delete_removes_the_conversation_and_refuses_unknown_ids_before_deleting(tmp_path: Path) -> None:
    old, new = _seed(tmp_path)
    res = lanes(tmp_path, "delete", str(new), "999")
    assert res.returncode == 2 and "no conversation 999" in res.stderr
    with Store.open(tmp_path) as store:
        assert store.count_conversations() == 2
    assert lanes(tmp_path, "delete", str(new)).returncode == 0
    with Store.open(tmp_path) as store:
        assert [c.id for c in store.list_conversations()] == [old]
        assert store.copy_history(new) is None


def test_recall_settings(tmp_path: Path) -> None:
    old, _ = _seed(tmp_path)
    assert "copies from other" in lanes(tmp_path, "recall").stdout  # on by default
    assert "does not copy" in lanes(tmp_path, "recall", "off").stdout
    assert "can not be recalled" in lanes(tmp_path, "recall", "off", "--conversation", str(old)).stdout
    with Store.open(tmp_path) as store:
        assert store.recall_other_conversations is False and store.conversation(old).recallable is False


def test_a_foreign_file_gets_a_clear_error_and_can_be_moved_aside(tmp_path: Path) -> None:
    db = tmp_path / "lanes.db"
    db.write_text("not a database, but precious\n")
    res = lanes(tmp_path, "list")
    assert res.returncode == 2
    assert str(db) in res.stderr and "move-aside" in res.stderr and "Traceback" not in res.stderr
    assert db.read_text() == "not a database, but precious\n"
    res = lanes(tmp_path, "ask", "hello")  # refused before the model is loaded
    assert res.returncode == 2 and "Loading model" not in res.stderr
    res = lanes(tmp_path, "move-aside")
    assert res.returncode == 0 and "moved" in res.stdout
    (moved,) = tmp_path.glob("lanes.db.moved-*")
    assert moved.read_text() == "not a database, but precious\n"
    assert lanes(tmp_path, "list").returncode == 0
    assert lanes(tmp_path, "move-aside").returncode == 2  # a working database is never moved


def test_asking_in_a_missing_conversation_fails_before_loading_the_model(tmp_path: Path) -> None:
    _seed(tmp_path)
    res = lanes(tmp_path, "ask", "hello", "--conversation", "42")
    assert res.returncode == 2 and "no conversation 42" in res.stderr and "Loading model" not in res.stderr


def test_an_empty_message_is_refused_before_loading_the_model(tmp_path: Path) -> None:
    res = lanes(tmp_path, "ask", "  ")
    assert res.returncode == 2 and "message is empty" in res.stderr and "Loading model" not in res.stderr
    with Store.open(tmp_path) as store:
        assert store.count_conversations() == 0
