"""ChatService.start_comparison on the scripted engine: runs saved, order alternated, stop saves what ran."""

from __future__ import annotations

from pathlib import Path

from engine.service.chat_service import ChatService, ComparisonBegun, ComparisonSaved, RunDone
from engine.store.store import Store
from tests.fake_engine import FakeEngine


def test_a_comparison_runs_every_side_and_is_saved(tmp_path: Path) -> None:
    svc = ChatService(tmp_path / "lanes.db", engine_factory=lambda m: FakeEngine(m, delay=0.001))
    seen: list[object] = []
    try:
        task = svc.start_comparison(seen.append, prompt="copy this", repeats=2, max_tokens=64, plain=True)
        saved = task.done.result(timeout=30)
    finally:
        svc.close()
    assert [(r.side, r.repeat, r.position) for r in saved.runs] == [
        ("off", 0, 0), ("on", 0, 1), ("plain", 0, 2), ("plain", 1, 0), ("on", 1, 1), ("off", 1, 2)]
    assert saved.status == "complete" and {r.content for r in saved.runs} == {"Echo: copy this"}
    assert isinstance(seen[0], ComparisonBegun) and isinstance(seen[-1], ComparisonSaved)
    assert sum(isinstance(e, RunDone) for e in seen) == 6
    with Store(tmp_path / "lanes.db") as store:
        assert store.comparisons()[0].id == saved.id


def test_stopping_a_comparison_saves_what_ran_as_cancelled(tmp_path: Path) -> None:
    svc = ChatService(tmp_path / "lanes.db", engine_factory=lambda m: FakeEngine(m, delay=0.002))
    try:
        task = svc.start_comparison(lambda ev: task.cancel() if isinstance(ev, RunDone) else None,
                                    prompt="SLOW", repeats=3)
        saved = task.done.result(timeout=60)
    finally:
        svc.close()
    assert saved.status == "cancelled" and 1 <= len(saved.runs) <= 2
    assert saved.runs[0].status == "complete"
