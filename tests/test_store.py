"""The store's repository on literal data: conversations, messages, copy history, search, Recall rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.errors import NotFoundError
from engine.store import paths
from engine.store.recall import recall_documents
from engine.store.records import ComparisonRun, pack_tokens, unpack_tokens
from engine.store.store import RECALL_SETTING, Store, fts_query


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "lanes.db") as s:
        yield s


def test_the_data_folder_follows_flag_then_environment_then_platform(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("LANES_DATA_DIR", str(tmp_path / "env"))
    assert paths.data_dir(tmp_path / "flag") == tmp_path / "flag"
    assert paths.database_path() == tmp_path / "env" / "lanes.db"
    monkeypatch.delenv("LANES_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert paths.data_dir() == tmp_path / "home" / "Library" / "Application Support" / "Lanes"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert paths.data_dir() == tmp_path / "xdg" / "lanes"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert paths.data_dir() == tmp_path / "home" / ".local" / "share" / "lanes"


def test_tests_never_see_the_users_data_folder() -> None:
    assert "lanes-data" in str(paths.database_path())  # tests/conftest.py points every test elsewhere


def test_messages_keep_their_order_fields_and_touch_the_conversation(store: Store) -> None:
    conv = store.create_conversation(title="Typos", model="m", settings={"max_tokens": 64})
    u = store.add_message(conv.id, "user", "Fix: teh cat", tokens=[5, 6, 7], tokens_model="m")
    a = store.add_message(conv.id, "assistant", "", status="partial")
    store.update_message(a.id, content="the cat", status="complete", origins=["model", "context"],
                         tokens=[8, 9], stats={"generated": 2})
    got = store.messages(conv.id)
    assert [m.id for m in got] == [u.id, a.id]
    assert got[0].tokens == (5, 6, 7) and got[0].tokens_model == "m"
    assert (got[1].content, got[1].status, got[1].origins, got[1].tokens, got[1].stats) == (
        "the cat", "complete", ("model", "context"), (8, 9), {"generated": 2})
    assert store.conversation(conv.id).updated_at >= got[1].updated_at


def test_a_rename_keeps_the_conversations_place_in_the_list(store: Store) -> None:
    old = store.create_conversation(title="Old", updated_at=10.0)
    store.create_conversation(title="New", updated_at=20.0)
    store.update_conversation(old.id, title="Renamed", settings={"max_tokens": 8})
    assert [c.title for c in store.list_conversations()] == ["New", "Renamed"]
    assert store.conversation(old.id).updated_at == 10.0


def test_bad_roles_statuses_and_ids_are_refused(store: Store) -> None:
    conv = store.create_conversation()
    with pytest.raises(ValueError, match="role"):
        store.add_message(conv.id, "robot", "x")
    with pytest.raises(ValueError, match="status"):
        store.add_message(conv.id, "user", "x", status="done")
    with pytest.raises(NotFoundError, match="no conversation 999"):
        store.add_message(999, "user", "x")
    with pytest.raises(NotFoundError, match="no message 999"):
        store.update_message(999, content="x")
    assert store.messages(conv.id) == []


def test_listing_is_newest_first(store: Store) -> None:
    a = store.create_conversation(title="a", created_at=10.0)
    b = store.create_conversation(title="b", created_at=20.0)
    store.add_message(a.id, "user", "later", created_at=30.0, updated_at=30.0)
    assert [(c.title, c.messages) for c in store.list_conversations()] == [("a", 1), ("b", 0)]
    assert store.latest_conversation().id == a.id
    assert [c.title for c in store.list_conversations(limit=1, offset=1)] == ["b"]
    assert b.id != a.id


def test_copy_history_is_kept_per_conversation(store: Store) -> None:
    one, two = store.create_conversation(), store.create_conversation()
    assert store.copy_history(one.id) is None  # a new conversation: the family prior
    store.save_copy_history(one.id, {"context": {"accepted": 5.62, "tested": 7.33}, "recall": {"accepted": 0,
                                                                                               "tested": 1}})
    store.save_copy_history(one.id, {"context": {"accepted": 1.0, "tested": 2.0}})  # replaces, not merges
    assert store.copy_history(one.id) == {"context": {"accepted": 1.0, "tested": 2.0}}
    assert store.copy_history(two.id) is None


def test_deleting_a_conversation_removes_everything_it_owns(store: Store) -> None:
    keep, gone = store.create_conversation(title="keep"), store.create_conversation(title="gone")
    for conv in (keep, gone):
        store.add_message(conv.id, "user", f"lighthouse {conv.title}")
        store.save_copy_history(conv.id, {"context": {"accepted": 1.0, "tested": 1.0}})
        store.add_comparison([{"role": "user", "content": "q"}], [ComparisonRun("on", 0, 0, "a", "complete")],
                             conversation_id=conv.id)
    store.delete_conversation(gone.id)
    count = lambda table: store.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: E731
    assert (count("conversations"), count("messages"), count("copy_history"), count("comparisons"),
            count("comparison_runs")) == (1, 1, 1, 1, 1)
    assert [c.title for c in store.search("lighthouse")] == ["keep"]
    with pytest.raises(NotFoundError):
        store.delete_conversation(gone.id)


def test_a_failed_delete_changes_nothing(store: Store) -> None:
    conv = store.create_conversation()
    store.add_message(conv.id, "user", "stays")
    store.db.execute("CREATE TRIGGER refuse BEFORE DELETE ON copy_history BEGIN SELECT RAISE(ABORT, 'no'); END")
    store.db.execute("INSERT INTO copy_history VALUES (?, 'context', 1, 1, 0)", (conv.id,))
    with pytest.raises(Exception, match="no"):
        store.delete_conversation(conv.id)
    assert [m.content for m in store.messages(conv.id)] == ["stays"]


def test_search_finds_words_and_prefixes_and_keeps_query_syntax_inert(store: Store) -> None:
    a = store.create_conversation(title="ships")
    store.add_message(a.id, "user", "The lighthouse keeper's log, NEAR the rocks")
    b = store.create_conversation(title="cakes")
    store.add_message(b.id, "assistant", "Bake the sponge at 180 degrees")
    assert [c.title for c in store.search("lighthouse")] == ["ships"]
    assert [c.title for c in store.search("light")] == ["ships"]  # prefix of a word
    assert [c.title for c in store.search("sponge degrees")] == ["cakes"]  # every word, any order
    assert store.search("sponge lighthouse") == []
    assert "[lighthouse]" in store.search("lighthouse")[0].snippet
    for hostile in ['"', "NEAR(", "a AND", "*", "rocks OR", ")"]:
        store.search(hostile)  # no FTS5 syntax error leaks out
    assert store.search("   ") == []
    assert fts_query('copy "rates') == '"copy"* "rates"*'


def test_search_sees_a_reply_as_it_grows(store: Store) -> None:
    conv = store.create_conversation()
    msg = store.add_message(conv.id, "assistant", "", status="partial")
    store.update_message(msg.id, content="first words")
    store.update_message(msg.id, content="first words and then albatross")
    assert [c.id for c in store.search("albatross")] == [conv.id]
    assert store.search("albatros first")[0].id == conv.id


def test_token_ids_pack_as_int32_little_endian() -> None:
    assert pack_tokens([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert unpack_tokens(pack_tokens([0, 49151, 2**31 - 1])) == (0, 49151, 2**31 - 1)
    assert pack_tokens(None) is None and unpack_tokens(None) is None


def test_recall_documents_use_stored_ids_and_respect_opt_outs(store: Store) -> None:
    encoded: list[str] = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return [len(w) for w in text.split()]

    a = store.create_conversation()
    store.add_message(a.id, "user", "three word text", tokens=[1, 2, 3], tokens_model="m")
    store.add_message(a.id, "assistant", "other model ids", tokens=[9], tokens_model="other")
    store.add_message(a.id, "assistant", "failed", status="error", tokens=[7], tokens_model="m")
    hidden = store.create_conversation(recallable=False)
    store.add_message(hidden.id, "user", "private", tokens=[4], tokens_model="m")
    docs = recall_documents(store, "m", encode)
    assert docs == {f"c{a.id}": [1, 2, 3, 5, 5, 3]}
    assert encoded == ["other model ids"]  # only the message tokenised for another model
    encoded.clear()
    assert recall_documents(store, "m", encode) == docs and encoded == []  # saved back: no work next time
    assert recall_documents(store, "m") == docs
    other = store.create_conversation()
    store.add_message(other.id, "user", "x", tokens=[8], tokens_model="m")
    assert recall_documents(store, "m", conversation_id=other.id) == {f"c{other.id}": [8]}  # one, not all
    store.set_setting(RECALL_SETTING, False)
    assert recall_documents(store, "m", encode) == {}


def test_settings_round_trip(store: Store) -> None:
    assert store.setting("missing", 3) == 3
    store.set_setting("theme", {"dark": True})
    store.set_setting("theme", {"dark": False})
    assert store.setting("theme") == {"dark": False}
    assert store.recall_other_conversations is True


def test_a_comparison_keeps_every_run_in_order(store: Store) -> None:
    conv = store.create_conversation()
    runs = [ComparisonRun("off", 0, 0, "x", "complete", tokens=(1, 2), origins=("model", "context"),
                          stats={"tokens_per_s": 40.0}),
            ComparisonRun("on", 0, 1, "x", "complete", rates=({"round": 3, "source": "context", "rate": 0.9},)),
            ComparisonRun("on", 1, 0, "x", "error", error="boom"),
            ComparisonRun("off", 1, 1, "", "cancelled")]
    saved = store.add_comparison([{"role": "user", "content": "q"}], runs, conversation_id=conv.id,
                                 settings={"repeats": 2}, model="m", copy_history={"context": {"accepted": 1.0,
                                                                                               "tested": 2.0}})
    assert saved.runs == tuple(runs)
    assert (saved.settings, saved.model, saved.copy_history["context"]["tested"]) == ({"repeats": 2}, "m", 2.0)
    assert [c.id for c in store.comparisons(conv.id)] == [saved.id] == [c.id for c in store.comparisons()]
    with pytest.raises(Exception, match="UNIQUE"):
        store.add_comparison([], [runs[0], runs[0]])
    assert len(store.comparisons()) == 1  # the failed save left nothing behind
