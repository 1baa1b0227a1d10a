"""The A/B report (engine/store/ab_report.py) on literal runs: its table, notes, verdict and JSON
document, from runs, from saved settings and from a transcript's comparison."""

from __future__ import annotations

import doctest
import json
from typing import Any

from engine.store import ab_report
from engine.store.ab_report import ABReport, Run


def done(side: str, repeat: int, position: int, stats: dict[str, Any] | None,
         tokens: tuple[int, ...] | None = (1, 2, 3)) -> Run:
    return Run(side, repeat, position, "complete", "abc", tokens, ("model",) * 3, stats)


RUNS = [  # four rounds planned; the last never ran
    done("off", 0, 0, {"tokens_per_s": 40.0, "rows": {"context": {"tested": 10, "accepted": 8, "granted": 12}}}),
    done("on", 0, 1, {"tokens_per_s": 50.0}, tokens=None),  # its token ids were not saved
    Run("on", 1, 0, "cancelled", "ab", stats={"tokens_per_s": 3.0}),  # a stopped run's speed is no result
    done("off", 1, 1, {"generated": 20, "seconds": 0.5}),  # no tokens_per_s: generated / seconds
    done("off", 2, 0, {"reason": "eos"}),  # no speed at all
    Run("on", 2, 1, "error", error="out of memory <b>"),
]


def test_the_table_shows_each_runs_status_a_missing_speed_and_every_note() -> None:
    report = ABReport.of(RUNS, ("off", "on"), 4)
    header, rows, notes = report.table()
    assert header == ["side", "round 1", "round 2", "round 3", "round 4", "median", "spread"]
    assert rows == [["off", "40.0", "40.0", "?", "–", "40.0", "0.0%"],
                    ["on", "50.0", "cancelled", "error", "–", "50.0", "0.0%"]]
    assert notes == ["on / off: 1.25x (median tok/s)",
                     "token ids not saved for every complete run: token equality unknown",
                     "off rows: context 8/10 accepted, 2 wasted", "on rows: none tested",
                     "on round 3: error: out of memory <b>"]
    assert report.token_equal is None and report.difference is None
    assert report.verdict().startswith("Token ids not saved; own copy rates on was 1.25x as fast as off")
    md = report.markdown()
    assert md.startswith("| side | round 1 | round 2 | round 3 | round 4 | median | spread |\n|---|---|---|---|---|---|---|\n"
                         "| off | 40.0 | 40.0 | ? | – | 40.0 | 0.0% |\n| on | 50.0 | cancelled | error | – | 50.0 | 0.0% |\n\n")
    assert md.endswith("- on round 3: error: out of memory <b>\n")


def test_the_token_check_says_how_runs_differ_or_why_it_cannot_tell() -> None:
    one = ABReport.of([done("off", 0, 0, {"tokens_per_s": 40.0}), Run("on", 0, 1, "error", error="x")])
    assert one.token_check() == "fewer than two complete runs: nothing to check tokens against"
    assert one.token_equal is None and one.verdict() == "Not enough runs yet."
    shorter = ABReport.of([done("off", 0, 0, {"tokens_per_s": 40.0}),
                           done("on", 0, 1, {"tokens_per_s": 44.0}, tokens=(1, 2)),
                           done("on", 1, 0, {"tokens_per_s": 46.0}, tokens=(1, 2))])
    assert shorter.token_equal is False
    assert shorter.token_check() == "tokens differ: on round 1 has the end at token 2 where off round 1 has 3"
    d = shorter.difference
    assert d is not None and (d.side, d.repeat, d.position, d.expected, d.got) == ("on", 0, 2, 3, None)
    assert shorter.verdict().startswith("The texts differ; own copy rates on was 1.12x as fast as off")
    equal = ABReport.of([done("off", 0, 0, {"tokens_per_s": 40.0}), done("on", 0, 1, {"tokens_per_s": 40.4})])
    assert equal.token_equal is True and equal.token_check() == "all 2 complete runs token-equal"
    assert equal.verdict() == ("Same text; own copy rates on was 1.01x as fast as off, more than the runs "
                               "varied (up to 0%).")
    empty = ABReport.of([], ("off", "on"), 2)
    assert empty.table() == (["side", "round 1", "round 2", "median", "spread"],
                             [["off", "–", "–", "–", "–"], ["on", "–", "–", "–", "–"]], ["no runs"])


