"""I/O errors under a streaming reply: the data folder on a small tmpfs that fills up mid-reply.

The reply in progress ends with an error (the window is told), nothing committed before is lost, and
once there is room again the same service answers, and a fresh start opens the file.
"""

from __future__ import annotations

import errno
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.events import Tokens
from engine.service.chat_service import ChatService
from engine.service.session import ReplySettings
from engine.store.store import Store
from tests.fake_engine import FakeEngine


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of this test's own (needs root, as CI and the dev machines run)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): run as root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(folder: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to make room again)."""
    filler = folder / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_mid_reply_fails_that_reply_and_loses_nothing_committed(small_disk: Path) -> None:
    db = small_disk / "lanes.db"
    svc = ChatService(db, engine_factory=lambda m: FakeEngine(m, delay=0.002))
    try:
        before = []
        for i in range(3):
            conv = svc.store.submit(lambda s: s.create_conversation().id).result()
            before.append(svc.start_reply(conv, f"kept {i}", ReplySettings(), lambda _e: None).done.result(30))
        conv = svc.store.submit(lambda s: s.create_conversation().id).result()
        streamed = threading.Event()
        streaming = svc.start_reply(conv, "SLOW and long " * 20, ReplySettings(),
                                    lambda e: streamed.set() if isinstance(e, Tokens) else None)
        assert streamed.wait(30)
        filler = fill(small_disk)
        with pytest.raises(Exception, match="full"):
            streaming.done.result(60)
        filler.unlink()
        again = svc.start_reply(before[0].conversation_id, "room again", ReplySettings(), lambda _e: None)
        assert again.done.result(30).content == "Echo: room again"
    finally:
        svc.close()
    with Store(db) as store:  # the next start
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for m in before:
            kept = store.message(m.id)
            assert (kept.status, kept.content) == ("complete", m.content)
        cut = store.messages(conv)[-1]
        assert cut.role == "assistant" and cut.status in ("partial", "error")
        assert ("Echo: " + "SLOW and long " * 20 * 200).startswith(cut.content)
