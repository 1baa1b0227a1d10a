"""Make MLX's CPU matrix products fast on Linux, and say which BLAS is doing them.

The ``mlx-cpu`` wheel links the netlib *reference* BLAS it bundles; Debian's OpenBLAS,
interposed with ``LD_PRELOAD``, does the same products about 30x faster. ``LD_PRELOAD`` is
read by the dynamic loader only when a process starts, so :func:`ensure_fast_blas` re-executes
the running command once with it set. On macOS MLX uses Accelerate (and Metal) and all of
this is a no-op.

Stdlib only: importing this module must not import MLX (the preload has to happen first).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

# Set in the environment of the re-executed process, so it can never re-execute again.
REEXEC_GUARD = "LANES_BLAS_REEXEC"
# Set to 1 to turn the re-exec off (e.g. when embedding the engine in another program).
OPT_OUT = "LANES_NO_BLAS_REEXEC"

_APT_PACKAGE = "libopenblas0-pthread"
# Debian/Ubuntu install OpenBLAS variants side by side under the multiarch directory.
_VARIANTS = ("openblas-pthread", "openblas-openmp", "openblas", "openblas-serial")
_TRIPLETS = {
    "x86_64": "x86_64-linux-gnu",
    "amd64": "x86_64-linux-gnu",
    "aarch64": "aarch64-linux-gnu",
    "arm64": "aarch64-linux-gnu",
}


def _is_linux() -> bool:
    return sys.platform.startswith("linux")


def openblas_path() -> str | None:
    """Path of OpenBLAS's ``libblas.so.3`` on Debian/Ubuntu (x86_64, aarch64), or None.

    Prefers the pthread build, then OpenMP, then the plain one. None on macOS, on other
    architectures, or when OpenBLAS is not installed.
    """
    if not _is_linux():
        return None
    triplet = _TRIPLETS.get(platform.machine().lower())
    if triplet is None:
        return None
    for variant in _VARIANTS:
        candidate = Path("/usr/lib") / triplet / variant / "libblas.so.3"
        if candidate.is_file():
            return str(candidate)
    return None


def _preloaded_entries(env: Mapping[str, str]) -> list[str]:
    # ld.so accepts both spaces and colons as separators.
    return env.get("LD_PRELOAD", "").replace(":", " ").split()


def _openblas_preloaded(env: Mapping[str, str]) -> bool:
    return any("openblas" in entry.lower() for entry in _preloaded_entries(env))


def ensure_fast_blas() -> None:
    """On Linux, re-execute this process once with OpenBLAS in ``LD_PRELOAD``.

    Call it first thing in a program's entry point, before MLX is imported. It returns
    (does nothing) on macOS, when OpenBLAS is absent, when it is already preloaded, in the
    re-executed process itself, when ``LANES_NO_BLAS_REEXEC=1``, inside pytest, or in an
    interactive interpreter. Otherwise it does not return: the same command line
    (``sys.orig_argv``, so ``.venv/bin/lanes chat``, ``python -m engine.cli`` and
    ``python -c ...`` all come back as they were started) replaces the process.
    """
    if not _is_linux():
        return
    env = os.environ
    if env.get(REEXEC_GUARD) or env.get(OPT_OUT, "") not in ("", "0"):
        return
    if _openblas_preloaded(env):
        return
    if "pytest" in sys.modules or sys.flags.interactive:
        # Re-running a test session or a REPL from the middle is never what anyone wants.
        return
    library = openblas_path()
    if library is None:
        return
    orig_argv = list(getattr(sys, "orig_argv", None) or [])
    if len(orig_argv) < 2 or not sys.executable:
        # A bare REPL, or an embedded interpreter: there is no command line to start again.
        return
    new_env = dict(env)
    new_env["LD_PRELOAD"] = " ".join([library, *_preloaded_entries(env)])
    new_env[REEXEC_GUARD] = "1"
    argv = [sys.executable, *orig_argv[1:]]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    try:
        os.execve(sys.executable, argv, new_env)
    except OSError:
        # Could not re-execute: carry on with the slow BLAS (slow_path_warning() will say so).
        return


def _mapped_paths() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:
        return []
    paths: list[str] = []
    seen: set[str] = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            path = fields[5].strip()
            if path not in seen:
                seen.add(path)
                paths.append(path)
    return paths


def _is_wheel_private(path: str) -> bool:
    # numpy/scipy wheels bundle an OpenBLAS with renamed symbols (libscipy_openblas64_*):
    # it cannot stand in for MLX's BLAS, so it does not count.
    name = Path(path).name.lower()
    return "scipy_openblas" in name or "site-packages" in path or "dist-packages" in path


def blas_backend() -> str:
    """Which BLAS serves MLX's CPU matrix products, once MLX has been imported.

    "accelerate" on macOS; on Linux "openblas" when a system OpenBLAS is mapped into the
    process (it interposes mlx-cpu's bundled BLAS), "reference" when only the netlib BLAS
    bundled in ``mlx_cpu.libs`` is, "unknown" otherwise (e.g. MLX not imported yet).
    """
    if sys.platform == "darwin":
        return "accelerate"
    if not _is_linux():
        return "unknown"
    paths = _mapped_paths()
    for path in paths:
        if "openblas" in path.lower() and not _is_wheel_private(path):
            return "openblas"
    for path in paths:
        name = Path(path).name
        if name.startswith("libblas") and "openblas" not in path.lower():
            return "reference"
    return "unknown"


def _mlx_runs_on_cpu() -> bool:
    try:
        import mlx.core as mx
    except ImportError:
        return False
    return mx.default_device().type == mx.DeviceType.cpu


def slow_path_warning() -> str | None:
    """A sentence to show when MLX multiplies matrices on the CPU with the reference BLAS, else None."""
    if not _is_linux():
        return None
    if blas_backend() != "reference" or not _mlx_runs_on_cpu():
        return None
    library = openblas_path()
    if library is None:
        fix = (
            f"install OpenBLAS (`sudo apt-get install {_APT_PACKAGE}`) and start Lanes with "
            "`make run` or `.venv/bin/lanes`, which preload it"
        )
    else:
        fix = (
            "start Lanes with `make run` or `.venv/bin/lanes`, which preload OpenBLAS, "
            f"or set LD_PRELOAD={library}"
        )
    return (
        "MLX is running on the CPU with the reference BLAS bundled in mlx-cpu, which is about "
        f"30x slower than OpenBLAS: to fix it, {fix}."
    )
