"""Packaging (issue 6), without building anything: the spec, the signing script's refusals, the icon,
and app.selftest (what `Lanes --self-test` runs in a bundle), once in-process on the real model.

The bundle itself is built and self-tested by `.ci/run` (`make package`, then `dist/Lanes/Lanes
--self-test`)."""

from __future__ import annotations

import ast
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from app import selftest

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "packaging" / "lanes.spec"
SIGN = REPO / "packaging" / "sign_and_notarize.sh"
NOTARY_VARS = ("LANES_APPLE_ID", "LANES_TEAM_ID", "LANES_APP_PASSWORD")


def test_spec_is_python_and_names_files_that_exist() -> None:
    tree = ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))
    compile(tree, str(SPEC), "exec")
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    # The entry script and the icon the spec refers to are there; so are the signing entitlements.
    for name in ("lanes_launcher.py", "icon.icns"):
        assert name in strings
    assert (REPO / "packaging" / "lanes_launcher.py").is_file()
    assert (REPO / "packaging" / "entitlements.plist").is_file()
    # What the issue asks of Info.plist.
    for key in (
        "CFBundleIdentifier",
        "CFBundleShortVersionString",
        "NSHighResolutionCapable",
        "LSMinimumSystemVersion",
        "CFBundleName",
    ):
        assert key in strings
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE"} <= calls


def test_launcher_runs_the_app_entry_point() -> None:
    tree = ast.parse((REPO / "packaging" / "lanes_launcher.py").read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert any(n.module == "app.main" and [a.name for a in n.names] == ["main"] for n in imports)


def _sign(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # env -i semantics: only what the test passes (bash fills in a default PATH).
    return subprocess.run(
        ["/bin/bash", str(SIGN)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_sign_script_refuses_naming_every_missing_variable() -> None:
    proc = _sign({})
    assert proc.returncode == 2
    for var in ("LANES_SIGN_IDENTITY", *NOTARY_VARS):
        assert var in proc.stderr
    assert "refusing" in proc.stderr and "LANES_NOTARY_PROFILE" in proc.stderr


def test_sign_script_with_a_notary_profile_needs_only_the_identity() -> None:
    proc = _sign({"LANES_NOTARY_PROFILE": "lanes"})
    assert proc.returncode == 2
    assert "LANES_SIGN_IDENTITY" in proc.stderr
    for var in NOTARY_VARS:
        assert var not in proc.stderr


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS it would go on to sign")
def test_sign_script_refuses_off_macos_with_every_variable_set() -> None:
    env = {"LANES_SIGN_IDENTITY": "Developer ID Application: X (T)", **dict.fromkeys(NOTARY_VARS, "x")}
    proc = _sign(env)
    assert proc.returncode == 2
    assert "need macOS" in proc.stderr


def test_icons_are_what_the_spec_expects() -> None:
    png = (REPO / "resources" / "icon.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1024, 1024)
    icns = (REPO / "resources" / "icon.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    kinds, pos = {}, 8
    while pos < len(icns):
        kind, length = icns[pos : pos + 4], struct.unpack(">I", icns[pos + 4 : pos + 8])[0]
        assert length > 8 and icns[pos + 8 : pos + 16] == b"\x89PNG\r\n\x1a\n"
        kinds[kind] = length
        pos += length
    assert pos == len(icns)
    assert {b"ic07", b"ic08", b"ic09", b"ic10"} <= set(kinds)  # 128, 256, 512, 1024 px


def test_self_flag_runs_the_self_test(monkeypatch: pytest.MonkeyPatch) -> None:
    from app import main as app_main

    seen = []
    monkeypatch.setattr(selftest, "main", lambda model=None: seen.append(model) or 7)
    assert app_main.main(["--self-test"]) == 7
    assert app_main.main(["--self-test", "--model", "some.gguf"]) == 7
    assert seen == [None, "some.gguf"]


def test_self_test_reports_each_failure_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    for name in ("check_qt", "check_pygments", "check_blas"):
        monkeypatch.setattr(selftest, name, lambda: "fine")
    monkeypatch.setattr(selftest, "check_model", lambda model=None: f"fine {model}")

    def broken() -> str:
        raise OSError("disk full")

    monkeypatch.setattr(selftest, "check_store", broken)
    lines: list[str] = []
    assert selftest.main(lines.append, model="m.gguf") == 1
    out = "\n".join(lines)
    assert "ok   model" in out and "fine m.gguf" in out
    assert "FAIL store" in out and "OSError: disk full" in out
    assert lines[-2:] == [lines[-2], "  store: OSError: disk full"]
    assert lines[-2].startswith("self-test FAILED: 1 of 5 checks")

    monkeypatch.setattr(selftest, "check_store", lambda: "fine")
    lines.clear()
    assert selftest.main(lines.append) == 0
    assert lines[-1].startswith("self-test passed: 5 checks")


@pytest.mark.model
def test_self_test_passes_in_process_on_the_embedded_model(qapp) -> None:
    from engine.model import openblas

    lines: list[str] = []
    results = selftest.run_checks(lines.append)
    failed = {c.name: c.detail for c in results if not c.ok}
    # In-process nothing re-executes: on Linux with OpenBLAS installed but not preloaded (pytest run
    # without `make test`), the BLAS check must say so; everything else must pass.
    import mlx.core  # noqa: F401  (loaded by the model check; blas_backend reads the process's maps)

    unpreloaded = (
        sys.platform.startswith("linux")
        and openblas.openblas_path() is not None
        and openblas.blas_backend() != "openblas"
        and os.environ.get(openblas.OPT_OUT, "") in ("", "0")
    )
    assert set(failed) == ({"blas"} if unpreloaded else set()), "\n".join(lines)
    assert [c.name for c in results] == ["qt", "pygments", "model", "blas", "store"]
    model = next(c for c in results if c.name == "model")
    assert "SmolLM2" in model.detail and "tokens in" in model.detail
