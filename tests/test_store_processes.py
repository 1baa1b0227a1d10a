"""The store under several processes and kills: real processes on a real file, no mocks of SQLite.

A writer child (tests/store_writer.py) stands for the window: one long-lived Store writing replies.
Beside it run the CLI's commands, a second writer, or a SIGKILL at a random moment; afterwards the
file passes ``integrity_check`` and every reply the writer reported committed is there, whole.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.store.store import Store

ROOT = Path(__file__).resolve().parent.parent


class Writer:
    """A running tests/store_writer.py; ``committed`` fills as it reports replies."""

    def __init__(self, db: Path, *args: str) -> None:
        self._err = db.with_name(f"writer-{time.monotonic_ns()}.err")
        with self._err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.store_writer", str(db), *args], cwd=ROOT,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        self.committed: list[tuple[int, int, int, int]] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="writer-stdout")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("committed "):
                conv, user, reply, n = map(int, line.split()[1:])
                self.committed.append((conv, user, reply, n))

    def wait_for(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.committed) < n:
            assert self.proc.poll() is None, f"the writer died: {self.stderr()}"
            assert time.monotonic() < deadline, f"the writer committed {len(self.committed)} of {n} replies"
            time.sleep(0.02)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.finish()

    def finish(self, timeout: float = 60.0) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc

    def stderr(self) -> str:
        return self._err.read_text()[-2000:]


@pytest.fixture
def writers() -> Iterator[list[Writer]]:
    started: list[Writer] = []
    yield started
    for w in started:  # a failed test must not leave a writer (or its reader thread) behind
        if w.proc.poll() is None:
            w.kill()
        w.finish()


def check(db: Path, committed: list[tuple[int, int, int, int]]) -> None:
    """The file is sound and holds every reply reported committed, complete and whole."""
    with Store(db) as store:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for conv, user, reply, n in committed:
            messages = {m.id: m for m in store.messages(conv)}
            assert messages[user].role == "user"
            assert messages[reply].status == "complete" and len(messages[reply].content) == n, (conv, reply)


def lanes(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.model
def test_the_windows_store_survives_other_processes_then_a_kill(tmp_path: Path, writers: list[Writer]) -> None:
    db = tmp_path / "lanes.db"
    w = Writer(db)
    writers.append(w)
    w.wait_for(2)
    data = ["--data-dir", str(tmp_path)]
    for i in range(3):
        assert lanes("list", *data).returncode == 0
        assert lanes("search", "echo", *data).returncode == 0
        conv = w.committed[-1][0]
        for fmt in ("md", "json"):
            out = tmp_path / f"export-{i}.{fmt}"
            done = lanes("export", str(conv), "--format", fmt, "-o", str(out), *data)
            assert done.returncode == 0, done.stderr
        assert lanes("import", str(tmp_path / f"export-{i}.json"), *data).returncode == 0
    for _ in range(2):  # the CLI's own replies, with the real model, beside the window's
        done = lanes("ask", "Say hi.", "--new", "--max-tokens", "3", *data)
        assert done.returncode == 0, done.stderr
    before = len(w.committed)
    w.wait_for(before + 3)  # still writing after all that: its WAL was not pulled from under it
    w.kill()
    check(db, w.committed)
    with Store(db) as store:
        imported = [c for c in store.list_conversations(1000) if c.id not in {x[0] for x in w.committed}]
        assert len(imported) >= 5  # three imports and two asks


def test_two_app_processes_on_one_data_folder(tmp_path: Path, writers: list[Writer]) -> None:
    db = tmp_path / "lanes.db"
    pair = [Writer(db, "--replies", "15"), Writer(db, "--replies", "15")]
    writers.extend(pair)
    assert [w.finish() for w in pair] == [0, 0], [w.stderr() for w in pair]
    committed = pair[0].committed + pair[1].committed
    assert len(committed) == 30 and len({c[0] for c in committed}) == 30  # no conversation id given twice
    check(db, committed)


def test_fifty_kills_at_random_moments_lose_nothing_committed(tmp_path: Path, writers: list[Writer]) -> None:
    db = tmp_path / "lanes.db"
    rng = random.Random(26)
    committed: list[tuple[int, int, int, int]] = []
    for _ in range(50):
        w = Writer(db, "--delay", "0.0005")
        writers.append(w)
        assert w.ready.wait(30), w.stderr()
        time.sleep(rng.uniform(0.0, 0.4))
        w.kill()
        committed += w.committed
        check(db, committed)
    assert committed, "no kill came after a commit: the moments are too early to test anything"
    with Store(db) as store:  # the replies cut off mid-stream are there too, as far as they were saved
        statuses = {m.status for c in store.list_conversations(10_000) for m in store.messages(c.id)}
    assert statuses <= {"complete", "partial"}
