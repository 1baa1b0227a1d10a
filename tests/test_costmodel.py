"""Tests for engine.drafts.cost_model: seconds per padded forward pass."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.drafts.cost_model import CALIBRATION_SHAPES, DEFAULT_CURVE, MIN_SECONDS, CostModel

# Measured on the target machine: SmolLM2-135M, 2-core CPU, milliseconds.
CPU_MS = {
    (1, 1): 64, (1, 4): 80, (1, 8): 98, (1, 16): 114,
    (2, 1): 72, (2, 4): 108, (2, 8): 139, (2, 16): 189,
    (4, 1): 101, (4, 4): 145, (4, 8): 218, (4, 16): 339,
}  # fmt: skip
CPU = {shape: ms / 1000 for shape, ms in CPU_MS.items()}
# GPU-like: nearly flat, 4-10 ms whatever the shape.
GPU = {(1, 1): 0.004, (1, 8): 0.0045, (4, 1): 0.005, (4, 8): 0.006, (4, 16): 0.007}


def test_observed_shapes_are_exact() -> None:
    model = CostModel(CPU)
    for shape, seconds in CPU.items():
        assert model.cost(*shape) == seconds


def test_interpolates_in_width_for_an_observed_batch() -> None:
    model = CostModel(CPU)
    assert model.cost(4, 2) == pytest.approx(0.101 + 0.044 / 3)  # 115.7 ms
    assert model.cost(4, 12) == pytest.approx(0.2785)  # halfway 218..339
    assert model.cost(1, 6) == pytest.approx(0.089)  # halfway 80..98
    assert model.cost(2, 3) == pytest.approx(0.072 + 2 * 0.036 / 3)


def test_extrapolates_past_the_widest_width() -> None:
    model = CostModel(CPU)
    assert model.cost(4, 20) == pytest.approx(0.339 + 4 * 0.121 / 8)  # 399.5 ms
    assert model.cost(1, 33) == pytest.approx(0.114 + 17 * 0.016 / 8)


def test_past_the_widest_width_a_noisy_pair_is_not_stretched() -> None:
    # Rounds an H100 timed in one run (ms): one noisy 1x2 above 1x8 used to price every pass past
    # 1x8 at 1x2's 32.7 ms, and 8x1/8x2 (a compiled one-row pass beside an uncompiled wider one)
    # put 8x16 at 32.4 + 15 * 5.3 = 112 ms. Past the widest width the cost now starts from it and
    # rises no faster than the fit over every shape says a row adds.
    lone = CostModel({(1, 1): 0.0150, (1, 2): 0.0327, (1, 8): 0.0174})
    assert lone.cost(1, 16) == pytest.approx(0.0174)
    calibrated = {(1, 1): 0.0062, (1, 8): 0.0090, (4, 1): 0.0069, (4, 8): 0.0084, (4, 16): 0.0136}
    model = CostModel({**calibrated, (8, 1): 0.0324, (8, 2): 0.0377})
    assert 0.0377 <= model.cost(8, 16) < 0.045  # the calibrated shapes add ~0.5 ms a row at 4 streams
    assert model.cost(8, 2) == 0.0377  # observed shapes stay exact


def test_unobserved_batch_uses_monotone_least_squares_fit() -> None:
    model = CostModel(CPU)
    # Least squares a + b*B + c*B*W over the 12 CPU shapes: a=52.1 ms, b=8.78 ms, c=3.92 ms.
    assert model.cost(3, 8) == pytest.approx(0.05212 + 0.008777 * 3 + 0.003920 * 24, rel=1e-3)
    assert model.cost(3, 8) == pytest.approx(0.1725, abs=5e-4)
    # Between the observed 2- and 4-stream costs, as it should be.
    for w in (1, 4, 8, 16):
        assert CPU[(2, w)] * 0.85 < model.cost(3, w) < CPU[(4, w)] * 1.1
    for b in range(5, 17):
        for w in range(1, 33):
            assert 0.0 < model.cost(b, w) <= model.cost(b, w + 1)
            assert model.cost(b, w) <= model.cost(b + 1, w)


def test_fit_clamps_negative_slopes() -> None:
    # Noise makes the 4-stream passes look *cheaper*: the fit must not decrease in B.
    noisy = {(1, 1): 0.010, (1, 8): 0.012, (4, 1): 0.008, (4, 8): 0.009, (4, 16): 0.0095}
    model = CostModel(noisy)
    costs = [model.cost(b, 4) for b in (2, 3, 5, 8, 16)]
    assert costs == sorted(costs)
    assert all(c > 0 and math.isfinite(c) for c in costs)


def test_gpu_is_flat() -> None:
    model = CostModel(GPU)
    assert model.cost(4, 17) == pytest.approx(0.007 + 0.001 / 8)
    for b in (1, 2, 3, 4, 8):
        for w in (1, 4, 16, 32):
            assert 0.003 < model.cost(b, w) < 0.02


def test_no_samples_uses_documented_default_curve() -> None:
    model = CostModel()
    a, b, c = DEFAULT_CURVE
    assert model.cost(1, 1) == pytest.approx(a + b + c)  # ~65 ms: the CPU fit
    assert model.cost(4, 16) == pytest.approx(a + 4 * b + 64 * c)
    assert model.cost(4, 16) == pytest.approx(0.338, abs=0.002)
    assert model.snapshot() == {}


def test_few_samples_scale_the_default_curve() -> None:
    # One GPU-like sample: the default curve's shape, scaled to it.
    model = CostModel({(1, 1): 0.005})
    a, b, c = DEFAULT_CURVE
    scale = 0.005 / (a + b + c)
    assert model.cost(1, 1) == 0.005
    assert model.cost(4, 8) == pytest.approx(scale * (a + 4 * b + 32 * c))
    # Same batch, other width: that sample plus the (scaled) default W-slope.
    assert model.cost(1, 9) == pytest.approx(0.005 + scale * c * 8)
    # Shapes on one batch can't separate a from b: still the scaled default for other batches.
    one_batch = CostModel({(1, 1): 0.064, (1, 8): 0.098, (1, 16): 0.114})
    assert one_batch.cost(1, 4) == pytest.approx(0.064 + 3 * 0.034 / 7)
    assert one_batch.cost(4, 4) > one_batch.cost(2, 4) > 0


def test_calibration_shapes_identify_the_fit() -> None:
    assert (1, 1) in CALIBRATION_SHAPES
    model = CostModel({s: CPU[s] for s in CALIBRATION_SHAPES})
    assert model.cost(2, 8) == pytest.approx(0.139, rel=0.15)  # unobserved batch, from the fit
    assert model._coef is not None  # fitted when that shape asked


def test_observe_is_an_ema_and_new_shapes_take_the_timing() -> None:
    model = CostModel({(4, 4): 0.145}, alpha=0.2)
    model.observe(4, 4, 0.155)
    assert model.cost(4, 4) == pytest.approx(0.8 * 0.145 + 0.2 * 0.155)
    model.observe(2, 8, 0.139)
    assert model.cost(2, 8) == 0.139
    assert model.snapshot() == {"2x8": 0.139, "4x4": pytest.approx(0.147)}


def test_observe_refits_the_fallback() -> None:
    model = CostModel({(1, 1): 0.064})
    before = model.cost(3, 8)
    for shape in ((1, 8), (4, 1), (4, 8), (4, 16)):
        model.observe(*shape, CPU[shape])
    assert model.cost(3, 8) != before
    assert model._coef is not None
    assert model.cost(3, 8) == pytest.approx(0.1725, rel=0.15)


def test_observe_drops_bad_timings() -> None:
    model = CostModel({(1, 1): 0.064})
    for bad in (0.0, -1.0, math.nan, math.inf):
        model.observe(1, 1, bad)
    assert model.cost(1, 1) == 0.064
    with pytest.raises(ValueError):
        model.observe(0, 1, 0.1)
    with pytest.raises(ValueError):
        model.cost(1, 0)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        CostModel({(1, 1): 0.0})
    with pytest.raises(ValueError):
        CostModel({(0, 1): 0.1})
    with pytest.raises(ValueError):
        CostModel(alpha=0.0)


def test_overhead_ema() -> None:
    model = CostModel(alpha=0.2)
    assert model.overhead == 0.0
    model.observe_overhead(0.010)  # the first reading is taken as is
    assert model.overhead == 0.010
    model.observe_overhead(0.020)
    assert model.overhead == pytest.approx(0.012)
    model.observe_overhead(-0.005)  # timer noise: reads as 0
    assert model.overhead == pytest.approx(0.0096)
    model.observe_overhead(math.nan)
    assert model.overhead == pytest.approx(0.0096)
    assert CostModel(overhead=0.003).overhead == 0.003


def test_snapshot_round_trip() -> None:
    model = CostModel(CPU)
    snap = model.snapshot()
    assert snap["4x16"] == 0.339 and len(snap) == 12
    again = CostModel.from_snapshot(snap)
    assert again.snapshot() == snap
    assert again.cost(3, 8) == pytest.approx(model.cost(3, 8))
    damaged = {"4x8": 0.218, "x": 1.0, "0x3": 0.1, "2x2": -1, "3x3": "fast", "5x5": True, "1x1x1": 0.2}
    assert CostModel.from_snapshot(damaged).snapshot() == {"4x8": 0.218}
    assert CostModel.from_snapshot(None).snapshot() == {}


shapes = st.tuples(st.integers(1, 16), st.integers(1, 33))


@settings(deadline=None)  # shared 2-core box: timing deadlines flake under load
@given(st.dictionaries(shapes, st.floats(1e-5, 10.0), max_size=12), shapes)
def test_cost_is_always_positive_and_finite(samples: dict, query: tuple[int, int]) -> None:
    model = CostModel(samples)
    c = model.cost(*query)
    assert math.isfinite(c) and c >= MIN_SECONDS


@settings(deadline=None)  # shared 2-core box: timing deadlines flake under load
@given(st.dictionaries(shapes, st.floats(1e-5, 10.0), min_size=3, max_size=12))
def test_fit_is_monotone_in_batch_and_width(samples: dict) -> None:
    model = CostModel(samples)
    observed = {b for b, _ in samples}
    free_batches = [b for b in range(1, 18) if b not in observed]
    for b in free_batches:
        for w in (1, 2, 8, 33):
            assert model.cost(b, w) <= model.cost(b, w + 1)
            nxt = next((x for x in free_batches if x > b), None)
            if nxt is not None:
                assert model.cost(b, w) <= model.cost(nxt, w)


def test_grouped_cost_is_estimated_from_the_padded_table() -> None:
    model = CostModel(CPU, grouped=True)
    # Every stream's own row, plus what 8 rows add for one stream: 101 + 98 - 64 = 135 ms.
    assert model.cost(4, 8, 1) == pytest.approx(0.135)
    assert model.groups_pay(4, 8, 1)
    assert model.cost(4, 8, 4) == model.cost(4, 8) == 0.218  # all streams draft: padded
    assert model.cost(4, 1, 0) == 0.101
    # Two of four streams, 16 rows: 101 + 189 - 72 = 218 ms < 339 padded.
    assert model.cost(4, 16, 2) == pytest.approx(0.218)


def test_grouped_rounds_only_when_enabled_and_cheaper() -> None:
    assert not CostModel(CPU).groups_pay(4, 8, 1)  # the model has no grouped pass
    assert CostModel(CPU).cost(4, 8, 1) == 0.218
    model = CostModel(CPU, grouped=True)
    assert not model.groups_pay(4, 1, 0) and not model.groups_pay(4, 8, 4) and not model.groups_pay(4, 8, None)


def test_observed_grouped_shapes_are_kept_apart() -> None:
    model = CostModel(CPU, grouped=True)
    model.observe(4, 8, 0.120, wide=1)
    model.observe(4, 8, 0.130, wide=1)  # EMA: 0.12 + 0.2 * 0.01
    assert model.cost(4, 8, 1) == pytest.approx(0.122)
    assert model.cost(4, 8) == 0.218  # the padded sample is untouched
    assert model.grouped_snapshot() == {"4x8/1": pytest.approx(0.122)}
    model.observe(4, 8, 0.500, wide=1)
    model.observe(4, 8, 0.500, wide=1)
    assert not model.groups_pay(4, 8, 1)  # once grouping is seen to cost more, rounds stay padded
    assert model.cost(4, 8, 1) == 0.218


def test_kept_rounds_are_priced_from_what_they_took() -> None:
    m = CostModel({(4, 1): 0.007, (4, 8): 0.0075}, overhead=0.0025, alpha=0.5)
    assert m.kept(4) == m.cost(4, 1) == 0.007  # none seen: the pass alone (its host work overlapped)
    assert m.kept(2) == m.cost(2, 1)  # another batch: the fit's answer
    m.observe_kept(4, 0.010)
    assert m.kept(4) == 0.010
    m.observe_kept(4, 0.012)
    assert m.kept(4) == pytest.approx(0.011)  # EMA, alpha 0.5
    for bad in (0.0, -1.0, math.nan, math.inf):
        m.observe_kept(4, bad)
    assert m.kept(4) == pytest.approx(0.011)
    # an unseen batch: its one-row pass scaled as the nearest seen batch's rounds ran against theirs
    assert m.kept(2) == pytest.approx(m.cost(2, 1) * 0.011 / 0.007)
    m.observe_kept(1, 0.003)
    assert m.kept(2) == pytest.approx(m.cost(2, 1) * 0.003 / m.cost(1, 1))  # 1 is nearer than 4
    assert m.kept(4) == pytest.approx(0.011)  # batches apart


def test_padded_widths_are_priced_and_observed_as_the_pass_runs() -> None:
    """``row_step``: a pass of W > 1 rows runs padded to a multiple of the step (a GPU's compiled
    drafting rounds), so rows inside the padding are free, and a timed round of 3 rows updates 8's."""
    model = CostModel(GPU, row_step=8)
    assert [model.cost(4, w) for w in (1, 2, 3, 8)] == [0.005, 0.006, 0.006, 0.006]
    assert model.cost(4, 9) == model.cost(4, 16) == 0.007
    model.observe(4, 3, 0.008)  # 0.8 * 6 ms + 0.2 * 8 ms
    assert model.snapshot()["4x8"] == pytest.approx(0.0064) and "4x3" not in model.snapshot()
    assert model.at_keys(64).cost(4, 5) == pytest.approx(0.0064)  # a flat copy keeps the step
    assert CostModel(GPU).cost(4, 3) < 0.006  # without a step widths between 1 and 8 interpolate
    with pytest.raises(ValueError, match="row_step"):
        CostModel(GPU, row_step=0)
