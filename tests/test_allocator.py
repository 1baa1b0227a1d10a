"""Tests for engine.drafts.allocator: who gets draft rows this round."""

import doctest
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.drafts.allocator
import engine.drafts.copy_rates
import engine.drafts.cost_model
from engine.drafts.allocator import Allocation, Offer, allocate
from engine.drafts.copy_rates import CopyRates
from engine.drafts.cost_model import CostModel

# Measured on the target machine: SmolLM2-135M, 2-core CPU, milliseconds.
CPU_MS = {
    (1, 1): 64, (1, 4): 80, (1, 8): 98, (1, 16): 114,
    (2, 1): 72, (2, 4): 108, (2, 8): 139, (2, 16): 189,
    (4, 1): 101, (4, 4): 145, (4, 8): 218, (4, 16): 339,
}  # fmt: skip
CPU = CostModel({shape: ms / 1000 for shape, ms in CPU_MS.items()})
GPU = CostModel({(1, 1): 0.004, (1, 8): 0.0045, (4, 1): 0.005, (4, 8): 0.006, (4, 16): 0.007})


def throughput(a: Allocation) -> float:
    return a.expected_tokens / a.seconds


def test_docstring_examples() -> None:
    for module in (engine.drafts.allocator, engine.drafts.cost_model, engine.drafts.copy_rates):
        failed, _ = doctest.testmod(module)
        assert failed == 0, module.__name__


@pytest.mark.parametrize("overhead", [0.0, 0.005])
def test_seed_check_broken_copy_history_gets_no_rows(overhead: float) -> None:
    # A stream whose copies always break: 10 windows, each rejected at its first row.
    broken = CopyRates()
    for _ in range(10):
        broken.record("context", tested=1, accepted=0)
    assert broken.rate("context") == pytest.approx(0.358, abs=1e-3)
    window = 16
    offers = [Offer(0, broken.rate("context"), window), Offer(1, 0.94, window)]
    a = allocate(offers, 4, CPU.cost, overhead)
    assert a.rows[0] == 0  # only its own row
    assert a.rows[1] > 0  # the same window at the fixed 0.94 still drafts
    # Each on its own, too.
    assert allocate([Offer(0, broken.rate("context"), window)], 4, CPU.cost, overhead).rows == (0, 0, 0, 0)
    assert allocate([Offer(0, 0.94, window)], 4, CPU.cost, overhead).rows[0] > 0


def test_worked_example_from_module_docstring() -> None:
    a = allocate([Offer(0, 0.94, 16), Offer(1, 0.36, 16)], 4, CPU.cost, 0.0)
    assert a.rows == (3, 0, 0, 0)
    assert a.expected_tokens == pytest.approx(4 + 0.94 + 0.94**2 + 0.94**3)  # 6.654
    assert a.seconds == pytest.approx(0.145)
    assert throughput(a) == pytest.approx(45.89, abs=0.01)


def test_recovered_stream_drafts_again() -> None:
    rates = CopyRates()
    for _ in range(10):
        rates.record("recall", tested=1, accepted=0)
    assert allocate([Offer(0, rates.rate("recall"), 16)], 4, CPU.cost, 0.0).rows[0] == 0
    for _ in range(5):
        rates.record("recall", tested=1, accepted=1)  # five accepted one-row probes
    assert allocate([Offer(0, rates.rate("recall"), 16)], 4, CPU.cost, 0.0).rows[0] >= 1


@pytest.mark.parametrize("n_streams", [2, 4])
def test_zero_rows_when_copying_cannot_pay(n_streams: int) -> None:
    offers = [Offer(s, 0.1, 16) for s in range(n_streams)]
    a = allocate(offers, n_streams, CPU.cost, 0.0)
    assert a.rows == (0,) * n_streams
    assert a.expected_tokens == n_streams
    assert a.seconds == CPU.cost(n_streams, 1)


def test_single_cpu_stream_pays_for_cheap_rows() -> None:
    # W=1 -> 2 costs 64 -> 69.3 ms on one stream, so even r=0.5 earns one row: 1.5/69.3 > 1/64.
    assert allocate([Offer(0, 0.5, 16)], 1, CPU.cost, 0.0).rows == (1,)


def test_a_resync_window_is_priced_by_its_first_row() -> None:
    # Rows worth r1 * r**(j-1): a first row at 0.4 keeps the window shut however good the rest.
    assert allocate([Offer(0, 0.99, 16, first_rate=0.4)], 1, GPU.cost, 0.0).rows == (0,)
    a = allocate([Offer(0, 0.9, 16, first_rate=0.6)], 1, GPU.cost, 0.0)
    # 0.6 * 0.9**(j-1) >= 0.3 holds up to j = 7.
    assert a.rows == (7,)
    assert a.expected_tokens == pytest.approx(1 + sum(0.6 * 0.9 ** (j - 1) for j in range(1, 8)))
    assert Offer(0, 0.9, 4).value(3) == pytest.approx(0.9**3)  # no first rate: r**j


