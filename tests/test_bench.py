"""``lanes bench`` end to end on the real model, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench.workloads import load_workload
from engine.errors import LanesError
from tests import prompts

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent


def lanes(*args: str) -> subprocess.CompletedProcess[str]:
    # A shell that names no MLX setting, as a user's does: Lanes' own defaults show in the record.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=env)


def test_bench_runs_every_cell_and_reports_token_equality(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    lines = [
        {"id": "copy", "messages": [{"role": "user", "content": prompts.COPY}], "max_tokens": 32},
        {"id": "open", "messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 12},
    ]
    workload.write_text("\n".join(json.dumps(line) for line in lines))
    out = tmp_path / "r.json"
    res = lanes("bench", "--workload", str(workload), "--rounds", "2", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "| mlx-lm-batch |" in res.stdout and "| on |" in res.stdout
    data = json.loads(out.read_text())
    assert set(data["cells"]) == {"mlx-lm", "mlx-lm-batch", "plain", "off", "on"}
    assert data["model"] == "SmolLM2-135M-Instruct" and data["machine"]["cores"] >= 1
    assert data["machine"]["mlx_env"] == {"MLX_CUDA_USE_CUDNN_SDPA": "0", "MLX_ENABLE_CACHE_THRASHING_CHECK": "0"}  # set by `lanes`
    for name, cell in data["cells"].items():
        assert len(cell["rounds"]) == 2 and cell["median_tok_s"] > 0
        for rnd in cell["rounds"]:
            assert [s["id"] for s in rnd["streams"]] == ["copy", "open"]
            assert all(s["equal"] for s in rnd["streams"]), (name, rnd["streams"])
    ctx = data["cells"]["off"]["rows"]["context"]
    assert ctx["granted"] >= ctx["tested"] >= ctx["accepted"] and ctx["tested"] > 0
    assert 0 <= data["cells"]["on"]["host_fraction"] < 1
    for rnd in data["cells"]["on"]["rounds"]:  # each reply's own wait, within the run's
        assert all(0 < s["seconds"] <= rnd["seconds"] and 0 < s["engine_rounds"] <= rnd["engine_rounds"]
                   for s in rnd["streams"]), rnd["streams"]
    assert "seconds" not in data["cells"]["mlx-lm-batch"]["rounds"][0]["streams"][0]
    plain = data["cells"]["plain"]["rounds"][0]
    if "cpu" in data["machine"]["device"]:  # numpy's passes, which never run ahead (engine.passes.numpy_pass)
        assert 0 < plain["rounds_host"] < plain["engine_rounds"] and plain["rounds_ahead"] == 0
    else:  # no drafts: nearly every round runs ahead
        assert 0 < plain["rounds_ahead"] < plain["engine_rounds"] and plain["rounds_host"] == 0
    assert plain["rounds_grouped"] == 0  # grouping needs a stream that drafts
    assert plain["chunks_ridden"] >= 1  # the second prompt was prefilled in the first stream's rounds
    assert set(data["grouped_costs_ms"]) == {"4x8/1", "4x16/1"}  # calibrated, as the padded shapes are
    per_key = data["context_cost_us_per_key"]  # fitted from passes timed at 64 and 1,024 keys
    assert per_key["per_stream"] + per_key["per_row"] > 0
    assert all(0 <= r["rounds_grouped"] <= r["engine_rounds"] for r in data["cells"]["off"]["rounds"])


def test_a_cell_runs_with_its_own_family_settings(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    line = {"id": "copy", "messages": [{"role": "user", "content": prompts.COPY}], "max_tokens": 40}
    workload.write_text(json.dumps(line))
    out = tmp_path / "r.json"
    res = lanes("bench", "--workload", str(workload), "--rounds", "1", "--cells", "off,off:max_window=2",
                "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "| off:max_window=2 |" in res.stdout
    cells = json.loads(out.read_text())["cells"]
    assert cells["off"]["settings"] == {} and cells["off:max_window=2"]["settings"] == {"max_window": 2}
    for cell in cells.values():
        assert cell["equal_streams"] == 1
    longest = {name: max(map(int, c["rounds"][0]["accepted_per_window"])) for name, c in cells.items()}
    assert longest["off:max_window=2"] == 2 < longest["off"]  # the setting reached the engine's windows


def test_a_sampled_bench_samples_every_cell_and_holds_lanes_cells_to_one_reply(tmp_path: Path) -> None:
    """``--temperature``: mlx-lm's cells run its sampler (their draws are not compared), every Lanes
    cell writes the replies the plain cell wrote, copies or not (each reply seeded by its line), and
    the replies are not greedy ones."""
    workload = tmp_path / "w.jsonl"
    repeat = [{"role": "user", "content": "Repeat this sentence: The quick brown fox jumps over the lazy dog."},
              {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."},
              {"role": "user", "content": "Once more, please."}]
    lines = [{"id": "copy", "messages": repeat, "max_tokens": 32},
             {"id": "open", "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}], "max_tokens": 48}]
    workload.write_text("\n".join(json.dumps(line) for line in lines))
    out = tmp_path / "r.json"
    res = lanes("bench", "--workload", str(workload), "--rounds", "2", "--cells", "mlx-lm-batch,plain,on",
                "--temperature", "0.3", "--top-p", "0.9", "--json", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["sampling"] == {"temperature": 0.3, "top_p": 0.9}
    cells = data["cells"]
    assert cells["mlx-lm-batch"]["equal_streams"] is None and cells["mlx-lm-batch"]["median_tok_s"] > 0
    assert cells["plain"]["equal_streams"] == cells["on"]["equal_streams"] == 2
    replies = {name: [s["tokens"] for r in c["rounds"] for s in r["streams"]] for name, c in cells.items()}
    assert replies["on"] == replies["plain"]
    assert cells["on"]["rows"]["context"]["tested"] > 0  # on copied while it sampled
    greedy = lanes("bench", "--workload", str(workload), "--rounds", "1", "--cells", "plain", "--json", str(out))
    assert greedy.returncode == 0, greedy.stderr
    assert [s["tokens"] for s in json.loads(out.read_text())["cells"]["plain"]["rounds"][0]["streams"]] != replies["plain"][:2]
    refused = lanes("bench", "--workload", str(workload), "--temperature", "0.7", "--top-p", "0")
    assert refused.returncode == 2 and "--top-p" in refused.stderr


def test_bad_workload_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"id": "b"}\n')
    with pytest.raises(LanesError, match=r"bad\.jsonl:2"):
        load_workload(bad)
    res = lanes("bench", "--workload", str(bad))
    assert res.returncode == 2 and "bad.jsonl:2" in res.stderr


def test_unknown_cell_is_refused(tmp_path: Path) -> None:
    res = lanes("bench", "--workload", str(tmp_path / "missing.jsonl"), "--cells", "plain,turbo")
    assert res.returncode == 2 and "turbo" in res.stderr
    res = lanes("bench", "--workload", str(tmp_path / "missing.jsonl"), "--cells", "on:doubt_prior=2")
    assert res.returncode == 2 and "cell 'on:doubt_prior=2': doubt_prior is a rate" in res.stderr
