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
