"""``lanes soak`` runs from the command line (a short soak; the 20-minute one is `make soak`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench.soak import default_workloads, growth


def test_the_default_workloads_exist() -> None:
    assert [p.name for p in default_workloads() if p.is_file()] == ["copy-heavy.jsonl", "no-copy.jsonl",
                                                                     "mixed.jsonl"]


def test_growth_compares_medians_so_one_transient_sample_does_not_decide() -> None:
    mib = 2**20
    steady = [(t, 2000 * mib, 1000 * mib) for t in range(0, 600, 5)]
    spike = [*steady[:60], (300, 2600 * mib, 1000 * mib), *steady[61:]]  # one pass's buffers at 300 s
    assert growth(steady, 120) == (1000 * mib, 1000 * mib, 0.0)
    assert growth(spike, 120) == (1000 * mib, 1000 * mib, 0.0)
    leaking = [(t, (2000 + t // 5) * mib, 1000 * mib) for t in range(0, 600, 5)]  # +1 MiB a sample
    first, last, grew = growth(leaking, 120)
    assert (first, last) == (1039.5 * mib, 1103.5 * mib) and grew == pytest.approx(0.0616, abs=1e-4)
    # Memory the caches hold is not growth: the turn cache filling towards its budget.
    filling = [(t, (2000 + t) * mib, (1000 + t) * mib) for t in range(0, 600, 5)]
    assert growth(filling, 120)[2] == 0.0


@pytest.mark.model
def test_a_short_soak_runs_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "-m", "engine.cli", "soak", "--streams", "2", "--minutes", "0.15",
                           "--warmup", "2", "--max-tokens", "8", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr  # 1: memory still settling in so short a soak
    result = json.loads(out.read_text())
    assert result["errors"] == 0 and result["replies"] > 0 and result["streams"] == 2
