"""engine.model.blas_threads: the choice on literal data, then the real engine under real load.

The end-to-end check runs in a subprocess with OpenBLAS preloaded (``engine.model.openblas``), two
busy processes beside it, and asks threadpoolctl what MLX's and numpy's OpenBLAS were left with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.model import blas_threads, openblas
from engine.model.blas_threads import BlasThreads, busy_seconds, threads_for

REPO = Path(__file__).resolve().parents[1]


def test_threads_are_the_cores_others_leave_free() -> None:
    assert [threads_for(2, others) for others in (0.0, 0.4, 0.6, 0.67, 1.0, 2.0, 3.5)] == [2, 2, 1, 1, 1, 1, 1]
    assert [threads_for(8, others) for others in (0.0, 1.0, 2.4, 2.6, 7.9)] == [8, 7, 6, 5, 1]


def test_busy_seconds_count_all_but_idle_and_iowait() -> None:
    stat = "cpu  1000 50 200 90000 700 10 20 30 40 0\ncpu0 1 1 1 1 1 1 1 1 0 0\nintr 1 2 3\n"
    assert busy_seconds(stat, 100) == pytest.approx((1000 + 50 + 200 + 10 + 20 + 30) / 100)
    with pytest.raises(ValueError, match="cpu line"):
        busy_seconds("intr 1 2 3\n", 100)


class Clock:
    """Literal readings: (wall seconds, machine busy CPU seconds, this process's CPU seconds)."""

    def __init__(self, readings: list[tuple[float, float, float]]) -> None:
        self.readings, self.i = readings, 0

    def now(self) -> float:
        return self.readings[self.i][0]

    def busy(self) -> float:
        return self.readings[self.i][1]

    def own(self) -> float:
        return self.readings[self.i][2]


def test_the_tuner_follows_the_load_once_a_second() -> None:
    clock = Clock([
        (0.0, 100.0, 10.0),  # first reading: nothing to compare with yet
        (0.5, 100.9, 10.9),  # within the second: not read
        (1.0, 103.6, 11.9),  # others used (3.6 - 1.9) / 1 s = 1.7 cores: one thread
        (2.0, 105.6, 12.9),  # others 1.0 (we use our one core): stays one
        (3.0, 107.3, 14.9),  # others (1.7 - 2.0) -> 0: two threads again
        (9.0, 119.3, 16.9),  # a gap of 6 s (the engine idled): a new reading, no decision
        (10.0, 121.3, 17.0),  # others 1.9: one thread
    ])
    applied: list[int] = []
    tuner = BlasThreads(2, applied.append, clock=clock.now, busy=clock.busy, own=clock.own)
    chosen = []
    for i in range(len(clock.readings)):
        clock.i = i
        chosen.append(tuner.tune())
    assert chosen == [2, 2, 1, 1, 2, 2, 1]
    assert applied == [1, 2, 1] and tuner.changes == 3


def test_the_tuner_leaves_the_threads_alone_without_proc_stat() -> None:
    applied: list[int] = []
    tuner = BlasThreads(2, applied.append, clock=iter([0.0, 2.0, 4.0]).__next__, busy=lambda: None)
    assert [tuner.tune() for _ in range(3)] == [2, 2, 2] and applied == []


def test_a_user_choice_of_threads_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(blas_threads.USER_CHOICE, "2")
    blas_threads.tuner.cache_clear()
    try:
        assert blas_threads.tuner() is None
    finally:
        blas_threads.tuner.cache_clear()


# Runs the real scheduler on the embedded model while two busy processes share the machine, then
# reports the tuner's choice and the threads threadpoolctl finds in every OpenBLAS of the process.
UNDER_LOAD = textwrap.dedent(
    """
    import json, time
    from threadpoolctl import threadpool_info
    from engine.events import Request
    from engine.model import blas_threads
    from engine.model.loading import load_model
    from engine.rounds.scheduler import Scheduler

    loaded = load_model(None)
    sched = Scheduler(loaded, lambda event: None)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30 and sched.blas.threads != 1:
        sched.submit(Request(prompt_tokens=(1, 2, 3, 4), max_tokens=8))
        while sched.busy:
            sched.step()
    print(json.dumps({
        "chosen": sched.blas.threads,
        "is_the_process_tuner": sched.blas is blas_threads.tuner(),
        "libraries": {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"},
    }))
    """
)


@pytest.mark.model
@pytest.mark.skipif(not sys.platform.startswith("linux") or openblas.openblas_path() is None
                    or len(os.sched_getaffinity(0)) != 2, reason="needs 2-core Linux with OpenBLAS")
def test_under_two_busy_processes_every_openblas_runs_one_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k != blas_threads.USER_CHOICE}
    env.update(openblas.fast_blas_env(env))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        done = subprocess.run([sys.executable, "-c", UNDER_LOAD], capture_output=True, text=True,
                              timeout=240, cwd=REPO, env=env)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["chosen"] == 1 and seen["is_the_process_tuner"]
    libraries = seen["libraries"]
    assert any("numpy" in path for path in libraries) and any("openblas" in path for path in libraries)
    assert set(libraries.values()) == {1}, libraries


def test_settle_waits_one_interval_for_a_first_reading_then_chooses() -> None:
    clock = Clock([(0.0, 50.0, 5.0), (1.0, 51.8, 5.1), (1.2, 52.0, 5.2)])
    waited: list[float] = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        clock.i += 1

    tuner = BlasThreads(2, lambda n: None, clock=clock.now, busy=clock.busy, own=clock.own)
    assert tuner.settle(sleep) == 1 and waited == [blas_threads.INTERVAL]  # others used 1.7 cores
    clock.i = 2
    assert tuner.settle(sleep) == 1 and waited == [blas_threads.INTERVAL]  # a recent reading: no wait
