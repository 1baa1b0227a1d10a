"""The own-copy-rates A/B: order, summaries and table on literal runs; the real model end to end
(the report itself, on literal data: tests/test_ab_report.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.drafts.copy_rates import CopyRates
from engine.events import Finished, RoundStats
from engine.service import comparisons
from engine.service.compare import CompareSpec, rate_trajectory, run_comparison
from engine.service.session import ReplySettings, stats_dict
from engine.store.ab_report import ABReport, Run, SideSummary, first_difference, summarise, verdict
from engine.store.store import Store
from tests.fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parent.parent
COPY = "Repeat this list exactly, then again in reverse order: apples, pears, plums, cherries, grapes, melons."


def run(side: str, repeat: int, tok_s: float, tokens: tuple[int, ...] = (1, 2, 3), **rows: tuple[int, int]) -> Run:
    stats = {"tokens_per_s": tok_s,
             "rows": {s: {"tested": t, "accepted": a, "granted": t} for s, (t, a) in rows.items()}}
    return Run(side, repeat, 0, "complete", "x", tokens, ("model",) * len(tokens), stats)


def test_the_order_alternates_and_specs_are_checked() -> None:
    spec = CompareSpec(({"role": "user", "content": "q"},), repeats=3, sides=("off", "on", "plain"))
    assert [spec.order(r) for r in range(3)] == [("off", "on", "plain"), ("plain", "on", "off"),
                                                 ("off", "on", "plain")]
    assert spec.request("plain").drafts is False and spec.request("on").own_copy_rates is True
    assert spec.request("off").own_copy_rates is False and spec.request("off").conversation is None
    with pytest.raises(ValueError, match="repeats"):
        CompareSpec((), repeats=0)
    with pytest.raises(ValueError, match="sides"):
        CompareSpec((), sides=("on", "on"))


def test_the_table_has_rounds_medians_the_ratio_and_rows() -> None:
    runs = [run("off", 0, 40.0, context=(10, 8)), run("on", 0, 46.0, context=(8, 8)),
            run("on", 1, 45.0, context=(9, 8)), run("off", 1, 41.0, context=(12, 8))]
    table = ABReport.of(runs, ("off", "on"), 2).markdown()
    assert "| side | round 1 | round 2 | median | spread |" in table
    assert "| off | 40.0 | 41.0 | 40.5 | 2.5% |" in table
    assert "| on | 46.0 | 45.0 | 45.5 | 2.2% |" in table
    assert "on / off: 1.12x" in table and "all 4 complete runs token-equal" in table
    assert "off rows: context 16/22 accepted, 6 wasted" in table
    _off, on = summarise(runs, ("off", "on"))
    assert on.rows["context"] == {"tested": 17, "accepted": 16, "wasted": 1, "granted": 17}


def test_the_first_differing_token_is_found() -> None:
    runs = [run("off", 0, 1.0, (5, 6, 7)), run("on", 0, 1.0, (5, 6, 7)), run("on", 1, 1.0, (5, 9, 7))]
    diff = first_difference(runs)
    assert (diff.side, diff.repeat, diff.position, diff.expected, diff.got) == ("on", 1, 1, 6, 9)
    shorter = first_difference([run("off", 0, 1.0, (5, 6)), run("on", 0, 1.0, (5,))])
    assert (shorter.position, shorter.expected, shorter.got) == (1, 6, None)
    assert "tokens differ: on round 2 has 9 at token 1 where off round 1 has 6" in ABReport.of(runs).markdown()


def test_the_rate_trajectory_replays_copy_rates() -> None:
    rounds = [RoundStats("r", 1, 1, 4, 3, 2, "context", 0.0, 0.0),  # 3 granted, 2 accepted: 3 tested
              RoundStats("r", 2, 1, 1, 0, 0, None, 0.0, 0.0),  # no window: no point
              RoundStats("r", 3, 1, 5, 4, 4, "context", 0.0, 0.0),  # all 4 accepted
              RoundStats("r", 4, 1, 4, 3, 1, "context", 0.0, 0.0, "resync")]  # a doubtful window
    points = rate_trajectory(None, 0.94, rounds, doubt_prior=0.6)
    # Each window: its first row to "context.first", the rows after it to "context".
    expected = CopyRates(prior=0.94)
    expected.record("context.first", 1, 1)
    expected.record("context", 2, 1)
    after_1 = [round(expected.rate("context.first"), 4), round(expected.rate("context"), 4)]
    expected.record("context.first", 1, 1)
    expected.record("context", 3, 3)
    after_3 = [round(expected.rate("context.first"), 4), round(expected.rate("context"), 4)]
    assert points == [{"round": 1, "source": "context.first", "rate": after_1[0]},
                      {"round": 1, "source": "context", "rate": after_1[1]},
                      {"round": 3, "source": "context.first", "rate": after_3[0]},
                      {"round": 3, "source": "context", "rate": after_3[1]},
                      # (1 + 4 * 0.6) / (1 + 4) and (0 + 4 * 0.94) / (1 + 4): its own histories
                      {"round": 4, "source": "resync", "rate": 0.68},
                      {"round": 4, "source": "resync.rest", "rate": 0.752}]


@pytest.mark.model
def test_every_side_equals_mlx_lm_and_the_on_rates_match_its_history(loaded, chat_prompt, reference) -> None:
    from engine.rounds.engine_thread import Engine

    spec = CompareSpec(({"role": "user", "content": COPY},), max_tokens=48, repeats=2)
    with Engine(loader=lambda _s: loaded, calibrate=False) as engine:
        runs = run_comparison(engine.submit, spec, loaded.family.copy_rate)
    assert [(r.side, r.repeat, r.position) for r in runs] == [("off", 0, 0), ("on", 0, 1), ("on", 1, 0),
                                                              ("off", 1, 1)]
    want = reference(chat_prompt(COPY), 48)
    assert all(list(r.tokens) == want and r.status == "complete" for r in runs)
    assert first_difference(runs) is None
    on = runs[1]
    assert on.rates, "the copy-friendly prompt copied"
    last = on.rates[-1]
    after = CopyRates.from_snapshot(on.copy_history_after, prior=loaded.family.copy_rate)
    assert last["rate"] == round(after.rate(last["source"]), 4)


@pytest.mark.model
def test_lanes_compare_prints_the_table_and_saves_the_runs(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "engine.cli", "compare", "--prompt", COPY, "--repeats", "1",
                          "--max-tokens", "32", "--plain", "--data-dir", str(tmp_path), "--json",
                          str(tmp_path / "out.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "| side | round 1 | median | spread |" in res.stdout and "| plain |" in res.stdout
    assert "all 3 complete runs token-equal" in res.stdout and "Same text" in res.stdout
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["token_equal"] is True and len(doc["runs"]) == 3 and doc["device"]
    with Store.open(tmp_path) as store:
        saved = store.comparison(doc["comparison"])
    assert doc == json.loads(json.dumps(comparisons.comparison_document(saved, doc["device"])))
    assert doc["runs"][0]["stats"]["settings"]["max_tokens"] == 32  # a chat reply's statistics
    assert sorted(r.side for r in saved.runs) == ["off", "on", "plain"]
    assert saved.settings["repeats"] == 1 and saved.messages[0]["content"] == COPY


def test_a_failed_repeat_shows_its_status_and_odd_stats_read_as_unknown() -> None:
    runs = [run("off", 0, 40.0), run("on", 0, 46.0),
            Run("off", 1, 1, "error", error="boom"), run("on", 1, 45.0),
            Run("off", 2, 0, "complete", "x", (1, 2, 3), (), {"tokens_per_s": None, "rows": {"context": None}})]
    table = ABReport.of(runs, ("off", "on"), 3).markdown()
    assert "| off | 40.0 | error | ? | 40.0 | 0.0% |" in table  # the unknown speed is not a 0 in the median
    assert "| on | 46.0 | 45.0 | – | 45.5 | 2.2% |" in table
    assert "- off round 2: error: boom" in table


def test_the_verdict_says_it_in_a_sentence_and_warns_when_the_noise_is_larger() -> None:
    off = SideSummary("off", (50.0,), {0: 50.0}, 50.0, 0.10, {})
    fast = SideSummary("on", (65.0,), {0: 65.0}, 65.0, 0.20, {})
    close = SideSummary("on", (52.0,), {0: 52.0}, 52.0, 0.20, {})
    assert verdict([off, fast], True) == ("Same text; own copy rates on was 1.30x as fast as off, more than the "
                                          "runs varied (up to 20%).")
    assert verdict([off, close], True).endswith("within how much the runs varied (up to 20%): run more repeats "
                                                "before trusting the difference.")
    assert verdict([off, fast], False).startswith("The texts differ; ")
    assert verdict([off], None) == "Not enough runs yet."


def test_a_run_stores_the_statistics_a_chat_reply_stores() -> None:
    history = {"context": {"accepted": 3.0, "tested": 4.0}}
    spec = CompareSpec(({"role": "user", "content": "q"},), max_tokens=8, repeats=1, sides=("off", "on", "plain"),
                       temperature=0.5, top_p=0.9, copy_history=history)
    finished: list[Finished] = []
    with FakeEngine(None, 0.0) as engine:
        runs = run_comparison(engine.submit, spec, 0.94,
                              on_event=lambda _run, ev: finished.append(ev) if isinstance(ev, Finished) else None)
    for run, ev in zip(runs, finished, strict=True):
        own = run.side == "on"
        assert run.stats == stats_dict(ev.stats, "eos", ReplySettings(8, 0.5, 0.9, own_copy_rates=own), history)
        assert run.stats["settings"]["own_copy_rates"] is own and run.stats["copy_history_before"] == history
        assert run.status == "complete" and run.tok_s == pytest.approx(ev.stats.tokens_per_s)
