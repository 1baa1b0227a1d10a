"""``lanes chat`` (what ``make run`` opens until the window lands), driven through its stdin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
    assert "copied rows accepted/tested" in res.stderr


def test_chat_rejects_a_missing_model_clearly(tmp_path: Path) -> None:
    res = chat("hello\n", "--model", str(tmp_path / "nope"))
    assert res.returncode == 2
    assert "nope" in res.stderr and "Traceback" not in res.stderr
