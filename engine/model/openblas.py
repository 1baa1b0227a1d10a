"""Make MLX's CPU matrix products fast on Linux, and say which BLAS is doing them.

The ``mlx-cpu`` wheel links the netlib *reference* BLAS it bundles; Debian's OpenBLAS,
interposed with ``LD_PRELOAD``, does the same products about 30x faster. ``LD_PRELOAD`` is
read by the dynamic loader only when a process starts, so :func:`ensure_fast_blas` re-executes
the running command once with it set. On macOS MLX uses Accelerate (and Metal) and all of
this is a no-op.

OpenBLAS picks its kernels from the CPU model, and a model newer than the OpenBLAS release falls
back to its oldest x86-64 kernels ("Prescott", SSE3): Debian 12's 0.3.21 does so on a 5th-gen Xeon
(model 207) that has AVX-512. :func:`coretype_override` names the kernels the CPU's flags allow,
and the re-exec sets ``OPENBLAS_CORETYPE`` to it (docs/benchmarks.md says what that changed there).

Stdlib only: importing this module must not import MLX (the preload has to happen first).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
from collections.abc import Mapping, Set
from pathlib import Path

# Set in the environment of the re-executed process, so it can never re-execute again.
REEXEC_GUARD = "LANES_BLAS_REEXEC"
# Set to 1 to turn the re-exec off (e.g. when embedding the engine in another program).
OPT_OUT = "LANES_NO_BLAS_REEXEC"

# Read by OpenBLAS when it loads: which kernels to use instead of the ones it detects.
CORETYPE = "OPENBLAS_CORETYPE"

_APT_PACKAGE = "libopenblas0-pthread"
# OpenBLAS cores with AVX2 kernels or better: a choice among these is left alone.
_MODERN_CORES = frozenset({"haswell", "zen", "excavator", "skylakex", "cooperlake", "sapphirerapids"})
# What OpenBLAS's SkylakeX kernels need (the kernel lists a feature in cpuinfo only if it enables it).
_AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
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


def coretype_override(corename: str | None, flags: Set[str]) -> str | None:
    """The ``OPENBLAS_CORETYPE`` to set when OpenBLAS chose kernels older than the CPU, else None.

    ``corename`` is what OpenBLAS detected (``openblas_get_corename()``), ``flags`` the CPU's
    ``/proc/cpuinfo`` flags. For example ``coretype_override("Prescott", {"avx2", "fma", "avx512f",
    "avx512cd", "avx512bw", "avx512dq", "avx512vl"})`` is ``"SkylakeX"``, with only ``{"avx2",
    "fma"}`` it is ``"Haswell"``, and ``coretype_override("Zen", {"avx2", "fma"})`` is None.
    """
    if corename is None or corename.lower() in _MODERN_CORES:
        return None
    if flags >= _AVX512:
        return "SkylakeX"
    if flags >= {"avx2", "fma"}:
        return "Haswell"
    return None


def cpu_flags() -> frozenset[str]:
    """The first processor's flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def openblas_corename(library: str) -> str | None:
    """The kernels OpenBLAS ``library`` chose, e.g. "Haswell"; loads it (in place, if already mapped)."""
    try:
        get = ctypes.CDLL(library).openblas_get_corename
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_char_p
    name = get()
    return name.decode(errors="replace") if name else None


def _x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _kernels(library: str) -> tuple[str | None, str | None]:
    """(the kernels OpenBLAS ``library`` runs, the ``OPENBLAS_CORETYPE`` this CPU wants instead or None)."""
    if not _x86_64():
        return None, None
    core = openblas_corename(library)
    return core, coretype_override(core, cpu_flags())


