"""Shared rounds: every active stream advances in one batched forward pass.

``Scheduler.step()`` runs one round for the active streams and at most one prefill pass for joining
streams: the first one's next chunk, with those of short prompts after it (``engine.rounds.joins``).
Where the model has grouped passes (``engine.passes.grouped``) the first one's chunk rides in the
round's own pass, so running streams keep their pace while a long prompt joins; elsewhere the pass
runs after the round, and stalls them by at most one chunk's tokens. On the CPU a round without a
chunk runs on numpy (``engine.passes.numpy_pass``), for the models it knows. It runs on whichever
single thread owns MLX (the engine thread, or the benchmark's main thread) and reports through
``emit``.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from engine.drafts.allocator import Offer, allocate
from engine.drafts.copy_index import RecallIndex, Window
from engine.drafts.cost_model import CostModel
from engine.drafts.verification import verify
from engine.events import (
    Event,
    Failed,
    Notice,
    Origin,
    Request,
    RoundStats,
    Tokens,
    Waiting,
)
from engine.model import blas_threads
from engine.model.cache_kinds import cache_arrays, make_caches
from engine.model.chat_template import Rendered
from engine.model.loading import LoadedModel
from engine.model.memory_limits import (
    MemoryLimits,
    kv_bytes_per_token,
    limits_for,
    machine_memory,
    weight_bytes,
)
from engine.model.turn_cache import PREFIX, ConversationCache
from engine.passes.choice import padded_width
from engine.passes.grouped import Chunk, grouped_logits
from engine.rounds import joins, run_ahead
from engine.rounds.admission import Admission
from engine.rounds.calibration import calibrate
from engine.rounds.round_plan import Joining, Round, RoundPlan, RunAhead
from engine.rounds.sampling import Rows, draw_all, with_draws
from engine.rounds.stream import Stream

log = logging.getLogger(__name__)

# Prompt tokens per prefill chunk. On the CPU a chunk of 128 prefills as fast per token as one of
# 512 (the attention a long chunk adds costs as much as the passes it saves) and costs a round
# ~0.5 s instead of ~3 s; on a GPU passes are cheap and fewer chunks win.
PREFILL_CHUNK = 512
CPU_PREFILL_CHUNK = 128
# Padded positions (streams x the longest chunk) of a pass that prefills several joining streams
# (engine.rounds.joins). On a GPU four chunks' (16 streams of the mixed workload: more tok/s than
# one chunk's, `scripts/gpu-bench.sh` step joins); on the CPU, where attention pays per padded
# position, one chunk's.
JOINED_PREFILL = 4 * PREFILL_CHUNK


class Scheduler:
    def __init__(
        self,
        loaded: LoadedModel,
        emit: Callable[[Event], None],
        *,
        recall: RecallIndex | None = None,
        costs: CostModel | None = None,
        conversations: ConversationCache | None = None,
        limits: MemoryLimits | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.emit = emit
        fam = loaded.family
        self.recall = recall if recall is not None else RecallIndex(min_match=fam.min_match["recall"])
        self.costs = costs if costs is not None else CostModel()
        self.passes = passes = loaded.passes  # chosen at load (engine.passes.choice)
        self.costs.grouped, self.costs.row_step = passes.grouped, passes.draft_step
        self.row_multiple = passes.row_multiple
        self.prefill_chunk = CPU_PREFILL_CHUNK if loaded.device == "cpu" else PREFILL_CHUNK
        self.prefill_pass = CPU_PREFILL_CHUNK if loaded.device == "cpu" else JOINED_PREFILL
        self.blas = blas_threads.tuner() if loaded.device == "cpu" else None  # threads the load leaves
        self.limits = limits or limits_for(machine_memory(), weight_bytes(self.model),
                                           kv_bytes_per_token(self.model, list(loaded.kinds)), budget=memory_limit)
        self.admission = Admission(loaded, self.limits)
        self.conversations = (conversations if conversations is not None
                              else ConversationCache(self.limits.conversation_cache_bytes))
        self.lanes = passes.lanes(loaded.kinds)
        self.active: list[Stream] = []  # row i of self.lanes is self.active[i]
        self.joining: list[Joining] = []
        # Admitted in order once streams and KV memory have room, each with its prompt rendered once.
        self.waiting: list[tuple[Request, Rendered]] = []
        self.round = 0
        self.forward_s = 0.0  # summed over rounds: forward passes
        self.host_s = 0.0  # summed over rounds: everything else in a round
        self.histogram: dict[int, int] = {}  # drafts accepted per verified window -> windows
        self.ahead: RunAhead | None = None
        self.rounds_ahead, self.aheads_dropped = 0, 0  # rounds run ahead and kept, or dropped (run_ahead)
        self.copies_continued = 0  # of those kept, rounds that ran ahead after a drafting round
        self.continue_copies = True  # run a drafting round's successor ahead, where the passes speculate
        self.start_copies = True  # and start in rounds run ahead copies granted no rows where they pay
        self.probe_starts = True  # and a lone stream's window due a probe, one row
        self.probes_started = 0  # such probes started
        # Rounds run as a grouped pass (engine.passes.grouped), by numpy (engine.passes.numpy_pass);
        # prefill chunks computed inside a round's (grouped) pass.
        self.rounds_grouped, self.rounds_host, self.chunks_ridden = 0, 0, 0
        self.prefills_joined = 0  # passes that prefilled several joining streams (engine.rounds.joins)

    # -- requests ------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Validate (raising before any compute) and queue ``request`` for prefill, or, when the running
        streams leave no room (``engine.rounds.admission``), to wait: a ``Waiting`` event says why."""
        admitted = self.admission.check(request)
        if admitted.rendered.notice is not None:
            self.emit(Notice(request.id, admitted.rendered.notice))
        reason = self.admission.no_room(len(admitted.rendered.tokens) + admitted.request.max_tokens, self._running())
        if reason is not None or self.waiting:
            self.waiting.append((admitted.request, admitted.rendered))
            self.emit(Waiting(request.id, reason or "waiting for earlier requests to start"))
            return
        self._join(admitted.request, admitted.rendered)

    def _running(self) -> list[int]:
        """How far each running or joining stream's reply may reach (prompt plus max tokens)."""
        return [len(s.prompt) + s.request.max_tokens for s in [*self.active, *(j.stream for j in self.joining)]]

    def _admit_waiting(self) -> None:
        while self.waiting:
            request, rendered = self.waiting[0]
            if self.admission.no_room(len(rendered.tokens) + request.max_tokens, self._running()) is not None:
                return
            self.waiting.pop(0)
            self._join(request, rendered)

    def _join(self, request: Request, rendered: Rendered) -> None:
        prompt = rendered.tokens
        stream = Stream.start(request, prompt, self.loaded.family, self.tokenizer)
        stream.left_out = rendered.left_out
        caches: list[Any] | None = None
        taken = (self.conversations.take(request.conversation, prompt) if request.conversation
                 else self.conversations.take_longest(prompt) if request.prefix_cache else None)
        if taken is not None:
            caches, stream.reused = taken
        if caches is None:
            caches = make_caches(list(self.loaded.kinds))
        self.joining.append(Joining(stream, caches, stream.reused))

    def cancel(self, request_id: str) -> bool:
        for s in self.active:
            if s.id == request_id:
                s.cancelled = True
                return True
        for j in self.joining:
            if j.stream.id == request_id:
                j.stream.cancelled = True
                return True
        for request, rendered in self.waiting:
            if request.id == request_id:  # never started: it ends here, with nothing said
                self.waiting.remove((request, rendered))
                stream = Stream.start(request, rendered.tokens, self.loaded.family, self.tokenizer)
                stream.stop_reason = "cancelled"
                self._finish(stream, caches=None)
                return True
        return False

    def reset(self) -> None:
        """Forget every stream (after a fault outside any one of them)."""
        self.active, self.joining, self.waiting, self.ahead = [], [], [], None
        self.lanes = self.passes.lanes(self.loaded.kinds)

    @property
    def busy(self) -> bool:
        return bool(self.active or self.joining or self.waiting)

    # -- the loop ------------------------------------------------------------
    def step(self) -> None:
        if self.blas is not None:
            self.blas.tune()
        with self.on_device():
            self._drop_cancelled()
            self._admit_waiting()
            rode = False
            if self.active:
                rode = self._round(joins.rider(self))
            if self.joining:
                joins.prefill(self, compute=not rode)

    def calibrate(self, repeats: int = 2) -> None:
        """Time the forward pass at a few shapes here, before any stream (``engine.rounds.calibration``)."""
        with self.on_device():
            calibrate(self, repeats)

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """On an accelerator, MLX work goes to mlx-lm's generation stream, as its own loops' does."""
        with mx.stream(generation_stream) if self.loaded.device != "cpu" else contextlib.nullcontext():
            yield

    # -- internals -----------------------------------------------------------
    def _drop_cancelled(self) -> None:
        for j in [j for j in self.joining if j.stream.cancelled]:
            self.joining.remove(j)
            j.stream.stop_reason = "cancelled"
            self._finish(j.stream, caches=None)
        for row in reversed(range(len(self.active))):
            s = self.active[row]
            if s.cancelled:
                s.stop_reason = "cancelled"
                self._leave(row)

    def _plan(self) -> RoundPlan:
        windows: list[Window | None] = []
        offers: list[Offer] = []
        for i, s in enumerate(self.active):
            s.rates.tick()
            w = s.propose(self.recall, s.request.recall_exclude or s.request.conversation or s.id)
            windows.append(w)
            if w is not None:
                probe = s.own_rates and s.rates.probe_due(w.rate_key)
                rate, first = s.price(w)
                offers.append(Offer(stream=i, rate=rate, max_rows=min(len(w.tokens), self.loaded.family.max_window),
                                    probe=probe, first_rate=first))
        if offers and not (self.ahead is not None and self.ahead.drafts is not None):  # those verify its drafts
            keys, batch, ahead = max(self.lanes.lengths), len(self.active), self.ahead is not None
            # Where draft-free rounds run ahead, one costs what such rounds take; a round already run
            # ahead is kept at that price, or dropped: drafting then pays for its pass too (in round
            # costs, engine.rounds.calibration, a round run ahead's: a one-row round's holds two passes).
            keep = self.costs.kept(batch, keys) if ahead or self.passes.speculate_ahead else None
            dropping = 0.0 if not ahead else (
                self.costs.kept(batch, keys) if self.passes.round_costs else self.costs.cost(batch, 1, keys=keys))
            alloc = allocate(offers, batch, partial(self.costs.cost, keys=keys), self.costs.overhead,
                             min_row_value=self.loaded.family.min_row_value, keep_seconds=keep, dropping=dropping)
            rows = list(alloc.rows)
        else:
            rows = [0] * len(self.active)
        return RoundPlan(list(self.active), windows, rows)

    def _round(self, rider: Joining | None = None) -> bool:
        """One shared round; ``rider``'s next prompt chunk goes in its pass. Returns whether it did."""
        t_start = time.perf_counter()
        self.round += 1
        r = self._prepare(rider)
        saved = (self.lanes.save(r.width), r.chunk.save()) if r.chunk is not None else None
        t_fwd = time.perf_counter()
        try:
            choice_rows, advanced = self._forward(r)
        except Exception as exc:
            self.ahead = None
            self.lanes.end_round()
            if r.chunk is not None and saved is not None:
                # Whose fault is unknown: undo the whole pass (not counted as a round), run the round
                # alone now and leave the chunk to step(), so the fault lands on whoever caused it.
                self.lanes.restore(saved[0])
                r.chunk.restore(saved[1])
                self.round -= 1
                log.warning("a round with a prompt chunk in its pass raised (%s); running them apart", exc)
                self._round()
                return False
            for row in reversed(range(len(r.plan.streams))):
                self._fail_row(row, exc)
            return False
        forward_s = time.perf_counter() - t_fwd
        if r.chunk is not None and rider is not None:
            rider.done += len(r.chunk.tokens)
            self.chunks_ridden += 1
        done, failures = self._verify(r, choice_rows, advanced, forward_s, t_start)
        self.lanes.settle()
        self.lanes.end_round()
        for row in reversed(done):
            if row in failures:
                self._fail_row(row, failures[row])
            else:
                self._leave(row)
        host_s = time.perf_counter() - t_start - forward_s
        self.forward_s += forward_s
        self.host_s += host_s
        # Not timed: a round that ran ahead or waited for a dropped one (part of a pass, or two), a chunk's.
        if r.kind in ("host", "grouped", "padded") and r.chunk is None and not r.waited:
            # numpy's pass is unpadded, as a grouped one is; with no stream drafting both are uniform.
            wide = r.wide if r.kind == "grouped" or (r.kind == "host" and r.wide) else None
            self.costs.observe(r.batch, r.width, forward_s, wide, r.keys)
        elif r.kind == "ahead" and r.width == 1:
            self.costs.observe_kept(r.batch, forward_s + host_s)
        self.costs.observe_overhead(host_s)
        return r.chunk is not None

    def _prepare(self, rider: Joining | None) -> Round:
        """Plan the round and choose its pass: one that ran ahead, numpy's, grouped or padded."""
        plan = self._plan()
        pending = self.ahead is not None
        claimed = run_ahead.claim(self, plan)
        ahead, continued = claimed if claimed is not None else (None, None)
        if continued is not None:  # a round run ahead continued copies: it verifies those drafts
            plan = RoundPlan(plan.streams, run_ahead.agreeing(plan.windows, continued), [len(d) for d in continued])
        drafts = continued if continued is not None else [
            list(w.tokens[:k]) if w is not None else [] for w, k in zip(plan.windows, plan.rows, strict=True)]
        rows = [[s.last_token, *d] for s, d in zip(plan.streams, drafts, strict=True)]
        sampling = [i for i, s in enumerate(plan.streams) if s.request.temperature > 0]
        chunk = None
        if rider is not None and ahead is None:
            chunk = Chunk(rider.stream.prompt[rider.done : joins.chunk_end(self, rider)], rider.caches)
        r = Round(plan, drafts, rows, sampling, "padded", chunk, ahead, keys=max(self.lanes.lengths),
                  waited=pending and ahead is None)
        if ahead is not None:
            r.kind = "ahead"
        elif chunk is None and self.passes.numpy_pass is not None:
            r.kind = "host"
        elif chunk is not None or (self.passes.numpy_ops and r.width > 1) or self.costs.groups_pay(
                r.batch, r.width, r.wide, r.keys):
            r.kind = "grouped"
        return r

    def _forward(self, r: Round) -> tuple[list[list[int]], bool]:
        """Run the round's pass: each stream's choice per row (greedy, or drawn for a sampling stream:
        ``engine.rounds.sampling``), and whether the lanes were already advanced (a next round ran ahead)."""
        sizes = [len(row) for row in r.rows]
        starts = list(itertools.accumulate(sizes, initial=0))
        if r.kind == "ahead":  # computed already: its positions are this round's
            assert r.ahead is not None
            self.lanes.begin_round(r.width, sizes)
            return self._choices(r, r.ahead[:, : r.width])  # streams that left may have been the widest
        if r.kind == "host":
            assert self.passes.numpy_pass is not None
            self.rounds_host += 1
            self.lanes.begin_host(sizes)
            logits = self.passes.numpy_pass.logits(self.lanes, r.rows)
            best = logits.argmax(axis=-1).tolist()
            rows = [best[starts[i] : starts[i + 1]] for i in range(r.batch)]
            draws = self._draws(r, {i: mx.array(logits[starts[i] : starts[i + 1]]) for i in r.sampling})
            mx.eval(list(draws.values()))
            for i, d in draws.items():
                rows[i] = d.tolist()
            return rows, False
        if r.kind == "grouped":
            if r.chunk is None:  # rounds with a chunk are counted in chunks_ridden
                self.rounds_grouped += 1
            groups = self.lanes.begin_grouped(sizes)
            flat = grouped_logits(self.model, self.lanes, groups, r.rows, self.row_multiple, r.chunk,
                                  self.passes.numpy_ops, self.passes.rope_table)
            pad = [[starts[i] + min(j, n - 1) for j in range(r.width)] for i, n in enumerate(sizes)]
            choices = mx.argmax(flat, axis=-1)[mx.array(pad, dtype=mx.int32)]
            draws = self._draws(r, {i: flat[starts[i] : starts[i + 1]] for i in r.sampling})
            return self._choices(r, with_draws(choices, draws))
        step = self.passes.draft_step
        compiled = step > 1 and r.width > 1  # a drafting round runs compiled, padded (RoundPasses.draft_step)
        width = padded_width(r.width, step) if compiled else r.width
        self.lanes.begin_round(width, sizes, fixed=compiled)
        # Padding repeats a stream's last row: masked out by position, never kept.
        inputs = [row + [row[-1]] * (width - len(row)) for row in r.rows]
        logits = self.passes.padded(self.model, self.lanes, mx.array(inputs, dtype=mx.int32))
        draws = self._draws(r, {i: logits[i, : sizes[i]] for i in r.sampling})
        choices = mx.argmax(logits if width == r.width else logits[:, : r.width], axis=-1)  # padding never read
        return self._choices(r, with_draws(choices, draws))

    def _draws(self, r: Round, logits: dict[int, mx.array]) -> dict[int, mx.array]:
        """Each sampling stream's draws for its rows of this round (``logits[i]`` [rows, vocab])."""
        rows = {}
        for i, lg in logits.items():
            s = r.plan.streams[i]
            assert s.keys is not None
            rows[i] = Rows(s.keys, lg, len(s.output), s.request.temperature, s.request.top_p)
        return draw_all(rows, self.passes.compiled_draws)

    def _choices(self, r: Round, choices: mx.array) -> tuple[list[list[int]], bool]:
        """Queue the next round ahead where nothing can change it, then bring the choices to the host."""
        advanced = run_ahead.start(self, r, choices)
        mx.eval(choices, *(cache_arrays(r.chunk.caches) if r.chunk is not None else []))
        return choices.tolist(), advanced

    def _verify(self, r: Round, choice_rows: list[list[int]], advanced: bool, forward_s: float,
                t_start: float) -> tuple[list[int], dict[int, Exception]]:
        """Verify each stream's drafts, advance its lanes, emit its tokens and round statistics.
        Returns the rows that are done, and those that failed with why (one stream's failure
        leaves the others running)."""
        done: list[int] = []
        failures: dict[int, Exception] = {}
        for i, s in enumerate(r.plan.streams):
            try:
                d = r.drafts[i]
                accepted, nxt = verify(choice_rows[i][: len(d) + 1], d)  # draws too: their module says why
                if not advanced:
                    self.lanes.advance(i, accepted + 1)
                window = r.plan.windows[i] if d else None  # a window granted no rows was not verified
                # Drafts with no window: a copy continued ahead that broke before them (run_ahead).
                origins: list[Origin] = ["model"] * accepted
                if window is not None:
                    s.record_window(window, len(d), accepted)
                    self.histogram[accepted] = self.histogram.get(accepted, 0) + 1
                    origins = [window.source] * accepted  # type: ignore[list-item]
                tokens, origins, text = s.accept([*d[:accepted], nxt], [*origins, "model"])
                s.rounds += 1
                if tokens or text:
                    self.emit(Tokens(s.id, tuple(tokens), tuple(origins), text))
                self.emit(RoundStats(
                    s.id, self.round, r.batch, r.width, len(d), accepted, window.source if window else None,
                    forward_s, time.perf_counter() - t_start - forward_s, window.rate_key if window else None,
                    len(r.chunk.tokens) if r.chunk is not None else 0))
                if s.stop_reason is not None:
                    done.append(i)
            except Exception as exc:
                failures[i] = exc
                done.append(i)
        return done, failures

    def _leave(self, row: int) -> None:
        s, self.active[row] = self.active[row], self.active[-1]  # as the lanes move their last row
        self.active.pop()
        caches = self.lanes.extract(row) if s.request.conversation or s.request.prefix_cache else None
        kept = self.lanes.lengths[row]
        self.lanes.remove(row, self.ahead.reach if self.ahead is not None else 0)
        self._finish(s, caches, kept)

    def _fail_row(self, row: int, exc: BaseException) -> None:
        s, self.active[row] = self.active[row], self.active[-1]
        self.active.pop()
        self.lanes.remove(row, self.ahead.reach if self.ahead is not None else 0)
        self._fail(s, exc)

    def _finish(self, s: Stream, caches: list[Any] | None, kept: int = 0) -> None:
        if caches is not None:
            key = s.request.conversation or PREFIX + s.id
            self.conversations.put(key, (s.prompt + s.output)[:kept], caches)
        self.emit(s.finished())

    def _fail(self, s: Stream, exc: BaseException) -> None:
        log.exception("stream %s failed", s.id, exc_info=exc)
        self.emit(Failed(s.id, str(exc) or type(exc).__name__, type(exc).__name__, s.text, s.rates.snapshot()))
