"""Tests for engine.drafts.copy_rates: per-stream copy rates by source."""

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.drafts.copy_rates import (
    DEFAULT_DECAY,
    DOUBT_PRIOR,
    PRIOR_ROWS,
    CopyRates,
    SourceHistory,
    doubtful,
    first_key,
)


def test_fresh_rate_is_prior() -> None:
    rates = CopyRates()
    assert rates.rate("context") == 0.94
    assert rates.rate("recall") == 0.94
    assert CopyRates(prior=0.5).rate("context") == 0.5


def test_worked_example_from_docstring() -> None:
    rates = CopyRates()
    assert DEFAULT_DECAY == 0.9 and PRIOR_ROWS == 4.0
    rates.record("context", tested=3, accepted=2)
    assert rates.rate("context") == pytest.approx(5.76 / 7)  # 0.8229
    rates.record("context", tested=1, accepted=0)
    assert rates.snapshot()["context"] == pytest.approx({"accepted": 1.8, "tested": 3.7})
    assert rates.rate("context") == pytest.approx(5.56 / 7.7)  # 0.7221
    rates.record("context", tested=4, accepted=4)
    assert rates.snapshot()["context"] == pytest.approx({"accepted": 5.62, "tested": 7.33})
    assert rates.rate("context") == pytest.approx(9.38 / 11.33)  # 0.8279
    # Sources are independent.
    assert rates.rate("recall") == 0.94


def test_one_bad_window_does_not_shut_copying_off_but_three_do() -> None:
    # 4 CPU streams: a first draft row pays only above ~0.58 (see allocator tests).
    rates = CopyRates()
    rates.record("context", tested=1, accepted=0)
    assert rates.rate("context") == pytest.approx(0.752)
    rates.record("context", tested=1, accepted=0)
    rates.record("context", tested=1, accepted=0)
    assert rates.rate("context") == pytest.approx(0.5604, abs=1e-4)


def test_broken_history_and_recovery_through_probes() -> None:
    rates = CopyRates()
    for _ in range(10):
        rates.record("recall", tested=1, accepted=0)
    broken = rates.rate("recall")
    assert broken == pytest.approx(0.3576, abs=1e-4)
    seen = [broken]
    for _ in range(5):
        rates.record("recall", tested=1, accepted=1)  # an accepted one-row probe
        seen.append(rates.rate("recall"))
    assert all(b > a for a, b in itertools.pairwise(seen))
    assert seen[3] == pytest.approx(0.5647, abs=1e-4)
    assert seen[5] == pytest.approx(0.6578, abs=1e-4)


def test_record_rejects_impossible_windows_and_ignores_empty_ones() -> None:
    rates = CopyRates()
    with pytest.raises(ValueError):
        rates.record("context", tested=2, accepted=3)
    with pytest.raises(ValueError):
        rates.record("context", tested=-1, accepted=0)
    rates.record("context", tested=0, accepted=0)
    assert rates.snapshot() == {}
    assert rates.rate("context") == 0.94


def test_constructor_validates_and_copies_history() -> None:
    with pytest.raises(ValueError):
        CopyRates(prior=1.5)
    with pytest.raises(ValueError):
        CopyRates(decay=0.0)
    with pytest.raises(ValueError):
        CopyRates(probe_every=0)
    given_history = {"context": SourceHistory(accepted=2.0, tested=3.0)}
    rates = CopyRates(history=given_history)
    rates.record("context", tested=1, accepted=1)
    assert given_history["context"] == SourceHistory(accepted=2.0, tested=3.0)


def test_probe_rule() -> None:
    rates = CopyRates(probe_every=8)
    for _ in range(7):
        rates.tick()
    assert not rates.probe_due("recall")
    rates.tick()
    assert rates.probe_due("recall")
    assert rates.probe_due("context")
    rates.record("recall", tested=2, accepted=1)  # the probe's window resets only its own source
    assert not rates.probe_due("recall")
    assert rates.probe_due("context")
    for _ in range(7):
        rates.tick()
    assert not rates.probe_due("recall")
    rates.tick()
    assert rates.probe_due("recall")