def fast_blas_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``env`` for MLX's fast CPU path on Linux: ``LD_PRELOAD`` and, where
    OpenBLAS would pick old kernels, ``OPENBLAS_CORETYPE``. Empty when nothing is missing.

    Loads OpenBLAS into this process to ask which kernels it picks (call it before MLX is imported).
    """
    if not _is_linux():
        return {}
    preloaded = [e for e in _preloaded_entries(env) if "openblas" in e.lower()]
    library = preloaded[0] if preloaded else openblas_path()
    if library is None:
        return {}
    extra = {} if preloaded else {"LD_PRELOAD": " ".join([library, *_preloaded_entries(env)])}
    if not env.get(CORETYPE):
        better = _kernels(library)[1]
        if better is not None:
            extra[CORETYPE] = better
    return extra


def _preloaded_entries(env: Mapping[str, str]) -> list[str]:
    # ld.so accepts both spaces and colons as separators.
    return env.get("LD_PRELOAD", "").replace(":", " ").split()


def ensure_fast_blas() -> None:
    """On Linux, re-execute this process once with OpenBLAS in ``LD_PRELOAD`` (see :func:`fast_blas_env`).

    Call it first thing in a program's entry point, before MLX is imported. It returns
    (does nothing) on macOS, when OpenBLAS is absent, when it is already preloaded with
    kernels that fit the CPU, in the re-executed process itself, when
    ``LANES_NO_BLAS_REEXEC=1``, inside pytest, or in an interactive interpreter. Otherwise it
    does not return: the same command line
    (``sys.orig_argv``, so ``.venv/bin/lanes chat``, ``python -m engine.cli`` and
    ``python -c ...`` all come back as they were started) replaces the process.
    """
    if not _is_linux():
        return
    env = os.environ
    if env.get(REEXEC_GUARD) or env.get(OPT_OUT, "") not in ("", "0"):
        return
    if "pytest" in sys.modules or sys.flags.interactive:
        # Re-running a test session or a REPL from the middle is never what anyone wants.
        return
    orig_argv = list(getattr(sys, "orig_argv", None) or [])
    if len(orig_argv) < 2 or not sys.executable:
        # A bare REPL, or an embedded interpreter: there is no command line to start again.
        return
    extra = fast_blas_env(env)
    if not extra:
        return
    new_env = {**env, **extra, REEXEC_GUARD: "1"}
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
    if loaded_openblas() is not None:
        return "openblas"
    for path in _mapped_paths():
        name = Path(path).name
        if name.startswith("libblas") and "openblas" not in path.lower():
            return "reference"
    return "unknown"


def loaded_openblas() -> str | None:
    """Path of the system OpenBLAS mapped into this process, or None."""
    for path in _mapped_paths():
        if "openblas" in path.lower() and not _is_wheel_private(path):
            return path
    return None


def _mlx_runs_on_cpu() -> bool:
    try:
        import mlx.core as mx
    except ImportError:
        return False
    return mx.default_device().type == mx.DeviceType.cpu


def slow_path_warning() -> str | None:
    """A sentence to show when MLX multiplies matrices on the CPU on a slow path, else None.

    Slow paths: the reference BLAS, or OpenBLAS running kernels older than the CPU
    (:func:`coretype_override`).
    """
    if not _is_linux() or not _mlx_runs_on_cpu():
        return None
    backend = blas_backend()
    if backend == "openblas":
        loaded = loaded_openblas()
        if loaded is None or os.environ.get(CORETYPE):
            return None
        core, better = _kernels(loaded)
        if better is None:
            return None
        return (
            f"OpenBLAS ({loaded}) runs its {core} kernels, older than this CPU's: set "
            f"{CORETYPE}={better} (`make run` and `.venv/bin/lanes` do): passes ran 1.2-1.6x faster "
            "that way on a 5th-generation Xeon."
        )
    if backend != "reference":
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


def main() -> None:
    """Print ``fast_blas_env`` as shell words (``KEY=VALUE ...``): the Makefile runs commands with
    ``env $(python -m engine.model.openblas) ...``, for those (pytest) that do not re-execute themselves."""
    print(" ".join(f"{k}={v}" for k, v in fast_blas_env(os.environ).items()))


if __name__ == "__main__":
    main()
