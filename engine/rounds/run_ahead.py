"""Run-ahead: a round queued on the device before the previous round's tokens reach the host, so
building its graph and the host's work overlap the computation (mlx-lm's ``batch_generate``
overlaps its steps the same way).

After a draft-free round every stream keeps one position, so the next round's rows are known but
for this round's choices, still on the device. After a drafting round (``continue_copies``) what
each stream keeps is known on the device alone: the next round then starts at offsets computed
there, with each stream's next token taken there, followed by its copy's continuation, as if every
draft landed. Worked example: a stream at length 40 drafts [a, b] from a window [a, b, c, d, e];
the next round's rows are [its choice after the kept rows, d, e] at 40 + kept. If a and b land
and the model writes c after them, d and e are the copy going on; if not, they are guesses that
verification rejects, and the round still yields the model's token at the right position: a
round run ahead after a drafting round is never dropped. A window granted no rows this round
starts the same way: a stream at 40 offering [f, g, h] gets [its choice, g, h] next round, which
lands g and h if the model writes f now. Such a start drops no pass (drafting from a round that
ran ahead drops one), so a copy can start in a round of many streams where dropping would not pay.
A lone stream's window whose kind is due a probe (engine.drafts.copy_rates, "Probe rule") starts
one row so, once the reply has landed a copy: on its own a probe waits for a round that drops
nothing, and a lone stream whose every round runs ahead would never test a kind it once priced out
(its doubtful short matches on copy-heavy). Where several streams share rounds, a probe that breaks
costs all of them a round that waits, for one stream's gain, and rounds that draft anyway come; a
reply that has copied nothing is likely to copy nothing, and its probes would only cost. Only
greedy streams' copies continue or start there; a sampling stream's copies draft from the allocator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import mlx.core as mx

from engine.drafts.allocator import Offer, allocate
from engine.drafts.copy_index import Window
from engine.drafts.cost_model import CostModel
from engine.rounds.round_plan import Round, RoundPlan, RunAhead
from engine.rounds.sampling import Rows, draw_all, with_draws

if TYPE_CHECKING:
    from engine.rounds.scheduler import Scheduler
    from engine.rounds.stream import Stream


def claim(sched: Scheduler, plan: RoundPlan) -> tuple[mx.array, list[list[int]] | None] | None:
    """This round's choices if a round that ran ahead computed it, with its drafts where it continued
    copies (the round then verifies those), else None (dropping it).

    Streams that left since it started are cut out of its rows; a stream it does not hold (none
    can join while one runs ahead) or a draft-free round run ahead when this round would draft
    means it cannot be used: the round is then computed afresh and overwrites the positions it wrote.
    """
    ahead, sched.ahead = sched.ahead, None
    if ahead is None:
        return None
    rows = {id(s): i for i, s in enumerate(ahead.streams)}
    index = [rows.get(id(s)) for s in plan.streams]
    if any(i is None for i in index) or (ahead.drafts is None and any(plan.rows)):
        sched.aheads_dropped += 1
        return None
    sched.rounds_ahead += 1
    sched.copies_continued += ahead.drafts is not None
    kept = [i for i in index if i is not None]
    drafts = None if ahead.drafts is None else [ahead.drafts[i] for i in kept]
    if kept == list(range(len(ahead.streams))):
        return ahead.choices, drafts
    return ahead.choices[mx.array(kept, dtype=mx.int32)], drafts


def start(sched: Scheduler, r: Round, choices: mx.array) -> bool:
    """Start the next round before this one's tokens reach the host, when nothing can change it.

    That holds when no stream is joining and no layer is recurrent (a recurrent state, once
    advanced, could not be overwritten like keys), and either this round drafts nothing and
    the passes speculate (an accelerator's: ``RoundPasses.speculate_ahead``; the next round's
    allocator then prices dropping it) or no stream can offer a copy window next round whatever
    token it gets now (``Stream.surely_draft_free_next``): then every stream keeps exactly one
    position and the next round's inputs are this round's choices, still on the device (a sampling
    stream's draws too: ``engine.rounds.sampling`` keys them by position, not by round); or a copy
    goes on or starts (``continue_copies``). The next pass is queued behind this one,
    so building its graph and this round's host work overlap the computation. Returns whether
    the lanes were advanced here (each stream by one position; after a drafting round, by what it
    keeps, once verified on the host).
    """
    if sched.joining or sched.lanes.recurrent:
        return False
    if r.width != 1 or any(w is not None for w in r.plan.windows):
        continue_copies(sched, r, choices)
        if r.width != 1 or sched.ahead is not None:
            return False
    plan = r.plan
    if not (sched.passes.speculate_ahead or all(s.surely_draft_free_next(sched.recall) for s in plan.streams)):
        return False
    mx.async_eval(choices)  # this round's pass goes to the device before the next one is built
    for row in range(len(plan.streams)):
        sched.lanes.advance(row, 1)
    sched.lanes.end_round()
    sched.lanes.begin_round(1)
    logits = sched.passes.padded(sched.model, sched.lanes, choices.astype(mx.int32))
    draws = draw_all({i: Rows(s.keys, logits[i], len(s.output) + 1, s.request.temperature, s.request.top_p)
                      for i, s in enumerate(plan.streams) if s.keys is not None}, sched.passes.compiled_draws)
    sched.ahead = RunAhead(list(plan.streams), with_draws(mx.argmax(logits, axis=-1), draws))
    mx.async_eval(sched.ahead.choices)
    sched.lanes.end_round()
    return True


def continuations(windows: Sequence[Window | None], drafts: Sequence[list[int]], rows: int) -> list[list[int]]:
    """Each stream's rows after this round's if its ``drafts`` all land and the model writes the
    window's next token after them: the rest of the window past that one, at most ``rows`` (the
    family's ``max_window``; windows are proposed twice that long for this). Once a window's first
    rows land, the rows after them land nearly always (docs/engine.md, "What happens in a round").
    A window granted no rows continues too: it starts next round if the model writes its first token
    now (a start, priced by ``starts``).

    >>> continuations([Window("context", (1, 2, 3, 4, 5), 9), Window("context", (7, 8, 9), 3), None],
    ...               [[1, 2], [], []], 32)
    [[4, 5], [8, 9], []]
    """
    return [list(w.tokens[len(d) + 1 : len(d) + 1 + rows]) if w is not None else []
            for w, d in zip(windows, drafts, strict=True)]


def starts(sched: Scheduler, r: Round, conts: list[list[int]]) -> list[list[int]]:
    """``conts`` with the starts (windows this round verifies no rows of) cut to what pays
    (``priced_starts``), each offered at its first row's chance times its copy rate: its row j
    lands if the model writes the window's first token now and its rows up to j. A lone stream's
    start due a probe gets one row whatever its price (module docstring)."""
    offers = []
    for i, (s, w, d, c) in enumerate(zip(r.plan.streams, r.plan.windows, r.drafts, conts, strict=True)):
        if w is not None and c and not d and sched.start_copies:
            rate, first = s.price(w)
            probe = sched.probe_starts and starts_a_probe(s, w, len(conts))
            offers.append(Offer(i, rate, len(c), probe, first_rate=(rate if first is None else first) * rate))
    if not offers:
        return [c if d else [] for c, d in zip(conts, r.drafts, strict=True)]
    batch, keys, fam = len(conts), max(sched.lanes.lengths), sched.loaded.family
    ahead = widened(sched.costs, batch, sched.costs.kept(batch, keys), keys)
    started = priced_starts(conts, r.drafts, offers, ahead, fam.max_window + 1, fam.min_row_value)
    sched.probes_started += sum(1 for o in offers if o.probe and started[o.stream])
    return started


def starts_a_probe(stream: Stream, window: Window, batch: int) -> bool:
    """Whether ``window``, granted no rows, starts one row as a probe in a round run ahead of
    ``batch`` streams: a lone stream's, once its reply has landed a copy (module docstring)."""
    return batch == 1 and stream.own_rates and stream.copied > 0 and stream.rates.probe_due(window.rate_key)


def widened(costs: CostModel, batch: int, keep: float, keys: int = 0) -> Callable[[int], float]:
    """Seconds of a round run ahead ``width`` rows wide: ``keep`` (what a draft-free one takes, its
    host work overlapped) plus what the width adds to its pass."""
    base = costs.cost(batch, 1, keys=keys)
    return lambda width: keep + max(0.0, costs.cost(batch, width, keys=keys) - base)


def priced_starts(conts: list[list[int]], drafts: Sequence[list[int]], offers: Sequence[Offer],
                  ahead: Callable[[int], float], max_width: int, min_row_value: float) -> list[list[int]]:
    """Each stream's continuation, a start's (no ``drafts``) cut to the rows the allocator grants it.

    A copy going on keeps its continuation whole. A start drops no pass: its rows cost only the
    width they add to a round that runs ahead anyway, ``ahead(width)`` seconds, at least as wide as
    the copies going on make it; that round without starts is the allocator's baseline. After a
    round that drafted and whose copies all broke off, nothing starts: the next round then runs
    when this one's tokens are known, and its allocator drafts the windows proposed after them,
    for every stream, without dropping anything (a start there would only lag a round behind).

    >>> flat = lambda w: 0.0129 + 0.0002 * (w - 1)      # 8 streams on a GPU: width is nearly free
    >>> priced_starts([[5, 6, 7], [], [8, 9]], [[1], [], []], [Offer(2, 0.9, 2, first_rate=0.8)], flat, 33, 0.3)
    [[5, 6, 7], [], [8, 9]]
    >>> priced_starts([[], [8, 9]], [[], []], [Offer(1, 0.6, 2, first_rate=0.45)], flat, 33, 0.3)
    [[], []]
    >>> priced_starts([[], [8, 9]], [[1], []], [Offer(1, 0.9, 2, first_rate=0.8)], flat, 33, 0.3)
    [[], []]
    >>> priced_starts([[], [8, 9]], [[], []], [Offer(1, 0.6, 2, probe=True, first_rate=0.45)], flat, 33, 0.3)
    [[], [8]]
    """
    going = 1 + max((len(c) for c, d in zip(conts, drafts, strict=True) if d), default=0)
    if going == 1 and any(drafts):
        offers = ()
    rows = allocate(offers, len(conts), lambda b, w, k: ahead(max(w, going)), 0.0, max_width=max_width,
                    min_row_value=min_row_value, keep_seconds=ahead(going)).rows
    return [c if d else c[:k] for c, d, k in zip(conts, drafts, rows, strict=True)]


def agreeing(windows: Sequence[Window | None], drafts: Sequence[list[int]]) -> list[Window | None]:
    """For a round that verifies continued ``drafts``: each stream's window proposed now where it
    starts with them (the copy went on: its rows are recorded as that window's), else None."""
    return [w if w is not None and list(w.tokens[: len(d)]) == d else None for w, d in zip(windows, drafts, strict=True)]


def continue_copies(sched: Scheduler, r: Round, choices: mx.array) -> None:
    """Queue the next round with each greedy stream's copy continuation (module docstring) and the
    starts that pay (``starts``), on an accelerator's passes, when some copy goes on or starts. Each stream's kept rows and next token
    (a sampling stream's draw) are computed on the device from this round's choices, and a sampling
    stream's rows drawn with the keys of the positions they land at. The lanes advance when this
    round is verified on the host."""
    if not (sched.passes.speculate_ahead and sched.continue_copies):
        return
    conts = continuations(r.plan.windows, r.drafts, sched.loaded.family.max_window)
    # A sampling stream's copies only draft from the allocator: each of its rows lands with the
    # draw's chance alone, so a long continuation rarely lands whole, and on an H100 sampled
    # copy-heavy at 4 streams ran faster without (docs/benchmarks.md, "Sampled streams").
    conts = starts(sched, r, [[] if s.keys is not None else c for s, c in zip(r.plan.streams, conts, strict=True)])
    if not any(conts):
        return
    width = sched.passes.continued_width(1 + max(len(c) for c in conts))
    lanes = sched.lanes
    if r.width == 1:
        landed = mx.zeros((len(r.rows),), dtype=mx.int32)
    else:
        drafted = mx.array([d + [-1] * (r.width - 1 - len(d)) for d in r.drafts], dtype=mx.int32)
        landed = mx.cumprod((choices[:, :-1] == drafted).astype(mx.int32), axis=1).sum(axis=1)
    nxt = mx.take_along_axis(choices, landed[:, None], axis=1).astype(mx.int32)
    offsets = mx.array(lanes.lengths, dtype=mx.int32) + landed.astype(mx.int32) + 1
    tail = mx.array([c + [0] * (width - 1 - len(c)) for c in conts], dtype=mx.int32)
    mx.async_eval(choices)  # this round's pass goes to the device before the next one is built
    sizes = [len(row) for row in r.rows]
    most = max(lanes.lengths) + r.width
    lanes.end_round()
    lanes.begin_pending(width, offsets, most)
    logits = sched.passes.padded(sched.model, lanes, mx.concatenate([nxt, tail], axis=1))
    # A sampling stream draws its own rows only: each costs a top-p sort of the vocabulary, and the
    # rest of the round's width is padding that verification never reads.
    draws = draw_all({i: Rows(s.keys, logits[i, : 1 + len(conts[i])], len(s.output) + 1 + landed[i],
                              s.request.temperature, s.request.top_p)
                      for i, s in enumerate(r.plan.streams) if s.keys is not None}, sched.passes.compiled_draws)
    sched.ahead = RunAhead(list(r.plan.streams), with_draws(mx.argmax(logits, axis=-1), draws), conts, most + width)
    mx.async_eval(sched.ahead.choices)
    lanes.end_round()
    lanes.begin_round(r.width, sizes)  # this round's, again: its verification advances the lanes
