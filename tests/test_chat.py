"""``lanes chat`` (what ``make run`` opens until the window lands), driven through its stdin; it saves
every conversation to the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.store.store import Store

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent


def chat(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", "chat", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=600)


def test_chat_answers_keeps_the_conversation_and_exits_cleanly() -> None:
    res = chat("What is the capital of France?\nAnd what language do they speak there?\n/quit\n",
               "--max-tokens", "40")
    assert res.returncode == 0, res.stderr  # also: no abort when the engine thread's MLX streams go
    assert "Paris" in res.stdout
    assert res.stderr.count("tok/s") == 2  # one statistics line per reply
    assert "first token" in res.stderr and ("rows accepted/tested" in res.stderr or "no copied rows" in res.stderr)
    with Store.open() as store:  # saved in the test's own data folder (LANES_DATA_DIR, tests/conftest.py)
        (conv,) = store.list_conversations()
        msgs = store.messages(conv.id)
    assert [m.role for m in msgs] == ["user", "assistant"] * 2 and "Paris" in msgs[1].content
    assert conv.title == "What is the capital of France?"


def test_chat_new_starts_another_conversation_and_conversation_continues_one() -> None:
    assert chat("Say hello.\n/new\nSay goodbye.\n", "--max-tokens", "8").returncode == 0
    with Store.open() as store:
        assert [c.title for c in store.list_conversations()] == ["Say goodbye.", "Say hello."]
        first = store.list_conversations()[1].id
    assert chat("Say hello again.\n", "--max-tokens", "8", "--conversation", str(first)).returncode == 0
    with Store.open() as store:
        assert [m.content for m in store.messages(first) if m.role == "user"] == ["Say hello.", "Say hello again."]


def test_chat_rejects_a_missing_model_clearly(tmp_path: Path) -> None:
    res = chat("hello\n", "--model", str(tmp_path / "nope"))
    assert res.returncode == 2
    assert "nope" in res.stderr and "Traceback" not in res.stderr
