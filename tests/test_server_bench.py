"""``lanes bench-server``'s clients against the real server, and its table in docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.bench.report import server_table
from engine.bench.server_bench import agent_jobs, load_jobs, model_architecture, run_clients
from engine.rounds.engine_thread import Engine
from engine.server.server import ApiServer

MODEL = "SmolLM2-135M-Instruct"


@pytest.mark.model
def test_clients_load_and_agent_sessions_through_the_server(loaded, tmp_path: Path) -> None:
    session = {"id": "s", "system": "Be brief.", "max_tokens": 12,
               "turns": ["Repeat this line: alpha beta gamma.", "Again, the same line."]}
    (tmp_path / "agent.jsonl").write_text(json.dumps(session) + "\n")
    with Engine(loader=lambda _s: loaded, calibrate=False) as engine:
        server = ApiServer(engine, port=0)
        server.start()
        try:
            load = run_clients(server.url, load_jobs(MODEL, Path("resources/workloads/mixed.jsonl"), 3, 8), 2)
            agent = run_clients(server.url, agent_jobs(MODEL, tmp_path / "agent.jsonl"), 2)
        finally:
            server.stop()
    assert load["errors"] == [] and load["requests"] == 3 and load["completion_tokens"] == 24
    assert set(load["latency_s"]) == {"p50", "p90", "p99", "max"} and load["tok_s"] > 0
    assert 0 <= load["copied_tokens"] <= load["completion_tokens"]
    assert agent["errors"] == [] and agent["requests"] == 2  # one session, two turns


def test_server_table_rows_and_ratio_to_mlx_lm(tmp_path: Path) -> None:
    pct = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 3.5}
    target = {"requests": 12, "errors": [], "tok_s": 50.0, "latency_s": pct, "first_token_s": pct,
              "completion_tokens": 400, "copied_tokens": 100}
    result = {"mode": "agent", "architecture": "llama", "clients": 4, "machine": {"processor": "cpu", "cores": 2}, "measured": "2026-12-04",
              "targets": {"lanes": target, "mlx-lm": {**target, "tok_s": 20.0}}}
    (tmp_path / "cpu-agent.json").write_text(json.dumps(result))
    rows = server_table(tmp_path).splitlines()
    assert rows[2] == "| cpu-agent | llama | agent | 4 | lanes | 12 | 0 | 50.0 | 2.50 | 25% | 1.0 / 2.0 / 3.0 | 1.0 / 2.0 | 2026-12-04 |"
    assert rows[3].startswith("| cpu-agent | llama | agent | 4 | mlx-lm | 12 | 0 | 20.0 | - | - |")
    assert server_table(tmp_path / "none") == "No results yet."


def test_results_name_the_modelsmodel_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert model_architecture(str(tmp_path)) == "qwen2"
    assert model_architecture(None) == "llama"  # the embedded SmolLM2
    assert model_architecture("mlx-community/Some-Model") == "?"  # not a folder here: unknown, not guessed
