"""docs/benchmarks.md's throughput tables are made from docs/bench/*.json (engine/bench/report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.bench.report import BEGIN, END, SERVER_BEGIN, row, table, update

ROOT = Path(__file__).resolve().parents[1]


def result(cells: dict[str, float], streams: int = 4, workload: str = "resources/workloads/copy-heavy.jsonl",
           equal: int = 4) -> dict:
    return {"cells": {c: {"median_tok_s": v, "equal_streams": equal} for c, v in cells.items()},
            "machine": {"processor": "H200 host", "cores": 16, "device": "Device(gpu, 0)", "gpu": "NVIDIA H200"},
            "model": "SmolLM2-135M-Instruct", "passes": "generic-ahead", "streams": streams, "workload": workload,
            "measured": "2026-12-03 07:30 UTC"}


def test_a_row_reads_each_ratio_against_the_cells_beside_it() -> None:
    r = result({"mlx-lm-batch": 325.7, "plain": 352.6, "on": 528.7})
    assert row("copy-heavy", r) == (
        "| copy-heavy | copy-heavy | SmolLM2-135M-Instruct (generic-ahead) | 4 | mlx-lm-batch 325.7 "
        "| plain 352.6, on 528.7 | 1.08 | 1.62 | 1.50 | 4/4 | 2026-12-03 07:30 UTC |")
    # One stream: mlx-lm is the baseline; a missing cell leaves its ratios blank, not invented.
    one = row("1-no-copy", result({"mlx-lm": 100.0, "on": 95.0}, streams=1, equal=1))
    assert "| mlx-lm 100.0 | on 95.0 | - | 0.95 | - | 1/1 |" in one


def test_ratios_pair_each_round_so_a_machine_slowing_between_rounds_moves_both_sides() -> None:
    # The H200's lone no-copy reply (2026-12-07): on copied nothing, so both cells ran the same rounds.
    rounds = {"mlx-lm": [175.5, 157.2, 105.2], "plain": [172.0, 169.1, 134.4], "on": [164.9, 133.6, 143.3]}
    r = result({c: sorted(v)[1] for c, v in rounds.items()}, streams=1, equal=1)
    for cell, speeds in rounds.items():
        r["cells"][cell]["rounds"] = [{"tok_s": v} for v in speeds]
    # plain / mlx-lm: 0.98, 1.08, 1.28; on / mlx-lm: 0.94, 0.85, 1.36; on / plain: 0.96, 0.79, 1.07.
    assert "| 1.08 | 0.94 | 0.96 | 1/1 |" in row("1-no-copy", r)
    r["cells"]["on"]["rounds"].pop()  # rounds that do not pair up: the medians' ratios
    assert "| 1.08 | 0.91 | 0.85 | 1/1 |" in row("1-no-copy", r)


def test_a_sampled_row_says_so_and_counts_equality_among_lanes_cells() -> None:
    r = result({"mlx-lm-batch": 400.0, "plain": 300.0, "on": 330.0}, workload="no-copy.jsonl", equal=4)
    r["cells"]["mlx-lm-batch"]["equal_streams"] = None  # mlx-lm's own draws: not compared
    r["sampling"] = {"temperature": 0.7, "top_p": 0.9}
    assert ("| sampled-no-copy | no-copy (sampled: temperature 0.7, top-p 0.9) | SmolLM2-135M-Instruct (generic-ahead) "
            "| 4 | mlx-lm-batch 400.0 | plain 300.0, on 330.0 | 0.75 | 0.82 | 1.10 | 4/4 |") in row("sampled-no-copy", r)


def test_a_table_orders_rows_and_names_the_machine(tmp_path: Path) -> None:
    for name, r in {"gpu-8-copy-heavy": result({"plain": 1.0}, streams=8),
                    "gpu-no-copy": result({"plain": 2.0}, workload="no-copy.jsonl"),
                    "gpu-copy-heavy": result({"plain": 3.0}), "gpu-soak": {"not": "a bench"},
                    "cpu-copy-heavy": result({"plain": 4.0})}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    lines = table("gpu", tmp_path).splitlines()
    assert [ln.split(" | ")[0] for ln in lines[2:5]] == ["| copy-heavy", "| no-copy", "| 8-copy-heavy"]
    assert lines[-1] == "Machine: H200 host, 16 cores, Device(gpu, 0), NVIDIA H200."
    assert table("metal", tmp_path) == "No results yet."


def test_update_replaces_only_the_blocks(tmp_path: Path) -> None:
    (tmp_path / "cpu-copy-heavy.json").write_text(json.dumps(result({"plain": 4.0})))
    page = tmp_path / "page.md"
    blocks = "".join(f"## {d}\nprose {d}\n{BEGIN.format(device=d)}\nold\n{END.format(device=d)}\n" for d in ("gpu", "h100", "cpu"))
    blocks += f"## server\n{SERVER_BEGIN}\nold\n{END.format(device='server')}\n"
    page.write_text(f"# head\n{blocks}tail\n")
    assert update(page, tmp_path)
    text = page.read_text()
    assert "old" not in text and "prose gpu" in text and "prose h100" in text and "prose cpu" in text and text.endswith("tail\n")
    assert "| plain 4.0 |" in text and "No results yet." in text
    assert not update(page, tmp_path)  # current already
    page.write_text("# no blocks\n")
    with pytest.raises(ValueError, match="no block for gpu"):
        update(page, tmp_path)


def test_the_page_is_current_with_its_results(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    assert not update(page, ROOT / "docs" / "bench"), "run `.venv/bin/lanes bench-report` after changing docs/bench"
