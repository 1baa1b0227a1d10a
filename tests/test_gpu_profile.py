"""The GPU measuring scripts keep running, on the CPU: ``scripts/gpu_profile.py``'s bare decode loops on
the embedded model and ``scripts/round_trace.py`` on a workload."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
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


def test_round_trace_sorts_a_workloads_rounds_by_kind(tmp_path: Path) -> None:
    """``scripts/round_trace.py`` on two streams of the copy-heavy workload, GPU round logic on the CPU:
    every round is sorted into a kind, and drafting rounds appear only where drafts are allowed."""
    root = Path(__file__).parent.parent
    out = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, "scripts/round_trace.py", "--workload", "resources/workloads/copy-heavy.jsonl",
         "--streams", "2", "--repeats", "1", "--max-tokens", "24", "--cells", "plain,on", "--accelerator",
         "--json", str(out)], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    for cell in ("plain", "on"):
        (run,) = runs[cell]
        kinds = ("ahead", "sync", "draft", "dropped", "waited", "joining")
        assert sum(run[k]["n"] for k in kinds) == run["rounds"] > 0
    assert runs["plain"][0]["drafting"]["rounds"] == 0
    assert runs["on"][0]["drafting"]["accepted"] > 0


def test_engine_steps_time_batch_generate_and_plain_on_a_workload(loaded) -> None:
    parts = _script().engine_steps(loaded, 2, 4, Path("resources/workloads/mixed.jsonl"))
    assert set(parts) == {"mlx-lm-batch", "plain"}
    for p in parts.values():
        assert p["step"] > 0 and p["tok_s"] > 0 and p["model"] > 0


def _replay_script():  # -> the module
    path = Path(__file__).parent.parent / "scripts" / "draft_replay.py"
    spec = importlib.util.spec_from_file_location("draft_replay", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["draft_replay"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_draft_replay_copies_a_reply_that_repeats_its_prompt(loaded) -> None:
    """A reply that re-emits its prompt's text is mostly copied, and every reference token is either
    copied or the model's own (one a round)."""
    from engine.drafts.cost_model import CostModel

    tok = loaded.tokenizer
    text = "The quick brown fox jumps over the lazy dog near the quiet river bank at dawn, every day."
    prompt = list(tok.encode(f"Repeat this: {text}"))
    reference = list(tok.encode(f"Sure: {text} Done."))
    costs = CostModel({(1, 1): 0.007, (1, 8): 0.0075, (4, 1): 0.009, (4, 8): 0.0095})
    for ahead in (False, True):
        r = _replay_script().replay(prompt, reference, loaded.family, tok, costs, ahead, 0.007)
        assert r.rounds + r.copied == len(reference)
        assert r.copied >= len(reference) // 2, r


def test_draft_replay_reads_a_bench_result() -> None:
    root = Path(__file__).parent.parent
    done = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/gpu-1-copy-heavy.json", "--ahead"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("rename-variable: 256 tokens in ") and "copied" in done.stdout
