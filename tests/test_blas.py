"""engine.model.openblas: which BLAS MLX uses on Linux, and the OpenBLAS re-exec.

LD_PRELOAD only takes effect when a process starts, so every check runs in a fresh
``sys.executable`` subprocess with an environment this test controls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.model import openblas

REPO = Path(__file__).resolve().parents[1]

linux_with_openblas = pytest.mark.skipif(
    not sys.platform.startswith("linux") or openblas.openblas_path() is None,
    reason="needs Linux with Debian/Ubuntu OpenBLAS (apt-get install libopenblas0-pthread)",
)

# Imports MLX, does a small matrix product and reports what engine.model.openblas sees.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    import mlx.core as mx
    from engine.model import openblas
    real_corename = getattr(openblas, "real_corename", openblas.openblas_corename)
    a = mx.random.normal((64, 64))
    mx.eval(a @ a)
    print(json.dumps({
        "backend": openblas.blas_backend(),
        "warning": openblas.slow_path_warning(),
        "argv": sys.argv[1:],
        "guard": os.environ.get(openblas.REEXEC_GUARD),
        "preload": os.environ.get("LD_PRELOAD", ""),
        "coretype": os.environ.get(openblas.CORETYPE),
        "core": real_corename(openblas.loaded_openblas()) if openblas.loaded_openblas() else None,
    }))
    """
)

# Same probe, but asks for the fast BLAS first, as engine.cli does.
REEXEC_PROBE = "from engine.model import openblas\nopenblas.ensure_fast_blas()\n" + PROBE


def _env(preload: str | None) -> dict[str, str]:
    dropped = ("LD_PRELOAD", openblas.REEXEC_GUARD, openblas.OPT_OUT, openblas.CORETYPE)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    if preload is not None:
        env["LD_PRELOAD"] = preload
    return env


