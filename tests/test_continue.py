"""Continuing a reply that stopped before its end (the length limit, Stop, a quit): the model is
given the reply so far as the start of its answer, and what it writes next is added to the same
message. Through the real engine and store, checked against mlx-lm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import LanesError
from engine.rounds.engine_thread import Engine
from engine.service.session import ChatSession, ReplySettings
from engine.store.store import Store

pytestmark = pytest.mark.model

QUESTION = "List the planets of the solar system, one per line."


@pytest.fixture
def session(loaded, tmp_path: Path) -> Iterator[ChatSession]:
    with Engine(loader=lambda _spec: loaded, calibrate=False) as engine, Store(tmp_path / "lanes.db") as store:
        engine.info(timeout=60)
        yield ChatSession(store, engine, loaded.name)


def test_a_reply_cut_at_the_length_limit_continues_as_mlx_lm_would(session: ChatSession, loaded, reference) -> None:
    conv = session.new_conversation()
    short = session.ask(conv.id, QUESTION, ReplySettings(max_tokens=12))
    assert short.stats["reason"] == "length" and len(short.tokens) == 12
    reply = session.continue_last(conv.id, ReplySettings(max_tokens=16))
    for _event in reply.events():
        pass
    [_user, whole] = session.store.messages(conv.id)  # the same message, grown: no new one
    assert whole.id == short.id and whole.status == "complete"
    turns = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": short.content}]
    prompt = list(loaded.tokenizer.apply_chat_template(turns, continue_final_message=True))
    more = reference(prompt, 16)
    assert list(whole.tokens) == [*short.tokens, *more[: len(whole.tokens) - 12]]
    assert whole.content == short.content + loaded.tokenizer.decode(list(whole.tokens[12:]))
    assert whole.stats["continued_from"] == 12 and len(whole.origins) == len(whole.tokens)


def test_only_a_reply_with_text_can_be_continued(session: ChatSession) -> None:
    conv = session.new_conversation()
    with pytest.raises(LanesError, match="no reply to continue"):
        session.continue_last(conv.id)