def test_barren_windows_double_the_probe_interval_up_to_a_cap() -> None:
    rates = CopyRates(probe_every=8)
    waits = []
    for _ in range(5):
        rates.record("recall", tested=1, accepted=0)
        waits.append(rates.probe_interval("recall"))
    assert waits == [16, 32, 64, 64, 64]
    for _ in range(63):
        rates.tick()
    assert not rates.probe_due("recall")
    rates.tick()
    assert rates.probe_due("recall")
    assert rates.probe_interval("context") == 8  # other sources keep their own interval
    rates.record("recall", tested=3, accepted=2)  # anything landing resets it
    assert rates.probe_interval("recall") == 8


def test_probe_due_stays_until_a_window_is_recorded() -> None:
    rates = CopyRates(probe_every=2)
    for _ in range(5):
        rates.tick()
    assert rates.probe_due("context")
    rates.record("context", tested=0, accepted=0)  # nothing verified: not a probe
    assert rates.probe_due("context")
    rates.record("context", tested=1, accepted=1)
    assert not rates.probe_due("context")


def test_snapshot_round_trip_through_json() -> None:
    rates = CopyRates()
    rates.record("context", tested=3, accepted=2)
    rates.record("recall", tested=5, accepted=5)
    data = json.loads(json.dumps(rates.snapshot()))
    again = CopyRates.from_snapshot(data)
    assert again.snapshot() == rates.snapshot()
    assert again.rate("context") == rates.rate("context")
    assert again.rate("recall") == rates.rate("recall")


def test_from_snapshot_passes_options() -> None:
    rates = CopyRates.from_snapshot(
        {"context": {"accepted": 1, "tested": 2}}, prior=0.5, decay=0.5, probe_every=3
    )
    assert (rates.prior, rates.decay, rates.probe_every) == (0.5, 0.5, 3)
    assert rates.rate("context") == pytest.approx((1 + 2.0) / (2 + 4))


@pytest.mark.parametrize(
    "data, expected",
    [
        (None, {}),
        ("garbage", {}),
        ([1, 2], {}),
        ({}, {}),
        ({"context": "x"}, {}),
        ({3: {"accepted": 1, "tested": 1}}, {}),
        ({"context": {}}, {"context": {"accepted": 0.0, "tested": 0.0}}),
        ({"context": {"accepted": -3, "tested": 2}}, {"context": {"accepted": 0.0, "tested": 2.0}}),
        ({"context": {"accepted": 9, "tested": 2}}, {"context": {"accepted": 2.0, "tested": 2.0}}),
        ({"context": {"accepted": 1, "tested": -2}}, {"context": {"accepted": 0.0, "tested": 0.0}}),
        ({"context": {"accepted": "1", "tested": None}}, {"context": {"accepted": 0.0, "tested": 0.0}}),
        (
            {"context": {"accepted": math.nan, "tested": math.inf}},
            {"context": {"accepted": 0.0, "tested": 0.0}},
        ),
        ({"context": {"accepted": True, "tested": 3}}, {"context": {"accepted": 0.0, "tested": 3.0}}),
        (
            {"context": {"accepted": 1, "tested": 2, "junk": 7}, "recall": {"accepted": 2.5, "tested": 4}},
            {"context": {"accepted": 1.0, "tested": 2.0}, "recall": {"accepted": 2.5, "tested": 4.0}},
        ),
    ],
)
def test_from_snapshot_tolerates_damage(data: object, expected: dict) -> None:
    rates = CopyRates.from_snapshot(data)  # type: ignore[arg-type]
    assert rates.snapshot() == expected
    for source in ("context", "recall"):
        assert 0.0 <= rates.rate(source) <= 1.0


windows = st.lists(
    st.tuples(st.sampled_from(["context", "recall"]), st.integers(0, 32)).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.integers(0, t[1]))
    ),
    max_size=60,
)


