"""Tests for engine.drafts.context_cost: what a key of context adds to a forward pass."""

import pytest

from engine.drafts.context_cost import NO_CONTEXT_COST, ContextCost, ContextSample, fit

# The docstring's table: (B, W, ms at 64 keys, ms at 2000 keys), timed ad hoc on the 2-core CPU.
MEASURED_MS = [(1, 1, 153, 216), (1, 16, 227, 563), (4, 1, 215, 431), (4, 8, 264, 1067)]


def samples(rows: list[tuple[int, int, float, float]], short: int = 64, long: int = 2000) -> list[ContextSample]:
    return [ContextSample(b, w, short, s / 1000, long, t / 1000) for b, w, s, t in rows]


def test_worked_example_from_docstring() -> None:
    cost = fit(samples(MEASURED_MS))
    assert cost.per_row == pytest.approx(9.62e-6, rel=1e-3)
    assert cost.per_stream == pytest.approx(2.19e-5, rel=1e-3)
    assert cost.seconds(4, 8, 2000) == pytest.approx(0.791, abs=5e-4)
    assert cost.seconds(4, 8, 64) == pytest.approx(0.0253, abs=5e-4)
    # The fit reproduces what each shape added between the two contexts, within the noise.
    for b, w, short_ms, long_ms in MEASURED_MS:
        added = cost.seconds(b, w, 2000) - cost.seconds(b, w, 64)
        assert added == pytest.approx((long_ms - short_ms) / 1000, rel=0.3)


def test_padded_and_grouped_terms() -> None:
    cost = ContextCost(per_stream=2e-5, per_row=1e-5)
    assert cost.seconds(4, 8, 1000) == pytest.approx(1000 * 4 * (2e-5 + 8e-5))
    # Grouped: one stream attends 8 rows, three attend one row each.
    assert cost.seconds(4, 8, 1000, wide=1) == pytest.approx(1000 * (3 * 3e-5 + 1e-4))
    assert cost.seconds(4, 8, 1000, wide=4) == cost.seconds(4, 8, 1000)  # all draft: padded
    assert cost.seconds(4, 8, 1000, wide=0) == cost.seconds(4, 8, 1000)
    assert cost.seconds(4, 8, 0) == 0.0 and cost.seconds(4, 8, -5) == 0.0
    assert cost.seconds(4, 8, 2000) == pytest.approx(2 * cost.seconds(4, 8, 1000))  # linear in keys
    assert NO_CONTEXT_COST.seconds(4, 32, 8000) == 0.0


def test_noise_never_makes_rows_or_streams_cheaper_with_context() -> None:
    # Wider passes added *less* per key: the row term clamps to 0 and the stream term takes the mean.
    flat = fit(samples([(1, 1, 100, 160), (1, 16, 200, 250)]))
    assert flat.per_row == 0.0
    assert flat.per_stream == pytest.approx((0.060 + 0.050) / 2 / 1936)
    # A line whose intercept would be negative goes through the origin instead.
    steep = fit(samples([(1, 1, 100, 100.5), (1, 16, 100, 300)]))
    assert steep.per_stream == 0.0
    assert steep.per_row == pytest.approx((0.0005 / 1936 * 1 + 0.2 / 1936 * 16) / (1 + 256))
    # A longer context measured as cheaper everywhere prices context at nothing.
    assert fit(samples([(1, 1, 100, 90), (4, 8, 200, 180)])) == NO_CONTEXT_COST


def test_unusable_samples_are_skipped() -> None:
    assert fit([]) == NO_CONTEXT_COST
    bad = [
        ContextSample(1, 1, 64, 0.1, 64, 0.2),  # no added keys
        ContextSample(1, 8, 64, float("nan"), 1024, 0.2),
        ContextSample(4, 8, 64, 0.1, 1024, 0.0),
    ]
    assert fit(bad) == NO_CONTEXT_COST
    one = fit([*bad, ContextSample(1, 1, 64, 0.100, 1064, 0.130)])
    assert one.per_row == 0.0 and one.per_stream == pytest.approx(0.03 / 1000)
