"""How many threads the CPU's matrix products use: the cores other programs leave free.

OpenBLAS (MLX's, preloaded by ``engine.model.openblas``, and the one bundled in numpy, which runs
the CPU's rounds) starts one thread per core, and its threads spin waiting for each other. When
other programs keep cores busy, a thread waits a whole time slice for a partner the kernel took
off its core, and every product stalls (docs/benchmarks.md says what that cost on the 2-core
development box). A desktop app always shares its machine, so the engine thread re-reads every
second how much CPU the rest of the machine used (``/proc/stat`` minus this process's own time) and sets both libraries' threads to
the cores left over.

Nothing changes where the user chose: ``OPENBLAS_NUM_THREADS`` set, or no ``/proc/stat`` (macOS,
where MLX computes on the GPU or with Accelerate).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable

# Seconds between two readings: long enough that one reading averages over many time slices.
INTERVAL = 1.0
# A reading over a longer gap (the engine was idle) says little about now: it only starts a new one.
STALE = 4 * INTERVAL
USER_CHOICE = "OPENBLAS_NUM_THREADS"

log = logging.getLogger(__name__)


def threads_for(cores: int, others: float) -> int:
    """The threads to use on ``cores`` cores while other programs keep ``others`` cores busy: the
    free cores, rounded to the nearest, at least one.

    >>> threads_for(2, 0.3), threads_for(2, 0.7), threads_for(2, 2.0), threads_for(8, 2.4)
    (2, 1, 1, 6)

    With two threads against one busy program, the kernel shares 2 cores among 3 spinning
    threads, so that program shows as about 0.67 cores busy: 1.33 free rounds to one thread;
    with one thread it shows as 1.0, and the choice stays.
    """
    return max(1, min(cores, int(cores - others + 0.5)))


def busy_seconds(stat: str, ticks_per_second: float) -> float:
    """CPU seconds all cores spent busy since boot, from ``/proc/stat``'s text: its ``cpu`` line's
    user, nice, system, irq, softirq and steal ticks (guest time is counted in user's already).

    >>> busy_seconds("cpu  100 5 20 900 7 1 2 3 0 0\\ncpu0 50 2 10 450 3 0 1 1 0 0\\n", 100)
    1.31
    """
    fields = stat.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("/proc/stat does not start with the cpu line")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / ticks_per_second


def _read_busy() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return busy_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class BlasThreads:
    """Keeps OpenBLAS's threads at :func:`threads_for` the cores other programs leave free.

    ``tune()`` is cheap between readings; call it once per round on the thread that owns MLX.
    ``apply`` sets the thread count (threadpoolctl's, for every OpenBLAS mapped into the process);
    ``clock``, ``busy`` and ``own`` are the wall clock, the machine's busy CPU seconds and this
    process's CPU seconds.
    """

    def __init__(
        self,
        cores: int,
        apply: Callable[[int], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        busy: Callable[[], float | None] = _read_busy,
        own: Callable[[], float] = _own_seconds,
    ) -> None:
        self.cores, self._apply = cores, apply
        self._clock, self._busy, self._own = clock, busy, own
        self.threads = cores  # what OpenBLAS starts with
        self.changes = 0
        self._last: tuple[float, float, float] | None = None

    def tune(self) -> int:
        """Re-read the machine's load if a reading is due, set the threads if the choice changed,
        and return the current choice."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < INTERVAL:
            return self.threads
        busy = self._busy()
        if busy is None:
            return self.threads
        reading, self._last = self._last, (now, busy, self._own())
        if reading is None or now - reading[0] > STALE:
            return self.threads
        wall = now - reading[0]
        others = max(0.0, (busy - reading[1]) - (self._last[2] - reading[2])) / wall
        chosen = threads_for(self.cores, others)
        if chosen != self.threads:
            self._apply(chosen)
            self.threads = chosen
            self.changes += 1
        return self.threads


    def settle(self, sleep: Callable[[float], None] = time.sleep) -> int:
        """Choose now, waiting one interval if no recent reading exists: for work that cannot call
        ``tune`` as it goes (mlx-lm's own loops, in the benchmark). Returns the choice."""
        if self._last is None or self._clock() - self._last[0] > STALE:
            self.tune()
            sleep(INTERVAL)
        return self.tune()


def _set_openblas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n, user_api="blas")
    except Exception as exc:  # a speed setting must never fail a reply
        log.warning("could not set OpenBLAS to %d threads: %s", n, exc)


@functools.cache
def tuner() -> BlasThreads | None:
    """The process's tuner (thread counts are the process's, so there is one), or None where the
    user set ``OPENBLAS_NUM_THREADS``, there is no ``/proc/stat``, or one core."""
    from engine.model.machine import usable_cores

    cores = usable_cores()
    if os.environ.get(USER_CHOICE) or cores < 2 or _read_busy() is None:
        return None
    return BlasThreads(cores, _set_openblas_threads)