@settings(deadline=None)  # shared 2-core box: timing deadlines flake under load
@given(windows, st.floats(0.0, 1.0), st.floats(0.01, 1.0))
def test_rate_stays_a_probability_and_counts_stay_consistent(
    ws: list[tuple[str, int, int]], prior: float, decay: float
) -> None:
    rates = CopyRates(prior=prior, decay=decay)
    for source, tested, accepted in ws:
        rates.record(source, tested=tested, accepted=accepted)
        rates.tick()
        r = rates.rate(source)
        assert 0.0 <= r <= 1.0 + 1e-12
    for counts in rates.snapshot().values():
        assert 0.0 <= counts["accepted"] <= counts["tested"] + 1e-9


def test_a_windows_first_row_and_the_rows_after_it_are_counted_apart() -> None:
    rates = CopyRates()
    assert rates.record_window("context", granted=6, accepted=3) == 4  # rows 1-3 land, row 4 breaks
    assert rates.snapshot() == {"context.first": {"accepted": 1.0, "tested": 1.0},
                                "context": {"accepted": 2.0, "tested": 3.0}}
    assert rates.record_window("context", granted=5, accepted=0) == 1  # broke at once: first rows only
    assert rates.snapshot()["context.first"] == {"accepted": 0.9, "tested": 1.9}
    assert rates.snapshot()["context"] == {"accepted": 2.0, "tested": 3.0}
    assert rates.record_window("context", granted=1, accepted=1) == 1  # one row: nothing after it
    assert rates.snapshot()["context"] == {"accepted": 2.0, "tested": 3.0}
    # Row 1 from the first-row history, (0.81 + 1 + 3.76) / (1.71 + 1 + 4); rows after it from "context".
    assert rates.first_rate("context") == pytest.approx(5.57 / 6.71)
    assert rates.rate("context") == pytest.approx(5.76 / 7)


def test_first_rate_is_the_sources_until_it_has_a_history() -> None:
    rates = CopyRates.from_snapshot({"context": {"accepted": 0.0, "tested": 30.0}})  # stored before first rows
    assert rates.first_rate("context") == rates.rate("context") < 0.2
    assert rates.first_rate("context", "resync") == DOUBT_PRIOR == 0.45  # doubtful ones: the doubt prior


def test_doubtful_windows_keep_their_own_histories_from_the_doubt_prior() -> None:
    rates = CopyRates(prior=0.94, doubt_prior=0.6)
    assert rates.first_rate("context", "context.short") == 0.6
    assert rates.rest_rate("context", "context.short") == 0.94  # the source's rate until it has its own
    # A short window: first row lands, row 2 lands, row 3 breaks.
    assert rates.record_window("context", granted=5, accepted=2, first="context.short") == 3
    assert rates.snapshot() == {"context.short": {"accepted": 1.0, "tested": 1.0},
                                "context.short.rest": {"accepted": 1.0, "tested": 2.0}}
    assert rates.first_rate("context", "context.short") == pytest.approx((1 + 2.4) / 5)
    assert rates.rest_rate("context", "context.short") == pytest.approx((1 + 3.76) / 6)
    assert rates.rate("context") == 0.94  # long windows' continuations are untouched
    # One broken first row: (0.9 * 1 + 0 + 2.4) / (0.9 * 1 + 1 + 4) = 0.5593.
    rates.record_window("context", granted=3, accepted=0, first="context.short")
    assert rates.first_rate("context", "context.short") == pytest.approx(3.3 / 5.9)
    with pytest.raises(ValueError, match="doubt_prior"):
        CopyRates(doubt_prior=1.2)


def test_first_keys_name_how_the_window_was_found() -> None:
    assert first_key("context") == "context.first"
    assert first_key("context", short=True) == "context.short"
    assert first_key("recall", short=True) == "recall.short"
    assert first_key("context", resync=True, short=True) == "resync"
    assert first_key("context", short=True, brief=True) == "context.brief"
    assert [doubtful(k) for k in ("context.first", "context.short", "resync", "context", "context.brief")] == [
        False, True, True, False, True]
    # A brief kind keeps its own histories, apart from the short kind's.
    rates = CopyRates(doubt_prior=0.45)
    rates.record_window("context", granted=2, accepted=0, first="context.brief")
    assert rates.first_rate("context", "context.short") == 0.45
    assert rates.first_rate("context", "context.brief") == pytest.approx(1.8 / 5)