def test_a_window_more_likely_to_break_than_land_is_not_started() -> None:
    # r=0.45 would pay on one CPU stream (1.45/69.3 > 1/64), but its first row is more likely wasted.
    assert engine.drafts.allocator.MIN_FIRST_ROW > 0.45
    assert allocate([Offer(0, 0.45, 16)], 1, CPU.cost, 0.0).rows == (0,)
    # A started window keeps rows below MIN_FIRST_ROW while they stay above MIN_ROW_VALUE.
    assert allocate([Offer(0, 0.8, 16)], 1, GPU.cost, 0.0).rows == (5,)
    assert 0.8**5 >= engine.drafts.allocator.MIN_ROW_VALUE > 0.8**6
    # A probe still gets its one row.
    assert allocate([Offer(0, 0.2, 16, probe=True)], 1, CPU.cost, 0.0).rows == (1,)


def test_rows_below_min_value_are_never_verified_even_when_free() -> None:
    # Stream 0 widens the pass to 17; stream 1's rows at 0.2 would cost nothing more, yet stay out.
    a = allocate([Offer(0, 0.99, 16), Offer(1, 0.2, 16)], 2, GPU.cost, 0.0)
    assert a.rows == (16, 0)
    # Rows of a 0.6 window stop where 0.6**j falls under MIN_ROW_VALUE (j = 3).
    assert allocate([Offer(0, 0.6, 16)], 1, GPU.cost, 0.0).rows == (2,)
    assert 0.6**2 >= engine.drafts.allocator.MIN_ROW_VALUE > 0.6**3


def test_flat_gpu_costs_grant_all_rows() -> None:
    offers = [Offer(s, 0.94, 16) for s in range(4)]
    a = allocate(offers, 4, GPU.cost, 0.001)
    assert a.rows == (16, 16, 16, 16)
    assert a.seconds == pytest.approx(GPU.cost(4, 17) + 0.001)


def test_padding_one_long_window_is_cut_short() -> None:
    # On 4 CPU streams a 16-row window widens everyone's pass: 101 ms at W=1, 354 ms at W=17.
    offers = [Offer(0, 0.94, 16)] + [Offer(s, 0.94, 2) for s in (1, 2, 3)]
    a = allocate(offers, 4, CPU.cost, 0.0)
    assert a.rows[0] < 16
    full = 4 + sum(0.94**j for j in range(1, 17)) + 3 * (0.94 + 0.94**2)
    assert throughput(a) > full / CPU.cost(4, 17)
    # Rows the width already pays for are taken: the short windows fill up to it.
    assert max(a.rows) == a.rows[0] and a.rows[1:] == (2, 2, 2)


def test_width_cap() -> None:
    a = allocate([Offer(0, 0.99, 32)], 1, GPU.cost, 0.0, max_width=8)
    assert a.rows == (7,)
    assert allocate([Offer(0, 0.99, 32, probe=True)], 1, GPU.cost, 0.0, max_width=1).rows == (0,)


def _step_cost(b: int, w: int, k: int | None = None) -> float:
    return {1: 1.0, 2: 1.1}.get(w, 10.0)


def test_ties_go_to_the_lowest_stream() -> None:
    # 0.75**2 == 0.5625 exactly: stream 0's row 2 ties with stream 1's row 1. W=3 is ruinous, so the
    # tie decides: the lowest stream's row comes first and the prefix stops before it.
    a = allocate([Offer(0, 0.75, 4), Offer(1, 0.5625, 4)], 2, _step_cost, 0.0)
    assert a.rows == (1, 0)
    # Swap the streams: now the 0.5625 row belongs to stream 0 and comes before the W=3 row.
    b = allocate([Offer(0, 0.5625, 4), Offer(1, 0.75, 4)], 2, _step_cost, 0.0)
    assert b.rows == (1, 1)
    # Equal rates and a budget of one width step: both streams fill that width.
    c = allocate([Offer(0, 0.9, 4), Offer(1, 0.9, 4)], 2, _step_cost, 0.0)
    assert c.rows == (1, 1)


