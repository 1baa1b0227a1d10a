"""Run-ahead: a draft-free round queued on the device before the previous round's tokens reach
the host, so building its graph and the host's work overlap the computation (mlx-lm's
``batch_generate`` overlaps its steps the same way)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from engine.rounds.round_plan import RoundPlan, RunAhead
from engine.rounds.sampling import draw, with_draws

if TYPE_CHECKING:
    from engine.rounds.scheduler import Scheduler


def claim(sched: Scheduler, plan: RoundPlan, width: int) -> mx.array | None:
    """This round's choices if a round that ran ahead computed it, else None (dropping it).

    Streams that left since it started are cut out of its rows; a stream it does not hold (none
    can join while one runs ahead) or a round that drafts after all means it cannot be used:
    the round is then computed afresh and overwrites the positions it wrote.
    """
    ahead, sched.ahead = sched.ahead, None
    if ahead is None:
        return None
    rows = {id(s): i for i, s in enumerate(ahead.streams)}
    index = [rows.get(id(s)) for s in plan.streams]
    if width != 1 or any(i is None for i in index):
        sched.aheads_dropped += 1
        return None
    sched.rounds_ahead += 1
    if index == list(range(len(ahead.streams))):
        return ahead.choices
    return ahead.choices[mx.array(index, dtype=mx.int32)]



def start(sched: Scheduler, plan: RoundPlan, width: int, choices: mx.array) -> bool:
    """Start the next round before this one's tokens reach the host, when nothing can change it.

    That holds when this round drafts nothing, no stream is joining, and either
    the passes speculate (an accelerator's: ``RoundPasses.speculate_ahead``; the next round's
    allocator then prices dropping it) or no stream can offer a copy window next round whatever
    token it gets now (``Stream.surely_draft_free_next``): then every stream keeps exactly one
    position and the next round's inputs are this round's choices, still on the device (a sampling
    stream's draws too: ``engine.rounds.sampling`` keys them by position, not by round).
    The next pass is queued behind this one, so building its graph and this round's host work
    overlap the computation (mlx-lm's ``batch_generate`` overlaps its steps the same way). Returns whether
    the lanes were advanced here (each stream by one position).
    """
    if width != 1 or sched.joining or sched.lanes.recurrent:
        return False  # a recurrent state, once advanced, could not be overwritten like keys
    if not (sched.passes.speculate_ahead or all(s.surely_draft_free_next(sched.recall) for s in plan.streams)):
        return False
    mx.async_eval(choices)  # this round's pass goes to the device before the next one is built
    for row in range(len(plan.streams)):
        sched.lanes.advance(row, 1)
    sched.lanes.end_round()
    sched.lanes.begin_round(1)
    logits = sched.passes.padded(sched.model, sched.lanes, choices.astype(mx.int32))
    draws = {i: draw(s.keys, logits[i], len(s.output) + 1, s.request.temperature, s.request.top_p)
             for i, s in enumerate(plan.streams) if s.keys is not None}
    sched.ahead = RunAhead(list(plan.streams), with_draws(mx.argmax(logits, axis=-1), draws))
    mx.async_eval(sched.ahead.choices)
    sched.lanes.end_round()
    return True
