"""How joining streams are prefilled and enter the lanes, a step at a time.

Each step prefills the next chunk of the first joining stream, and with it the next chunks of other
joining streams that fit the same pass, shortest first (``engine.passes.joined``: on an accelerator
a pass of several short prompts costs about what one does). On the CPU's grouped passes the first
stream's chunk rides in the round's own pass instead (``rider``), and prefills alone. A stream whose prompt is in (all
but its last token, which its first round reads) joins the lanes and runs from the next round.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.events import Reading
from engine.passes.choice import body_of
from engine.passes.joined import packed, prefill_together
from engine.rounds.round_plan import Joining

if TYPE_CHECKING:
    from engine.rounds.scheduler import Scheduler

log = logging.getLogger(__name__)


def chunk_end(sched: Scheduler, job: Joining) -> int:
    """Where ``job``'s next chunk ends in its prompt (its last token is left for its first round)."""
    return min(job.done + sched.prefill_chunk, len(job.stream.prompt) - 1)


def rider(sched: Scheduler) -> Joining | None:
    """The joining stream whose next chunk can ride in this round's pass, if any (not while a round
    that ran ahead is pending: its pass is already queued)."""
    if not sched.joining or sched.ahead is not None or not sched.costs.grouped:
        return None
    job = sched.joining[0]
    return job if chunk_end(sched, job) > job.done else None


def prefill(sched: Scheduler, compute: bool = True) -> None:
    """Prefill the first joining stream's next chunk (unless it rode in the round: ``compute``
    False), with those of other joining streams that fit one pass (``packed``), and move each whose
    prompt is in to the active streams."""
    jobs = sched.joining[:1]
    budget = sched.prefill_pass
    # The CPU's grouped prefill takes one stream. A stream that holds more than a pass already (a
    # long chat's next turn) prefills alone: a shared pass copies what each stream holds, twice.
    if compute and not sched.passes.numpy_ops and jobs[0].done <= budget:
        light = [j for j in sched.joining if j.done <= budget]
        jobs = [light[i] for i in packed([chunk_end(sched, j) - j.done for j in light], budget)]
    together = [j for j in jobs if chunk_end(sched, j) > j.done]
    if compute and len(together) > 1:
        try:
            ends = [chunk_end(sched, j) for j in together]
            caches = prefill_together(body_of(sched.model), sched.loaded.kinds, [(j.caches, j.done) for j in together],
                                      [j.stream.prompt[j.done : end] for j, end in zip(together, ends, strict=True)])
            for j, c, end in zip(together, caches, ends, strict=True):
                j.caches, j.done = c, end
            sched.prefills_joined += 1
            compute = False
        except Exception as exc:  # whose fault is unknown: the first prefills alone, and so is blamed alone
            log.warning("prefilling %d prompts in one pass raised (%s); prefilling the first alone", len(together), exc)
            jobs = jobs[:1]
    for job in jobs:
        _advance(sched, job, compute)


def _advance(sched: Scheduler, job: Joining, compute: bool) -> None:
    s = job.stream
    try:
        end = chunk_end(sched, job)
        if compute and end > job.done:
            sched.passes.prefill(sched.model, s.prompt[job.done : end], job.caches)
            job.done = end
        if len(s.prompt) - s.reused > sched.prefill_chunk:  # long enough to show how far it read
            sched.emit(Reading(s.id, job.done, len(s.prompt)))
        if job.done < len(s.prompt) - 1:
            return
        sched.joining = [j for j in sched.joining if j is not job]
        sched.lanes.add(job.caches, job.done, spare=len(sched.joining))
        sched.active.append(s)
    except Exception as exc:  # one stream's failure leaves the others running
        sched.joining = [j for j in sched.joining if j is not job]
        sched._fail(s, exc)
