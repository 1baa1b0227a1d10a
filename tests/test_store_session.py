"""The store wired to the real engine: replies saved as they grow, copy history and Recall carried
across conversations and processes, and a reply killed mid-way (SIGKILL) losing at most a second."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine.events import Tokens
from engine.rounds.engine_thread import Engine
from engine.service.session import ChatSession, ReplySettings
from engine.store.store import Store

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent
RECALL_PROMPT = "Write a short poem about the sea."  # its reply is nowhere in the prompt: only Recall can copy it
COPY_PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the old river bank."


@pytest.fixture
def engine(loaded) -> Iterator[Engine]:
    eng = Engine(loader=lambda _spec: loaded, calibrate=False)
    eng.info(timeout=60)
    yield eng
    eng.close()


@pytest.fixture
def session(engine: Engine, loaded, tmp_path: Path) -> Iterator[ChatSession]:
    with Store(tmp_path / "lanes.db") as store:
        yield ChatSession(store, engine, loaded.name)


def test_a_stored_conversation_replies_exactly_like_mlx_lm_and_is_saved(session: ChatSession, loaded,
                                                                       reference) -> None:
    settings = ReplySettings(max_tokens=24)
    conv = session.new_conversation(system_prompt="You are terse.", settings=settings)
    first = session.ask(conv.id, COPY_PROMPT, settings)  # copies from its prompt: a copy history to carry
    after_first = session.store.copy_history(conv.id)
    second = session.ask(conv.id, "And what is the capital of Italy?", settings)
    turns = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": COPY_PROMPT},
             {"role": "assistant", "content": first.content},
             {"role": "user", "content": "And what is the capital of Italy?"}]
    prompt = list(loaded.tokenizer.apply_chat_template(turns, add_generation_prompt=True))
    assert list(second.tokens) == reference(prompt, 24)  # the store's history is the prompt mlx-lm sees
    stored = session.store.messages(conv.id)
    assert [(m.role, m.status) for m in stored] == [("user", "complete"), ("assistant", "complete")] * 2
    assert stored[0].tokens == tuple(loaded.tokenizer.encode(COPY_PROMPT, add_special_tokens=False))
    assert len(second.origins) == len(second.tokens) == second.stats["generated"]
    assert second.tokens_model == loaded.name
    assert first.stats["copy_history_before"] is None  # a new conversation starts from the family prior
    assert after_first is not None and second.stats["copy_history_before"] == after_first
    assert session.store.conversation(conv.id).title == COPY_PROMPT[:59] + "…"


def test_recall_copies_from_another_conversation_until_it_opts_out(session: ChatSession) -> None:
    settings = ReplySettings(max_tokens=60)
    a = session.new_conversation()
    original = session.ask(a.id, RECALL_PROMPT, settings)
    b = session.new_conversation()
    again = session.ask(b.id, RECALL_PROMPT, settings)
    assert again.tokens == original.tokens
    assert again.stats["rows"]["recall"]["accepted"] > 0  # copied from conversation a's saved reply
    assert "recall" in again.origins
    session.set_recallable(a.id, False)
    session.set_recallable(b.id, False)
    c = session.new_conversation()
    alone = session.ask(c.id, RECALL_PROMPT, settings)
    assert alone.tokens == original.tokens
    assert alone.stats["rows"]["recall"]["tested"] == 0 and "recall" not in alone.origins
    session.delete_conversation(c.id)  # c's reply is gone from Recall too
    d = session.new_conversation()
    assert session.ask(d.id, RECALL_PROMPT, settings).stats["rows"]["recall"]["tested"] == 0
    session.delete_conversation(d.id)
    session.set_recallable(a.id, True)  # back in: Recall copies from it again
    e = session.new_conversation()
    assert session.ask(e.id, RECALL_PROMPT, settings).stats["rows"]["recall"]["accepted"] > 0


def test_a_cancelled_reply_keeps_its_text_and_copy_history(session: ChatSession) -> None:
    conv = session.new_conversation()
    reply = session.begin(conv.id, COPY_PROMPT + " Then write a long story.", ReplySettings(max_tokens=400))
    for event in reply.events():
        if isinstance(event, Tokens) and "context" in event.origins:
            reply.cancel()  # once copying has been tried: there is a copy history to keep
    saved = session.store.message(reply.message_id)
    assert saved.status == "cancelled" and saved.content == reply.text and saved.content
    assert saved.stats["reason"] == "cancelled" and saved.stats["generated"] < 400
    history = session.store.copy_history(conv.id)
    assert history is not None and sum(h["tested"] for h in history.values()) > 0


# -- across processes ------------------------------------------------------------------------------
def lanes(data: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "engine.cli", *args, "--data-dir", str(data)], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res


def test_copy_history_and_recall_carry_across_processes(tmp_path: Path) -> None:
    lanes(tmp_path, "ask", COPY_PROMPT, "--max-tokens", "60")
    with Store.open(tmp_path) as store:
        saved = store.copy_history(1)
    assert saved is not None and sum(h["tested"] for h in saved.values()) > 0  # e.g. "context", "context.short"
    res = lanes(tmp_path, "ask", "Say it once more.", "--conversation", "1", "--max-tokens", "40")
    assert "tok/s" in res.stderr and "first token" in res.stderr
    lanes(tmp_path, "ask", RECALL_PROMPT, "--new", "--max-tokens", "60")
    lanes(tmp_path, "ask", RECALL_PROMPT, "--new", "--max-tokens", "60")
    with Store.open(tmp_path) as store:
        second, poem, fresh = store.messages(1)[3], store.messages(2)[1], store.messages(3)[1]
        assert second.stats["copy_history_before"] == saved  # the next process started from it
        assert store.copy_history(1) != saved  # and saved its own
        assert fresh.stats["copy_history_before"] is None  # a new conversation: the family prior
        assert fresh.stats["rows"]["recall"]["accepted"] > 0  # Recall loaded from the stored token ids
        assert fresh.content == poem.content


def test_sigkill_mid_reply_loses_at_most_the_last_second(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        conv = store.create_conversation(title="earlier")
        for i in range(3):
            store.add_message(conv.id, "user", f"question {i}")
            store.add_message(conv.id, "assistant", f"answer {i} " * 20)
        earlier = store.messages(conv.id)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "ask", "Write a long story about a lighthouse keeper and a storm.",
         "--conversation", str(conv.id), "--max-tokens", "1500", "--data-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    printed: list[tuple[float, bytes]] = []

    def read() -> None:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 4096):
            printed.append((time.monotonic(), chunk))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (printed and time.monotonic() - printed[0][0] > 3.0):
            assert proc.poll() is None, "the reply ended before it could be killed"
            time.sleep(0.05)
        assert printed, "no reply within 300 s"
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    shown = b"".join(c for _, c in printed).decode(errors="ignore")
    shown_a_second_before = b"".join(c for t, c in printed if t <= killed_at - 1.0).decode(errors="ignore")

    conn = sqlite3.connect(tmp_path / "lanes.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with Store.open(tmp_path) as store:
        after = store.messages(conv.id)
    # Every committed message unchanged (Recall's load may have added their token ids).
    assert [replace(m, tokens=None, tokens_model=None) for m in after[: len(earlier)]] == earlier
    user, reply = after[len(earlier):]
    assert user.content.startswith("Write a long story") and user.status == "complete"
    assert reply.status == "partial"
    assert shown.startswith(reply.content)  # what was saved is what was shown...
    assert reply.content.startswith(shown_a_second_before.rstrip())  # ...up to the last second at most
    assert len(reply.content) > 0


def test_a_replys_end_is_committed_with_a_sync_and_its_progress_without(tmp_path: Path) -> None:
    """What SQLite runs, as its trace shows: progress saves under synchronous NORMAL (no sync per
    save), the commit that ends the reply under FULL (the WAL synced before the window shows it)."""
    from tests.fake_engine import FakeEngine

    with Store(tmp_path / "lanes.db") as store, FakeEngine(delay=0.01) as engine:
        session = ChatSession(store, engine, "Fake-Echo")
        conv = session.new_conversation()
        ran: list[str] = []
        store.db.conn.set_trace_callback(lambda sql: ran.append(" ".join(sql.split())))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("engine.service.session.SAVE_EVERY_S", 0.0)  # a progress save for every event
            session.ask(conv.id, "durable " * 10)
        store.db.conn.set_trace_callback(None)
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL again
    def level_at(i: int) -> str:
        sets = [sql for sql in ran[:i] if sql.startswith("PRAGMA synchronous =")]
        return sets[-1].rsplit("=", 1)[1].strip() if sets else "NORMAL"

    progress = [i for i, sql in enumerate(ran) if sql.startswith("UPDATE messages SET content =")
                and ", status = " not in sql]
    end = max(i for i, sql in enumerate(ran) if sql.startswith("UPDATE messages SET") and "status = 'complete'" in sql)
    commit = next(i for i in range(end, len(ran)) if ran[i] == "COMMIT")
    assert progress and {level_at(i) for i in progress} == {"NORMAL"}
    assert level_at(end) == level_at(commit) == "FULL"
    assert level_at(len(ran)) == "NORMAL"