def test_sides_and_rounds_come_from_the_runs_or_the_saved_settings_within_reason() -> None:
    runs = [done("plain", 0, 0, {"tokens_per_s": 30.0}), done("on", 0, 1, {"tokens_per_s": 33.0})]
    assert (ABReport.of(runs).sides, ABReport.of(runs).repeats) == (("on", "plain"), 1)
    planned = ABReport.planned(runs, {"sides": ["off", "on", "plain"], "repeats": 3})
    assert planned.sides == ("off", "on", "plain") and planned.repeats == 3  # a stopped comparison's plan
    odd = ABReport.planned(runs, {"sides": ["both", 7], "repeats": 10**9})  # an imported file may say anything
    assert odd.sides == ("on", "plain") and odd.repeats == 1
    assert ABReport.planned(runs, {"repeats": True}).repeats == 1
    assert ABReport.of(runs).ratios() == {}  # no off side: no ratio


def test_speeds_that_are_not_numbers_read_as_unknown() -> None:
    for stats in ({"tokens_per_s": True}, {"tokens_per_s": float("nan")}, {"generated": 5, "seconds": 0},
                  {"generated": "5", "seconds": 1}, None, []):
        assert Run("off", 0, 0, "complete", stats=stats).tok_s is None, stats  # type: ignore[arg-type]
    assert Run("off", 0, 0, stats={"generated": 5, "seconds": 0.5}).tok_s == 10.0


def test_a_transcripts_comparison_reads_as_the_same_report() -> None:
    c = {"settings": {"repeats": 2, "sides": ["off", "on"]}, "runs": [
        {"side": "off", "repeat": 0, "position": 0, "content": "ab", "status": "complete", "error": None,
         "stats": {"tokens_per_s": 40.0}, "origins": "mc", "tokens": [7, 8], "copy_history_after": None,
         "rates": None},
        {"side": "on", "repeat": 0, "position": 1, "content": "ab", "status": "complete", "error": None,
         "stats": {"tokens_per_s": 48.0}, "origins": "mr", "tokens": [7, 8], "copy_history_after": None,
         "rates": [{"round": 1, "source": "context", "rate": 0.9}]},
    ]}
    report = ABReport.from_document(c)
    runs = [Run("off", 0, 0, "complete", "ab", (7, 8), ("model", "context"), {"tokens_per_s": 40.0}),
            Run("on", 0, 1, "complete", "ab", (7, 8), ("model", "recall"), {"tokens_per_s": 48.0},
                rates=[{"round": 1, "source": "context", "rate": 0.9}])]
    assert report == ABReport.planned(runs, c["settings"])
    assert report.table()[1] == [["off", "40.0", "–", "40.0", "0.0%"], ["on", "48.0", "–", "48.0", "0.0%"]]


def test_the_document_is_json_with_the_callers_head_first() -> None:
    report = ABReport.of(RUNS, ("off", "on"), 4)
    doc = json.loads(json.dumps(report.document(comparison=7, model="m")))
    assert list(doc) == ["comparison", "model", "runs", "summary", "verdict", "token_equal", "first_difference"]
    assert doc["token_equal"] is None and doc["first_difference"] is None and doc["verdict"] == report.verdict()
    assert [(r["side"], r["repeat"], r["tokens"]) for r in doc["runs"][:2]] == [("off", 0, [1, 2, 3]), ("on", 0, None)]
    assert [(s["side"], s["median"], s["tok_s"]) for s in doc["summary"]] == [("off", 40.0, [40.0, 40.0]),
                                                                            ("on", 50.0, [50.0])]


def test_the_worked_example_in_the_docstring_holds() -> None:
    assert doctest.testmod(ab_report).failed == 0