def _fast_env() -> dict[str, str]:
    """What ``python -m engine.model.openblas`` says to add (the Makefile's way): OpenBLAS and its kernels."""
    proc = subprocess.run([sys.executable, "-m", "engine.model.openblas"], check=True, env=_env(None), cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    return {**_env(None), **dict(w.split("=", 1) for w in proc.stdout.split())}


def _run(args: list[str], env: dict[str, str], cwd: Path = REPO) -> dict:
    proc = subprocess.run(
        [sys.executable, *args], check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@linux_with_openblas
def test_reference_blas_without_preload() -> None:
    out = _run(["-c", PROBE], _env(None))
    assert out["backend"] == "reference"


@linux_with_openblas
def test_openblas_with_preload() -> None:
    out = _run(["-c", PROBE], _env(openblas.openblas_path()))
    assert out["backend"] == "openblas"


@linux_with_openblas
def test_slow_path_warning_only_on_reference() -> None:
    slow = _run(["-c", PROBE], _env(None))
    fast = _run(["-c", PROBE], _fast_env())
    assert slow["warning"] is not None
    assert "30x" in slow["warning"]
    assert "make run" in slow["warning"]
    assert openblas.openblas_path() in slow["warning"]  # installed here, so it says what to preload
    assert fast["warning"] is None


@linux_with_openblas
def test_ensure_fast_blas_reexecs_a_script(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(REEXEC_PROBE)
    out = _run([str(script), "chat", "--flag"], _env(None), cwd=tmp_path)
    assert out["backend"] == "openblas"
    assert out["argv"] == ["chat", "--flag"]
    assert out["guard"] == "1"
    assert out["preload"].split()[0] == openblas.openblas_path()


@linux_with_openblas
def test_ensure_fast_blas_reexecs_a_module(tmp_path: Path) -> None:
    package = tmp_path / "probepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(REEXEC_PROBE)
    env = _env(None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    out = _run(["-m", "probepkg.cli", "bench", "--json", "x.json"], env, cwd=tmp_path)
    assert out["backend"] == "openblas"
    assert out["argv"] == ["bench", "--json", "x.json"]


@linux_with_openblas
def test_ensure_fast_blas_keeps_other_preloads(tmp_path: Path) -> None:
    # A library someone else preloads stays, after OpenBLAS.
    other = "/lib/x86_64-linux-gnu/libm.so.6" if Path("/lib/x86_64-linux-gnu/libm.so.6").exists() else ""
    if not other:
        pytest.skip("no libm at the Debian x86_64 path to preload")
    out = _run(["-c", REEXEC_PROBE], _env(other))
    assert out["backend"] == "openblas"
    assert out["preload"].split() == [openblas.openblas_path(), other]


@linux_with_openblas
def test_guard_stops_a_second_reexec() -> None:
    env = _env(None)
    env[openblas.REEXEC_GUARD] = "1"
    out = _run(["-c", REEXEC_PROBE], env)
    # The guard says "already re-executed": no exec happens, so the slow path stays.
    assert out["backend"] == "reference"
    assert out["warning"] is not None


@linux_with_openblas
def test_opt_out() -> None:
    env = _env(None)
    env[openblas.OPT_OUT] = "1"
    out = _run(["-c", REEXEC_PROBE], env)
    assert out["backend"] == "reference"


def test_no_reexec_inside_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(openblas.REEXEC_GUARD, raising=False)
    monkeypatch.delenv(openblas.OPT_OUT, raising=False)

    def fail(*args: object) -> None:
        raise AssertionError("ensure_fast_blas must not re-exec a pytest run")

    monkeypatch.setattr(os, "execve", fail)
    openblas.ensure_fast_blas()


def test_nothing_to_do_on_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("no exec on macOS"))
    assert openblas.openblas_path() is None
    assert openblas.blas_backend() == "accelerate"
    assert openblas.slow_path_warning() is None
    openblas.ensure_fast_blas()


def test_blas_module_does_not_import_mlx() -> None:
    code = "import sys; import engine.model.openblas; print('mlx' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


AVX512 = frozenset({"avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"
has_avx2 = pytest.mark.skipif(
    not {"avx2", "fma"} <= openblas.cpu_flags(), reason="needs an x86-64 CPU with AVX2 and FMA"
)


@pytest.mark.parametrize(
    ("core", "flags", "want"),
    [
        ("Prescott", AVX512, "SkylakeX"),  # Debian's OpenBLAS 0.3.21 on a 5th-gen Xeon (model 207)
        ("Prescott", {"avx2", "fma"}, "Haswell"),
        ("Sandybridge", {"avx", "avx2", "fma"}, "Haswell"),
        ("Prescott", {"avx2", "fma", "avx512f"}, "Haswell"),  # SkylakeX kernels need bw, dq, vl, cd too
        ("Prescott", {"sse3", "avx"}, None),  # nothing better to offer
        ("Zen", AVX512, None),
        ("Haswell", AVX512, None),
        ("SkylakeX", AVX512, None),
        (None, AVX512, None),  # not an OpenBLAS that says
    ],
)
def test_coretype_override(core: str | None, flags: set[str], want: str | None) -> None:
    assert openblas.coretype_override(core, frozenset(flags)) == want


def test_fast_blas_env(monkeypatch: pytest.MonkeyPatch) -> None:
    cores: dict[str, str] = {}
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(openblas, "openblas_path", lambda: LIB)
    monkeypatch.setattr(openblas, "_x86_64", lambda: True)
    monkeypatch.setattr(openblas, "cpu_flags", lambda: AVX512)
    monkeypatch.setattr(openblas, "openblas_corename", lambda lib: cores.get(lib, "Prescott"))
    core = openblas.CORETYPE
    assert openblas.fast_blas_env({}) == {"LD_PRELOAD": LIB, core: "SkylakeX"}
    assert openblas.fast_blas_env({"LD_PRELOAD": "/lib/libm.so.6"}) == {"LD_PRELOAD": f"{LIB} /lib/libm.so.6",
                                                                   core: "SkylakeX"}
    assert openblas.fast_blas_env({"LD_PRELOAD": LIB}) == {core: "SkylakeX"}  # preloaded (make): only the kernels
    assert openblas.fast_blas_env({"LD_PRELOAD": LIB, core: "Haswell"}) == {}  # a choice already made stands
    cores[LIB] = "Zen"
    assert openblas.fast_blas_env({}) == {"LD_PRELOAD": LIB}
    assert openblas.fast_blas_env({"LD_PRELOAD": LIB}) == {}
    monkeypatch.setattr(openblas, "openblas_path", lambda: None)
    assert openblas.fast_blas_env({}) == {}


@linux_with_openblas
@has_avx2
def test_reexec_gives_openblas_the_kernels_the_cpu_allows(tmp_path: Path) -> None:
    # This process pretends OpenBLAS detected Prescott on an AVX2 CPU; the re-executed one is not
    # patched, so the kernels it reports are the ones OpenBLAS really loaded.
    script = tmp_path / "probe.py"
    script.write_text(
        "from engine.model import openblas\n"
        "openblas.real_corename = openblas.openblas_corename\n"
        "openblas.openblas_corename = lambda lib: 'Prescott'\n"
        "openblas.cpu_flags = lambda: frozenset({'avx2', 'fma'})\n"
        "openblas.ensure_fast_blas()\n" + PROBE
    )
    out = _run([str(script)], _env(None), cwd=tmp_path)
    assert out["guard"] == "1"
    assert out["coretype"] == "Haswell"
    assert out["core"] == "Haswell"


@linux_with_openblas
@has_avx2
def test_warning_when_openblas_runs_older_kernels_than_the_cpu() -> None:
    env = _env(openblas.openblas_path())
    env[openblas.CORETYPE] = "Prescott"  # OpenBLAS reads it at load; the probe then forgets it was asked for
    out = _run(["-c", f"import os\nos.environ.pop({openblas.CORETYPE!r})\n" + PROBE], env)
    assert out["core"] == "Prescott"
    better = openblas.coretype_override("Prescott", openblas.cpu_flags())
    assert out["warning"] is not None
    assert "Prescott" in out["warning"]
    assert f"{openblas.CORETYPE}={better}" in out["warning"]
    env[openblas.CORETYPE] = better
    fine = _run(["-c", PROBE], env)
    assert fine["core"] == better
    assert fine["warning"] is None


@linux_with_openblas
def test_make_prints_the_preload_and_kernels() -> None:
    # The Makefile runs pytest and benchmarks under `env $(python -m engine.model.openblas) ...`.
    env = _fast_env()
    assert env["LD_PRELOAD"] == openblas.openblas_path()
    out = _run(["-c", PROBE], env)
    assert out["backend"] == "openblas"
    assert openblas.coretype_override(out["core"], openblas.cpu_flags()) is None  # the kernels fit this CPU
    assert out["warning"] is None
