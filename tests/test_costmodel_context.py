"""The cost model with contexts priced (engine.drafts.context_cost inside engine.drafts.cost_model)."""

from functools import partial

import pytest

from engine.drafts.allocator import Offer, allocate
from engine.drafts.context_cost import ContextCost
from engine.drafts.cost_model import CostModel

# Base costs (no context), 2-core CPU, seconds; and the per-key terms fitted in engine.drafts.context_cost.
BASE = {(1, 1): 0.064, (1, 8): 0.098, (4, 1): 0.101, (4, 4): 0.145, (4, 8): 0.218, (4, 16): 0.339}
PER_KEY = ContextCost(per_stream=2.19e-5, per_row=9.62e-6)


def test_observations_are_kept_net_of_their_context() -> None:
    model = CostModel(context=PER_KEY)
    # A 4 x 8 pass timed at 2000 keys: 2000 * 4 * (2.19e-5 + 8 * 9.62e-6) = 0.7908 s of it is context.
    model.observe(4, 8, 1.009, keys=2000)
    assert model.snapshot() == {"4x8": pytest.approx(1.009 - 0.7908, abs=1e-4)}
    assert model.cost(4, 8, keys=2000) == pytest.approx(1.009)
    assert model.cost(4, 8, keys=64) == pytest.approx(0.2182 + 0.0253, abs=1e-4)
    assert model.cost(4, 8) == pytest.approx(0.2182, abs=1e-4)  # keys default to 0: the base


def test_a_long_conversation_does_not_make_short_ones_look_dear() -> None:
    # Rounds of one shape timed deep in a long chat, then a short chat: without the context term the
    # shape keeps its long-context price (and, priced that dear, is never run again to correct it).
    with_context, without = CostModel(BASE, context=PER_KEY), CostModel(BASE)
    for _ in range(20):
        seconds = BASE[(4, 8)] + PER_KEY.seconds(4, 8, 3000)
        with_context.observe(4, 8, seconds, keys=3000)
        without.observe(4, 8, seconds, keys=3000)
    assert with_context.cost(4, 8, keys=100) == pytest.approx(BASE[(4, 8)] + PER_KEY.seconds(4, 8, 100))
    assert without.cost(4, 8, keys=100) > 4 * BASE[(4, 8)]


def test_wide_rounds_in_a_long_context_get_fewer_rows() -> None:
    model = CostModel(BASE, context=PER_KEY)
    offers = [Offer(0, 0.94, 24), Offer(1, 0.94, 24), Offer(2, 0.9, 24)]
    short = allocate(offers, 4, partial(model.cost, keys=64), 0.0)
    long = allocate(offers, 4, partial(model.cost, keys=3000), 0.0)
    blind = allocate(offers, 4, CostModel(BASE).cost, 0.0)  # what the engine did before
    assert sum(long.rows) < sum(short.rows) <= sum(blind.rows)
    assert max(long.rows) < max(short.rows)
    # The long-context choice is the better one at 3000 keys, by the model's own reckoning.
    at_3000 = partial(model.cost, keys=3000)
    assert long.expected_tokens / at_3000(4, 1 + max(long.rows)) > blind.expected_tokens / at_3000(
        4, 1 + max(blind.rows))


def test_grouping_pays_more_as_the_context_grows() -> None:
    model = CostModel(BASE, grouped=True, context=PER_KEY)
    model.observe(4, 16, 0.345, wide=1, keys=0)  # grouped: a little dearer than padded without context
    assert not model.groups_pay(4, 16, 1, keys=0)
    # At 2000 keys the padded pass has four streams attend 16 rows, the grouped one a single stream.
    assert model.groups_pay(4, 16, 1, keys=2000)
    assert model.cost(4, 16, 1, keys=2000) == pytest.approx(0.345 + PER_KEY.seconds(4, 16, 2000, wide=1))
    # An unobserved grouped shape: its base from the padded table, then its own context term.
    assert model.cost(4, 8, 1, keys=500) == pytest.approx(0.101 + 0.098 - 0.064 + PER_KEY.seconds(4, 8, 500, 1))


def test_at_keys_prices_everything_as_measured_at_one_context() -> None:
    model = CostModel(grouped=True, context=PER_KEY)
    raw = {(1, 1): 0.066, (1, 8): 0.101, (4, 1): 0.107, (4, 8): 0.243, (4, 16): 0.385}
    for (b, w), seconds in raw.items():
        model.observe(b, w, seconds, keys=64)
    model.observe(4, 8, 0.150, wide=1, keys=64)
    model.observe_overhead(0.004)
    flat = model.at_keys(64)
    assert flat.context == ContextCost()
    assert flat.snapshot() == pytest.approx({f"{b}x{w}": t for (b, w), t in raw.items()})  # as timed
    assert flat.cost(4, 8, 1) == pytest.approx(0.150)
    assert flat.cost(4, 8, keys=3000) == flat.cost(4, 8) == pytest.approx(0.243)
    assert flat.overhead == 0.004 and flat.grouped and flat.alpha == model.alpha
    flat.observe(4, 8, 1.0)
    assert model.cost(4, 8, keys=64) == pytest.approx(0.243)  # a copy: the original is untouched
