"""Small facts and chores about the process: which CPU it runs on, and MLX's per-thread streams."""

from __future__ import annotations

import functools
import os
import platform
import sys
from typing import Any


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


# MLX settings Lanes runs with unless the environment already names them. MLX reads them when it
# makes its caches, so they are set before its first pass (``use_mlx_defaults``).
MLX_DEFAULTS = {
    # MLX's CUDA backend keeps cuDNN attention graphs by exact shape, 256 of them, and raises "Cache
    # thrashing is happening" once a cache's misses over the process's life pass twice its size.
    # Every prefill of a new length and every drafting round (its keys end at a new length) is a
    # miss, so a long session would fail its replies: a miss must cost time, never a reply.
    "MLX_ENABLE_CACHE_THRASHING_CHECK": "0",
    # Those graphs (bfloat16 and float16 attention of several rows) are built per exact shape, and a
    # drafting round's shape is new nearly every round: on MLX's own ops instead, a bfloat16 model's
    # drafting rounds cost what their width does (the bf16 A/B in docs/benchmarks.md).
    "MLX_CUDA_USE_CUDNN_SDPA": "0",
}


def use_mlx_defaults() -> None:
    """Put ``MLX_DEFAULTS`` into this process's environment where it names none of them."""
    for name, value in MLX_DEFAULTS.items():
        os.environ.setdefault(name, value)


def mlx_settings() -> dict[str, str]:
    """The ``MLX_*`` environment variables this process runs with, for benchmark reports."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("MLX_")}


def changed_settings(env: dict[str, str]) -> str:
    """The settings of ``mlx_settings()``'s record that are not Lanes' defaults, for a report line:
    ``{"MLX_CUDA_USE_CUDNN_SDPA": "1", "MLX_ENABLE_CACHE_THRASHING_CHECK": "0"}`` gives
    ``"MLX_CUDA_USE_CUDNN_SDPA=1"``."""
    return " ".join(f"{k}={v}" for k, v in sorted(env.items()) if MLX_DEFAULTS.get(k) != v)


def drop_mlx_streams() -> None:
    """MLX wants every thread that used it to drop its streams before the interpreter goes, or the
    process aborts at exit ("terminate called without an active exception"). Imports nothing."""
    if "mlx.core" in sys.modules:
        sys.modules["mlx.core"].clear_streams()


# glibc's mallopt parameter, and the size from which a buffer gets pages of its own.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20


@functools.cache
def _libc() -> Any:
    """glibc's functions, or None where the C library is another (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``), holes between live
    blocks included. Buffers under ``MMAP_THRESHOLD`` come from the heap; when many are freed at
    once (the turn cache evicting a conversation's KV) their pages would stay resident. Returns
    whether anything was released."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def return_freed_buffers() -> bool:
    """Make large buffers the process frees go back to the system at once (glibc; else a no-op).

    MLX on the CPU takes its arrays from malloc. glibc raises its mmap threshold each time a large
    mapped block is freed (up to 32 MiB), after which buffers of a few MiB, the KV caches and
    logits of every round, come from the heap's arenas; freed, they stay resident in fragments, and
    an engine that runs for hours grows (``make soak``; docs/benchmarks.md). A fixed threshold gives
    every buffer from 1 MiB its own pages, released when freed. Returns whether it was set.
    """
    libc = _libc()  # macOS's malloc returns large blocks itself; Metal buffers are not malloc's
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) if libc is not None else False