def test_probe_grants_exactly_one_row() -> None:
    # Priced out (r=0.05 on 4 CPU streams) but probing: exactly one row.
    a = allocate([Offer(0, 0.05, 16, probe=True)], 4, CPU.cost, 0.0)
    assert a.rows == (1, 0, 0, 0)
    assert a.expected_tokens == pytest.approx(4.05)
    assert a.seconds == pytest.approx(CPU.cost(4, 2))
    # A probe that would have been granted rows anyway is left as priced.
    b = allocate([Offer(0, 0.94, 16, probe=True)], 4, CPU.cost, 0.0)
    assert b.rows == (3, 0, 0, 0)
    # A probe with an empty window gets nothing; probes don't change other streams' rows.
    c = allocate(
        [Offer(0, 0.94, 16), Offer(1, 0.0, 0, probe=True), Offer(2, 0.0, 8, probe=True)], 4, CPU.cost, 0.0
    )
    assert c.rows == (3, 0, 1, 0)


# The embedded model 4-bit on the H200 (ms, measured 2026-12-02): every width ~7.0, host work 2.5 per round,
# a round whose pass ran ahead 9.6 in all (its host work overlapped the pass).
H200 = CostModel({(4, 1): 0.0070, (4, 8): 0.0071, (4, 16): 0.0073}, overhead=0.0025)


DROPPING = H200.cost(4, 1)  # the pass run ahead, dropped if the round drafts


def test_a_round_run_ahead_is_kept_unless_the_copy_pays_for_both_passes() -> None:
    # A middling window that pays over a fresh round (4.96 tokens / 9.6 ms vs 4 / 9.5 ms)...
    middling = [Offer(0, 0.6, 16)]
    assert allocate(middling, 4, H200.cost, H200.overhead).rows == (2, 0, 0, 0)
    # ...is not worth dropping a pass already on the device: keeping it gives 4 tokens in 9.6 ms.
    kept = allocate(middling, 4, H200.cost, H200.overhead, keep_seconds=0.0096, dropping=DROPPING)
    assert kept.rows == (0, 0, 0, 0)
    assert kept.expected_tokens == 4.0 and kept.seconds == 0.0096
    # A long copy still is: 16 rows at 0.94 are worth 9.8 tokens.
    copy = allocate([Offer(0, 0.94, 16)], 4, H200.cost, H200.overhead, keep_seconds=0.0096, dropping=DROPPING)
    assert copy.rows == (16, 0, 0, 0)
    assert copy.seconds == pytest.approx(H200.cost(4, 17) + DROPPING + H200.overhead)
    # Nothing to drop, but draft-free rounds run ahead at 6.6 ms: the middling window is not worth it either.
    assert allocate(middling, 4, H200.cost, H200.overhead, keep_seconds=0.0066).rows == (0, 0, 0, 0)
    # A round run ahead that is dear to keep (a slow host) makes drafting the better deal again.
    assert allocate(middling, 4, H200.cost, H200.overhead, keep_seconds=0.05, dropping=DROPPING).rows[0] > 0
    for bad in ({"keep_seconds": 0.0}, {"dropping": -1.0}, {"dropping": math.nan}):
        with pytest.raises(ValueError):
            allocate(middling, 4, H200.cost, 0.0, **bad)


def test_a_probe_waits_rather_than_drop_a_round_run_ahead() -> None:
    probe = Offer(1, 0.2, 8, probe=True)
    # Nothing run ahead: the probe gets its row, whatever its price.
    assert allocate([probe], 4, H200.cost, H200.overhead, keep_seconds=0.0066).rows == (0, 1, 0, 0)
    # A pass run ahead would be dropped for it alone: it waits.
    assert allocate([probe], 4, H200.cost, H200.overhead, keep_seconds=0.0066, dropping=DROPPING).rows == (0, 0, 0, 0)
    # Another stream's copy drops that pass anyway: the probe rides along.
    both = allocate([Offer(0, 0.94, 16), probe], 4, H200.cost, H200.overhead, keep_seconds=0.0096, dropping=DROPPING)
    assert both.rows[0] > 0 and both.rows[1] == 1


def test_no_offers() -> None:
    a = allocate([], 3, CPU.cost, 0.002)
    assert a == Allocation(rows=(0, 0, 0), expected_tokens=3.0, seconds=CPU.cost(3, 1) + 0.002)


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        allocate([Offer(2, 0.9, 4)], 2, CPU.cost, 0.0)
    with pytest.raises(ValueError):
        allocate([Offer(0, 0.9, 4), Offer(0, 0.8, 4)], 2, CPU.cost, 0.0)
    with pytest.raises(ValueError):
        allocate([], 0, CPU.cost, 0.0)
    with pytest.raises(ValueError):
        allocate([Offer(0, 0.9, 4)], 1, lambda b, w, k: 0.0, 0.0)
    # Out-of-range rates are clamped rather than trusted.
    assert allocate([Offer(0, float("nan"), 4)], 1, CPU.cost, 0.0).rows == (0,)
    assert allocate([Offer(0, 1.5, 4)], 1, GPU.cost, 0.0).expected_tokens == 5.0


