"""The window benchmark and the screenshots, end to end on the real window and model, small: the
shape of the results only (timings depend on the machine, so none are asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from app.bench_ui import load_prompts, percentile, run_bench, stall_summary, to_markdown
from app.screenshots import FILES, SIZE, render_screenshots
from engine.rounds.engine_thread import Engine
from engine.store.store import Store

pytestmark = pytest.mark.model


@pytest.fixture
def engine_factory(loaded):
    return lambda _model: Engine(loader=lambda _spec: loaded, calibrate=False)


def test_percentiles_and_summary() -> None:
    assert percentile([], 99) == 0.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile(list(map(float, range(1, 101))), 99) == 99.0
    s = stall_summary([0.0, 1.0, 60.0])
    assert (s["samples"], s["max_ms"], s["over_target"]) == (3, 60.0, 1)


def test_workload_prompts_keep_earlier_turns_and_the_system_prompt() -> None:
    prompts = {p.id: p for p in load_prompts()}
    backup = prompts["fix-backup-script"]
    assert backup.system == "You are a helpful assistant."
    assert [role for role, _ in backup.history] == ["user", "assistant"]
    assert backup.text and prompts["virus-vs-bacteria"].history == ()


def test_the_stall_benchmark_runs_two_replies_at_once(qapp, engine_factory, tmp_path: Path) -> None:
    prompts = [p for p in load_prompts() if p.id in ("virus-vs-bacteria", "fix-backup-script")]
    result = run_bench(2, 24, data_dir=tmp_path, engine_factory=engine_factory, switch_ms=300, prompts=prompts)

    for key in ("stall_all_generating", "stall_whole_run"):
        s = result[key]
        assert s["samples"] > 0
        assert 0.0 <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    assert result["stall_whole_run"]["samples"] >= result["stall_all_generating"]["samples"]
    assert all(t["stall_ms"] >= 0 for t in result["worst_ticks"])
    assert result["repaints"]["count"] >= 0 and result["live_updates"]["count"] > 0
    assert result["failed"] == {}
    assert [r["status"] for r in result["replies"]] == ["complete", "complete"]
    assert result["tokens"] == sum(r["generated"] for r in result["replies"]) > 0
    assert result["machine"]["cores"] >= 1
    assert "| p99 stall ms |" in to_markdown(result)

    with Store(tmp_path / "lanes.db") as store:
        ids = [r["conversation_id"] for r in result["replies"]]
        for cid in ids:
            messages = store.messages(cid)
            assert messages[-1].role == "assistant" and messages[-1].status == "complete"
            assert messages[-1].content and messages[-2].role == "user"
        backup = store.messages(ids[1])
        assert [m.role for m in backup] == ["user", "assistant", "user", "assistant"]  # earlier turns seeded


def test_screenshots_show_each_state_at_1200_by_800(qapp, engine_factory, tmp_path: Path) -> None:
    conversations = (("Name a colour.",), ("Write a Python function `is_even(n)` in a ```python block.",))
    paths = render_screenshots(tmp_path / "shots", engine_factory=engine_factory, data_dir=tmp_path / "data",
                               max_tokens=40, conversations=conversations)
    assert [p.name for p in paths] == list(FILES)
    images = {p.name: QImage(str(p)) for p in paths}
    for name, image in images.items():
        assert not image.isNull(), name
        if name != "settings-models.png":  # a dialog at its own size
            assert (image.width(), image.height()) == SIZE, name
    assert images["main-window.png"] != images["main-window-origins.png"]  # the origin legend and tints show
    assert images["main-window.png"] != images["reply-versions.png"]  # < 2/2 > on the regenerated reply
    with Store(tmp_path / "data" / "lanes.db") as store:
        convs = store.list_conversations()
        shown = store.messages(convs[1].id)  # the regenerated one; the long message came after it
        assert (shown[-1].version, shown[-1].versions) == (2, 2)
        long = store.messages(convs[0].id)
        assert long[-1].status == "cancelled" and long[0].content.startswith("Summarise")
