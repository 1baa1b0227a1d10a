"""Faults around a reply, on the scripted engine: a broken callback, an emptied resend, a model switch
racing the close."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.errors import LanesError
from engine.events import Tokens
from engine.service.chat_service import ChatService
from engine.service.comparisons import build_spec
from engine.service.session import ChatSession, ReplySettings
from engine.store.store import RECALL_SETTING, Store
from tests.fake_engine import FakeEngine


def test_a_reply_that_breaks_outside_the_engine_is_stopped_and_kept_as_an_error(tmp_path: Path) -> None:
    engines: list[FakeEngine] = []
    svc = ChatService(tmp_path / "lanes.db",
                      engine_factory=lambda m: engines.append(FakeEngine(m, delay=0.002)) or engines[-1])
    conv = svc.store.submit(lambda s: s.create_conversation().id).result()
    seen = 0

    def on_event(ev: object) -> None:
        nonlocal seen
        if isinstance(ev, Tokens):
            seen += 1
            if seen == 40:
                raise RuntimeError("the window went away")

    task = svc.start_reply(conv, "SLOW words", ReplySettings(), on_event)
    with pytest.raises(RuntimeError, match="went away"):
        task.done.result(timeout=30)
    handle = engines[0]._handles[0]
    assert handle.cancelled.is_set()  # the stream was stopped, not left generating
    svc.close()
    with Store(tmp_path / "lanes.db") as store:
        reply = store.messages(conv)[-1]
    assert reply.status == "error" and "went away" in reply.error
    assert len(reply.content) >= 100  # what had streamed, not the last half-second save


def test_an_empty_edit_deletes_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store, FakeEngine() as engine:
        session = ChatSession(store, engine, "Fake-Echo")
        conv = session.new_conversation()
        session.ask(conv.id, "hello")
        with pytest.raises(LanesError, match="empty"):
            session.resend(conv.id, "   ")
        assert [m.content for m in store.messages(conv.id)] == ["hello", "Echo: hello"]


def test_a_model_switch_racing_the_close_leaves_no_engine_running(tmp_path: Path) -> None:
    engines: list[FakeEngine] = []
    lock = threading.Lock()

    def factory(model: str | None) -> FakeEngine:
        with lock:
            engines.append(FakeEngine(model))
            return engines[-1]

    svc = ChatService(tmp_path / "lanes.db", engine_factory=factory)
    svc.switch_model(None)  # on the model thread, racing the close below
    svc.close()
    assert all(e.closed for e in engines), [e.model for e in engines if not e.closed]


def test_a_comparison_follows_the_recall_setting_and_skips_its_own_conversation(tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store:
        conv = store.create_conversation()
        store.add_message(conv.id, "user", "q")
        spec = build_spec(store, conversation_id=conv.id)
        assert (spec.recall, spec.exclude) == (True, conv.key)
        assert spec.request("on").recall_exclude == conv.key and spec.request("on").conversation is None
        store.set_setting(RECALL_SETTING, False)
        assert build_spec(store, prompt="x").request("off").recall is False
