"""The store benchmark at a tiny size: its shape and its synthetic data, never its timings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.bench.store_bench import (
    LONG_CONVERSATION,
    MODEL,
    QUERIES,
    build_database,
    run_store_bench,
    run_store_bench_cli,
    to_markdown,
)
from engine.store.store import Store


def test_run_store_bench_shape(tmp_path: Path) -> None:
    result = run_store_bench(conversations=50, messages=400, recall_messages=300, repeats=2, folder=tmp_path)
    assert result["sizes"]["conversations"] == 50 and result["sizes"]["messages"] == 400
    assert result["build"]["main_bytes"] > 0 and result["build"]["recall_bytes"] > 0
    assert result["build"]["main_s"] > 0 and result["build"]["recall_s"] > 0
    keys = [m["key"] for m in result["measures"]]
    assert keys == ["list", *(f"search:{label}" for label, _ in QUERIES), "open", "recall"]
    for m in result["measures"]:
        assert len(m["runs_ms"]) == 2
        assert 0 < m["median_ms"] <= m["p90_ms"] <= m["max_ms"]
        assert m["target_ms"] > 0 and isinstance(m["met"], bool)
    by_key = {m["key"]: m for m in result["measures"]}
    assert by_key["list"]["detail"]["rows"] == 50
    assert by_key["search:common word"]["detail"]["results"] > 0
    assert by_key["search:rare word"]["detail"]["results"] > 0
    assert by_key["open"]["detail"]["messages"] == LONG_CONVERSATION
    recall = by_key["recall"]["detail"]
    assert recall["documents"] > 0 and recall["tokens"] > 0
    assert result["machine"]["cpu_count"] and result["machine"]["sqlite"]
    table = to_markdown(result)
    assert "| open a conversation of 200 messages |" in table and "SQLite" in table


def test_synthetic_database(tmp_path: Path) -> None:
    path = tmp_path / "lanes.db"
    info = build_database(path, conversations=20, messages=300)
    with Store(path) as store:
        assert store.count_conversations() == 20
        assert sum(c.messages for c in store.list_conversations(100)) == 300
        long = store.messages(info["long_conversation_id"])
        assert len(long) == LONG_CONVERSATION
        assert [m.role for m in long[:4]] == ["user", "assistant", "user", "assistant"]
        assert all(m.tokens and m.tokens_model == MODEL and max(m.tokens) < 49152 for m in long)
        assert all(20 <= len(m.content.split()) <= 160 for m in long)
        assert long[1].stats is not None and len(long[1].origins or ()) == len(long[1].tokens or ())
        updated = [c.updated_at for c in store.list_conversations(100)]
        assert updated == sorted(updated, reverse=True) and updated[0] - updated[-1] > 86_400
        assert store.search("the")  # the FTS triggers fired for the bulk insert


def test_cli_writes_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out" / "bench-store.json"
    args = argparse.Namespace(conversations=10, messages=250, recall_messages=220, repeats=1, json=out)
    assert run_store_bench_cli(args) == 0
    assert "| measure |" in capsys.readouterr().out
    assert json.loads(out.read_text())["sizes"]["messages"] == 250
