"""The MLX settings Lanes runs with (``engine.model.machine.MLX_DEFAULTS``): set in the MLX thread
before its first pass, a user's own choice kept, and any other setting named in benchmark rows."""

from __future__ import annotations

import pytest

from engine.bench.report import row
from engine.errors import ModelLoadError
from engine.model.machine import changed_settings, mlx_settings
from engine.rounds.engine_thread import Engine

FUSE = "MLX_ENABLE_CACHE_THRASHING_CHECK"


def _env_at_load(monkeypatch: pytest.MonkeyPatch, value: str | None, name: str = FUSE) -> str | None:
    """What the engine thread's environment says about ``name`` when it loads a model."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    seen: list[str | None] = []

    def loader(_spec: str | None) -> object:
        import os

        seen.append(os.environ.get(name))
        raise ModelLoadError("no model in this test")

    with Engine(loader=loader, calibrate=False) as engine, pytest.raises(ModelLoadError):  # type: ignore[arg-type]
        engine.info(timeout=30)
    return seen[0]


@pytest.mark.parametrize("name", [FUSE, "MLX_CUDA_USE_CUDNN_SDPA"])
def test_the_engine_thread_turns_the_cache_fuse_and_cudnn_attention_off_before_its_first_pass(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    assert _env_at_load(monkeypatch, None, name) == "0"


def test_a_users_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _env_at_load(monkeypatch, "1") == "1"


def test_reports_name_only_the_settings_that_are_not_lanes_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSE, "0")
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "1")
    recorded = mlx_settings()
    assert recorded[FUSE] == "0" and recorded["MLX_CUDA_USE_CUDNN_SDPA"] == "1"
    assert changed_settings(recorded) == "MLX_CUDA_USE_CUDNN_SDPA=1"  # cuDNN's attention back on
    assert changed_settings({FUSE: "0", "MLX_CUDA_USE_CUDNN_SDPA": "0"}) == ""
    assert changed_settings({FUSE: "1"}) == f"{FUSE}=1"  # the fuse back on is a difference too
    result = {"cells": {"mlx-lm-batch": {"median_tok_s": 100.0, "equal_streams": 4},
                        "on": {"median_tok_s": 150.0, "equal_streams": 4}},
              "machine": {"mlx_env": recorded}, "model": "m", "streams": 4,
              "workload": "resources/workloads/copy-heavy.jsonl"}
    assert "| copy-heavy (MLX_CUDA_USE_CUDNN_SDPA=1) |" in row("x", result)
    result["machine"]["mlx_env"] = {FUSE: "0"}
    assert "| copy-heavy |" in row("x", result)
    del result["machine"]["mlx_env"]  # files from before the record
    assert "| copy-heavy |" in row("x", result)
