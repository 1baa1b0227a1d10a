"""Calibration (engine.rounds.calibration): where rounds run ahead, each shape is timed as such a
round runs, its pass then a one-row pass queued behind it, and a round run ahead as a link of a
chain of one-row passes (``CostModel.kept``); elsewhere each shape is one bare pass."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import mlx.core as mx

from engine.drafts.cost_model import CALIBRATION_SHAPES
from engine.passes.choice import ACCELERATOR, GENERIC, RoundPasses
from engine.rounds.scheduler import Scheduler

PASSES: list[tuple[int, int]] = []  # (streams, rows) of every pass the calibration ran, in order


@dataclass(frozen=True)
class Recorded(RoundPasses):
    """The same passes, each recorded as it is built."""

    def padded(self, model: Any, lanes: Any, tokens: mx.array) -> mx.array:
        PASSES.append((int(tokens.shape[0]), int(tokens.shape[1])))
        return super().padded(model, lanes, tokens)


def recorded(passes: RoundPasses) -> Recorded:
    return Recorded(**{f.name: getattr(passes, f.name) for f in fields(passes)})


def calibrated(loaded: Any, passes: RoundPasses) -> Scheduler:
    PASSES.clear()
    sched = Scheduler(replace(loaded, passes=recorded(passes)), lambda e: None)
    sched.calibrate(repeats=1)
    return sched


def test_rounds_that_run_ahead_are_timed_as_they_run(loaded) -> None:
    sched = calibrated(loaded, ACCELERATOR)
    wide = [i for i, (b, w) in enumerate(PASSES) if w > 1]
    assert wide  # the drafting shapes were timed
    for i in wide:  # each followed by the one-row pass a round queues behind its own
        assert PASSES[i + 1] == (PASSES[i][0], 1)
    for batch in sorted({b for b, _ in CALIBRATION_SHAPES}):
        # a pass computed first, then 4 links, each queued before the one before it is read
        assert any(PASSES[i : i + 5] == [(batch, 1)] * 5 for i in range(len(PASSES)))
        assert sched.costs.kept(batch) != sched.costs.cost(batch, 1)  # timed, not the one-row pass's price


def test_passes_that_do_not_run_ahead_are_timed_bare(loaded) -> None:
    sched = calibrated(loaded, GENERIC)
    wide = [i for i, (b, w) in enumerate(PASSES) if w > 1]
    assert wide and all(PASSES[i + 1] != (PASSES[i][0], 1) for i in wide if i + 1 < len(PASSES))
    assert not any(PASSES[i : i + 5] == [(4, 1)] * 5 for i in range(len(PASSES)))  # no chain timed
    assert sched.costs.kept(4) == sched.costs.cost(4, 1)  # a round run ahead is priced as its pass, as before


def dropped_rounds_priced(loaded: Any, chat_prompt: Any, passes: RoundPasses, monkeypatch: Any) -> list[tuple[float, float]]:
    """Two copy-friendly replies on ``passes`` without starts (copies start only from the allocator,
    dropping the draft-free round that ran ahead): for each drafting choice made with a round run
    ahead, what drafting was charged for dropping it and what the calibration's units make it."""
    import engine.rounds.scheduler as scheduler_mod
    from engine.drafts.allocator import allocate as real
    from engine.events import Request
    from tests import prompts

    priced: list[tuple[float, float]] = []
    sched = Scheduler(replace(loaded, passes=passes), lambda e: None)

    def allocate(offers: Any, batch: int, cost: Any, overhead: float, **kw: Any) -> Any:
        if kw["dropping"]:
            keys = max(sched.lanes.lengths)
            due = sched.costs.kept(batch, keys) if passes.round_costs else sched.costs.cost(batch, 1, keys=keys)
            priced.append((kw["dropping"], due))
        return real(offers, batch, cost, overhead, **kw)

    monkeypatch.setattr(scheduler_mod, "allocate", allocate)
    sched.start_copies = False
    for text in (prompts.COPY, prompts.CODE):
        sched.submit(Request(prompt_tokens=tuple(chat_prompt(text)), max_tokens=48, own_copy_rates=False))
    while sched.busy:
        sched.step()
    assert sched.aheads_dropped > 0
    return priced


def test_a_drafting_round_that_drops_a_round_run_ahead_pays_for_it_in_the_calibrations_units(
        loaded, chat_prompt, monkeypatch) -> None:
    """With costs of rounds as they run, the round run ahead that drafting drops costs what such a
    round takes (``CostModel.kept``); with bare passes' costs, a one-row pass (a round that did not
    run ahead holds two passes in the first, one in the second)."""
    for passes in (ACCELERATOR, replace(ACCELERATOR, round_costs=False, name="bare")):
        priced = dropped_rounds_priced(loaded, chat_prompt, passes, monkeypatch)
        assert priced and all(paid == due for paid, due in priced)