def greedy_order(offers: list[Offer], max_width: int) -> list[tuple[int, float, int]]:
    """Reference greedy order: candidate rows (worth at least MIN_ROW_VALUE, of windows whose first row
    is worth at least MIN_FIRST_ROW) by (value desc, stream, j)."""
    rows = []
    for o in offers:
        r = min(1.0, max(0.0, o.rate))
        r1 = r if o.first_rate is None else min(1.0, max(0.0, o.first_rate))
        if r1 < engine.drafts.allocator.MIN_FIRST_ROW:
            continue
        rows += [
            (-(r1 * r ** (j - 1)), o.stream, j)
            for j in range(1, min(o.max_rows, max_width - 1) + 1)
            if r1 * r ** (j - 1) >= engine.drafts.allocator.MIN_ROW_VALUE
        ]
    return [(s, -neg, j) for neg, s, j in sorted(rows)]


CostFn = Callable[[int, int, int], float]
CPU_GROUPED = CostModel({shape: ms / 1000 for shape, ms in CPU_MS.items()}, grouped=True)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[Offer], int, CostFn, float]:
    """A random round: offers, stream count, a cost function (linear, measured CPU or GPU), overhead."""
    n = draw(st.integers(1, 16))
    streams = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    rate = st.sampled_from([0.0, 0.1, 0.36, 0.5, 0.9, 0.94, 1.0]) | st.floats(0.0, 1.0)
    offers = [Offer(s, draw(rate), draw(st.integers(0, 32)), first_rate=draw(st.none() | rate)) for s in streams]
    ca, cb, cc = draw(st.floats(1e-4, 0.1)), draw(st.floats(0.0, 0.05)), draw(st.floats(0.0, 0.01))

    def linear(b: int, w: int, k: int | None = None) -> float:
        return ca + cb * b + cc * b * w

    cost = draw(st.sampled_from([linear, CPU.cost, GPU.cost, CPU_GROUPED.cost]))
    return offers, n, cost, draw(st.floats(0.0, 0.02))


@settings(deadline=None)  # shared 2-core box: timing deadlines flake under load
@given(rounds())
def test_allocation_beats_zero_rows_and_every_greedy_prefix(
    case: tuple[list[Offer], int, CostFn, float],
) -> None:
    offers, n, cost, overhead = case
    a = allocate(offers, n, cost, overhead)
    assert len(a.rows) == n
    by_stream = {o.stream: o for o in offers}
    assert a.expected_tokens == pytest.approx(
        n + sum(by_stream[s].value(j) for s, k in enumerate(a.rows) if k for j in range(1, k + 1))
    )
    drafting = sum(1 for k in a.rows if k)
    assert a.seconds == pytest.approx(cost(n, 1 + max(a.rows), drafting) + overhead)
    tp = throughput(a)
    assert tp >= n / (cost(n, 1, 0) + overhead) * (1 - 1e-9)
    value, width, wide = float(n), 1, 0
    for _s, v, j in greedy_order(offers, 32):
        value, width, wide = value + v, max(width, j + 1), wide + (j == 1)
        assert tp >= value / (cost(n, width, wide) + overhead) * (1 - 1e-9)
    for o in offers:
        assert a.rows[o.stream] <= o.max_rows
    assert all(a.rows[s] == 0 for s in range(n) if s not in by_stream)


@settings(deadline=None)  # shared 2-core box: timing deadlines flake under load
@given(rounds(), st.data())
def test_probes_only_add_one_row_to_empty_streams(
    case: tuple[list[Offer], int, CostFn, float], data: st.DataObject
) -> None:
    offers, n, cost, overhead = case
    flags = [data.draw(st.booleans()) for _ in offers]
    plain = allocate(offers, n, cost, overhead)
    probed = allocate(
        [Offer(o.stream, o.rate, o.max_rows, f, o.first_rate) for o, f in zip(offers, flags)], n, cost, overhead
    )
    want = list(plain.rows)
    for o, f in zip(offers, flags):
        if f and want[o.stream] == 0 and o.max_rows >= 1:
            want[o.stream] = 1
    assert probed.rows == tuple(want)


def test_a_family_may_verify_rows_down_to_a_lower_value() -> None:
    # min_row_value (a family setting) replaces MIN_ROW_VALUE: 0.8**j >= 0.15 holds up to j = 8.
    assert allocate([Offer(0, 0.8, 16)], 1, GPU.cost, 0.0, min_row_value=0.15).rows == (8,)
    assert 0.8**8 >= 0.15 > 0.8**9
    # It does not start windows MIN_FIRST_ROW refuses.
    assert allocate([Offer(0, 0.45, 16)], 1, GPU.cost, 0.0, min_row_value=0.15).rows == (0,)
