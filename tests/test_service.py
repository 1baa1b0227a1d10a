"""ChatService: replies on their own threads, the store on one thread, and a close that saves and joins."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.events import Tokens
from engine.rounds.engine_thread import Engine
from engine.service.chat_service import ChatService, ReplyBegun, ReplySaved, ServiceEvent
from engine.service.session import ReplySettings

pytestmark = pytest.mark.model


@pytest.fixture
def service(loaded, tmp_path: Path):
    svc = ChatService(tmp_path / "lanes.db", engine_factory=lambda _m: Engine(loader=lambda _s: loaded,
                                                                               calibrate=False))
    yield svc
    svc.close()


def test_two_replies_run_at_once_and_arrive_off_the_callers_thread(service: ChatService) -> None:
    convs = [service.store.submit(lambda s: s.create_conversation().id).result() for _ in range(2)]
    seen: list[tuple[str, ServiceEvent]] = []
    lock = threading.Lock()

    def on_event(ev: ServiceEvent) -> None:
        with lock:
            seen.append((threading.current_thread().name, ev))

    tasks = [service.start_reply(c, "Count from one to ten in words.", ReplySettings(max_tokens=30), on_event)
             for c in convs]
    assert service.generating() <= set(convs)
    saved = [t.done.result(timeout=120) for t in tasks]
    assert all(m.status == "complete" and m.content for m in saved)
    assert saved[0].content == saved[1].content  # same request, same greedy reply
    assert service.generating() == set()
    names = {name for name, _ in seen}
    assert names and all(n.startswith("lanes-reply-") for n in names)
    kinds = [type(ev) for _, ev in seen]
    assert kinds.count(ReplyBegun) == 2 and kinds.count(ReplySaved) == 2 and Tokens in kinds


def test_resend_makes_a_new_version_of_the_reply_and_edit_changes_the_question(service: ChatService) -> None:
    conv = service.store.submit(lambda s: s.create_conversation().id).result()
    settings = ReplySettings(max_tokens=12)
    first = service.start_reply(conv, "Name a colour.", settings, lambda ev: None).done.result(timeout=120)
    again = service.start_reply(conv, None, settings, lambda ev: None, resend=True).done.result(timeout=120)
    assert again.content == first.content and again.created_at > first.created_at
    assert (again.id, again.version, again.versions) == (first.id, 2, 2)
    edited = service.start_reply(conv, "Name a fruit.", settings, lambda ev: None, resend=True).done.result(
        timeout=120)
    msgs = service.store.submit(lambda s: s.messages(conv)).result()
    assert [(m.role, m.content) for m in msgs] == [("user", "Name a fruit."), ("assistant", edited.content)]
    assert (msgs[1].version, msgs[1].versions) == (3, 3)
    aside = service.store.submit(lambda s: s.versions(first.id)).result()
    assert [(v.number, v.prompt, v.content, v.status) for v in aside] == [
        (1, "Name a colour.", first.content, "complete"), (2, "Name a colour.", first.content, "complete")]
    assert aside[0].tokens == first.tokens and aside[0].origins == first.origins


def test_close_mid_reply_saves_it_partial_with_its_copy_history_and_joins(loaded, tmp_path: Path) -> None:
    svc = ChatService(tmp_path / "lanes.db", engine_factory=lambda _m: Engine(loader=lambda _s: loaded,
                                                                              calibrate=False))
    conv = svc.store.submit(lambda s: s.create_conversation().id).result()
    streaming = threading.Event()
    task = svc.start_reply(conv, "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the old river bank."
                           " Then write a long story.",
                           ReplySettings(max_tokens=400),
                           lambda ev: streaming.set() if isinstance(ev, Tokens) and "context" in ev.origins
                           else None)  # close once copying was tried: there is a copy history to keep
    assert streaming.wait(120)
    svc.close()
    assert not task.thread.is_alive()
    saved = task.done.result(timeout=1)
    assert saved.status == "partial" and saved.content  # interrupted, not stopped by the user
    from engine.store.store import Store

    with Store(tmp_path / "lanes.db") as store:
        assert store.message(saved.id).status == "partial"
        assert store.copy_history(conv) is not None
