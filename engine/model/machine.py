"""Small facts and chores about the process: which CPU it runs on, and MLX's per-thread streams."""

from __future__ import annotations

import os
import platform
import sys


def cpu_model() -> str:
    """The CPU's name, for benchmark reports (``/proc/cpuinfo`` on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def usable_cores() -> int:
    """Cores this process may run on (its affinity, where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def drop_mlx_streams() -> None:
    """MLX wants every thread that used it to drop its streams before the interpreter goes, or the
    process aborts at exit ("terminate called without an active exception"). Imports nothing."""
    if "mlx.core" in sys.modules:
        sys.modules["mlx.core"].clear_streams()
