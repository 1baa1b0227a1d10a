"""``scripts/gpu_profile.py`` keeps running: its bare decode loops on the embedded model, on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _script():  # -> the module
    path = Path(__file__).parent.parent / "scripts" / "gpu_profile.py"
    spec = importlib.util.spec_from_file_location("gpu_profile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", ["mlx-lm", "lanes-even", "lanes-ragged"])
def test_bare_loop_times_every_part(loaded, kind: str) -> None:
    r = _script().bare_loop(loaded, kind, 2, 2)
    assert set(r) == {"build", "dispatch", "wall"}
    assert 0 < r["build"] < r["wall"] and r["dispatch"] > 0
