"""A reply's versions: kept by regenerate and edit-and-resend, browsable, exported and imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import NotFoundError
from engine.store.store import Store
from engine.store.transcript import TranscriptError, conversation_to_json, import_conversation


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "lanes.db") as s:
        yield s


def _answered(store: Store, question: str, answer: str) -> tuple[int, int, int]:
    conv = store.create_conversation()
    user = store.add_message(conv.id, "user", question, tokens=[1, 2], tokens_model="m")
    reply = store.add_message(conv.id, "assistant", answer, stats={"reason": "eos"}, origins=["model", "context"],
                              tokens=[7, 8], tokens_model="m")
    return conv.id, user.id, reply.id


def test_a_new_version_keeps_the_reply_aside_and_empties_the_row(store: Store) -> None:
    cid, _user, reply = _answered(store, "Capital of France?", "Paris.")
    assert (store.message(reply).version, store.message(reply).versions) == (1, 1)
    assert store.new_version(reply) == 2
    m = store.message(reply)
    assert (m.content, m.status, m.stats, m.tokens, m.version, m.versions) == ("", "partial", None, None, 2, 2)
    [old] = store.versions(reply)
    assert (old.number, old.prompt, old.content, old.status, old.stats, old.origins, old.tokens) == (
        1, "Capital of France?", "Paris.", "complete", {"reason": "eos"}, ("model", "context"), (7, 8))
    assert [x.id for x in store.messages(cid)] == [_user, reply]  # the same row, in the same place


def test_showing_a_version_swaps_it_with_the_shown_one_and_restores_its_question(store: Store) -> None:
    cid, user, reply = _answered(store, "Capital of France?", "Paris.")
    store.new_version(reply)  # edit and resend: the question changes, a new reply fills version 2
    store.update_message(user, content="Capital of Italy?")
    store.update_message(reply, content="Rome.", status="complete")
    store.show_version(reply, 1)
    assert [(m.content, m.version, m.versions) for m in store.messages(cid)] == [
        ("Capital of France?", 1, 1), ("Paris.", 1, 2)]
    assert store.message(user).tokens is None  # they were the other question's
    [aside] = store.versions(reply)
    assert (aside.number, aside.prompt, aside.content) == (2, "Capital of Italy?", "Rome.")
    store.show_version(reply, 2)
    assert [m.content for m in store.messages(cid)] == ["Capital of Italy?", "Rome."]
    assert store.search("Rome")[0].id == cid  # search reads the shown version
    store.show_version(reply, 2)  # already shown: nothing changes
    with pytest.raises(NotFoundError, match="no version 3"):
        store.show_version(reply, 3)


def test_a_regenerate_after_going_back_numbers_the_new_version_last(store: Store) -> None:
    _cid, _user, reply = _answered(store, "Name a colour.", "Red.")
    store.new_version(reply)
    store.update_message(reply, content="Blue.", status="complete")
    store.show_version(reply, 1)
    assert store.new_version(reply) == 3
    assert [(v.number, v.content) for v in store.versions(reply)] == [(1, "Red."), (2, "Blue.")]


def test_versions_go_with_their_message(store: Store) -> None:
    cid, _user, reply = _answered(store, "Q", "A")
    store.new_version(reply)
    store.delete_message(reply)
    assert store.db.execute("SELECT count(*) FROM message_versions").fetchone()[0] == 0
    _cid2, _u2, reply2 = _answered(store, "Q", "A")
    store.new_version(reply2)
    store.delete_conversation(_cid2)
    assert store.db.execute("SELECT count(*) FROM message_versions").fetchone()[0] == 0
    assert store.messages(cid)[0].content == "Q"


def test_versions_survive_export_and_import(store: Store) -> None:
    cid, user, reply = _answered(store, "Capital of France?", "Paris.")
    store.new_version(reply)
    store.update_message(user, content="Capital of Italy?")
    store.update_message(reply, content="Rome.", status="complete")
    doc = conversation_to_json(store, cid)
    assert doc["version"] == 2
    shown = doc["messages"][1]
    assert (shown["content"], shown["version"]) == ("Rome.", 2)
    assert [(v["number"], v["prompt"], v["content"], v["tokens"]) for v in shown["versions"]] == [
        (1, "Capital of France?", "Paris.", [7, 8])]
    copy = import_conversation(store, doc, "x.json")
    reply_copy = store.messages(copy.id)[1]
    assert (reply_copy.content, reply_copy.version, reply_copy.versions) == ("Rome.", 2, 2)
    store.show_version(reply_copy.id, 1)
    assert [m.content for m in store.messages(copy.id)] == ["Capital of France?", "Paris."]
    assert conversation_to_json(store, cid)["messages"] == doc["messages"]  # the original is untouched


def test_a_first_format_document_reads_as_one_version_and_bad_numbers_are_named(store: Store) -> None:
    old = {"format": "lanes-conversation", "version": 1, "conversation": {},
           "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    conv = import_conversation(store, old, "old.json")
    assert [(m.version, m.versions) for m in store.messages(conv.id)] == [(1, 1), (1, 1)]
    bad = {**old, "messages": [{"role": "assistant", "content": "b", "version": 2,
                                "versions": [{"number": 2, "content": "a"}]}]}
    with pytest.raises(TranscriptError, match=r"bad\.json: messages\[0\]\.versions numbers \[2, 2\]"):
        import_conversation(store, bad, "bad.json")
    zero = {**old, "messages": [{"role": "assistant", "content": "b", "version": 0}]}
    with pytest.raises(TranscriptError, match=r"messages\[0\]\.version must be a whole number from 1"):
        import_conversation(store, zero, "zero.json")
    assert store.count_conversations() == 1  # nothing half-imported


def test_markdown_and_html_exports_show_every_version_with_the_question_it_answered(store: Store) -> None:
    from engine.store.render import conversation_to_html, conversation_to_markdown

    cid, user, reply = _answered(store, "Capital of France?", "Paris.")
    store.new_version(reply)  # regenerate: same question
    store.update_message(reply, content="Paris, on the Seine.", status="complete")
    store.new_version(reply)  # edit and resend
    store.update_message(user, content="Capital of <Italy>?")
    store.update_message(reply, content="Rome.", status="complete")
    md = conversation_to_markdown(store, cid)
    assert "## Assistant · version 3 of 3\n\nRome." in md
    assert "### Version 1 of 3\n\nParis.\n" in md and "### Version 2 of 3\n\nParis, on the Seine." in md
    assert md.count("> Capital of France?") == 2  # each earlier version says what it answered
    page = conversation_to_html(store, cid)
    assert "<h3>Assistant · version 3 of 3</h3>" in page
    assert page.count('<details class="msg version">') == 2
    assert "Answering: Capital of France?" in page and "Capital of &lt;Italy&gt;?" in page
    assert "<Italy>" not in page
