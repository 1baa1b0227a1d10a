"""Shared rounds: every active stream advances in one batched forward pass.

``Scheduler.step()`` runs one round for the active streams and at most one
prefill chunk of a joining stream. Where the model has grouped passes
(``engine.forward``) the chunk rides in the round's own pass, so running streams
keep their pace while a long prompt joins; elsewhere it runs after the round, and
stalls them by at most one chunk. On the CPU a round without a chunk runs on numpy
(``engine.hostpass``), for the models it knows. It runs on whichever single thread owns MLX
(the engine thread, or the benchmark's main thread) and reports through ``emit``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

from engine.allocator import Offer, allocate
from engine.cachekinds import LayerKind, cache_arrays, length_of, make_caches
from engine.chattemplate import Rendered, render
from engine.contextcost import ContextSample, fit
from engine.convcache import ConversationCache
from engine.copyindex import RecallIndex, Window
from engine.costmodel import (
    CALIBRATION_KEYS,
    CALIBRATION_SHAPES,
    CONTEXT_CALIBRATION_SHAPES,
    GROUPED_CALIBRATION_SHAPES,
    LONG_CALIBRATION_KEYS,
    CostModel,
)
from engine.errors import LanesError, MemoryLimitError, PromptTooLongError
from engine.events import (
    Event,
    Failed,
    Finished,
    Notice,
    Origin,
    ReplyStats,
    Request,
    RoundStats,
    Tokens,
    Waiting,
)
from engine.forward import ROW_MULTIPLE, Chunk, grouped_logits, prefill, supports_grouped
from engine.hostpass import HostPass, supports_host
from engine.lanecache import LaneCache
from engine.memory import MemoryLimits, limits_for, machine_memory, mib
from engine.models import LoadedModel
from engine.padded import padded_logits, supports_padded
from engine.stream import Stream
from engine.verify import adjusted_probs, verify_greedy, verify_sampled

log = logging.getLogger(__name__)

# Prompt tokens per prefill chunk. On the CPU a chunk of 128 prefills as fast per token as one of
# 512 (the attention a long chunk adds costs as much as the passes it saves) and costs a round
# ~0.5 s instead of ~3 s; on a GPU passes are cheap and fewer chunks win.
PREFILL_CHUNK = 512
CPU_PREFILL_CHUNK = 128


@dataclass
class Joining:
    """A stream whose prompt is being prefilled, one chunk per step."""

    stream: Stream
    caches: list[Any]  # mlx-lm caches of one stream, one per cached layer (engine.cachekinds)
    done: int  # prompt tokens already in the caches


@dataclass
class RoundPlan:
    streams: list[Stream]
    windows: list[Window | None]
    rows: list[int]


@dataclass
class RunAhead:
    """A draft-free round started before the previous round's tokens reached the host."""

    streams: list[Stream]  # its rows, in order
    choices: mx.array  # [len(streams), 1] greedy choices, still being computed


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
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.emit = emit
        fam = loaded.family
        self.recall = recall if recall is not None else RecallIndex(min_match=fam.min_match["recall"])
        self.costs = costs if costs is not None else CostModel()
        self.costs.grouped = supports_grouped(self.model)  # rounds may be grouped (engine.forward)
        self.row_multiple = ROW_MULTIPLE if loaded.device == "cpu" else 1
        self.prefill_chunk = CPU_PREFILL_CHUNK if loaded.device == "cpu" else PREFILL_CHUNK
        # Softmax and SiLU on numpy (engine.hostexp): every pass of several rows runs grouped then.
        self.host_exp = loaded.device == "cpu" and self.costs.grouped
        # Rotary cosines and sines made once a pass (engine.rotary): the CPU's rope rebuilds them per call.
        self.rope_table = loaded.device == "cpu" and supports_padded(self.model)
        # Rounds without a prompt chunk computed by numpy on the CPU (engine.hostpass).
        self.host_pass = HostPass(self.model) if loaded.device == "cpu" and supports_host(self.model) else None
        self.limits = limits if limits is not None else limits_for(
            machine_memory(), weight_bytes(self.model), kv_bytes_per_token(self.model, list(loaded.kinds)))
        self.conversations = (conversations if conversations is not None
                              else ConversationCache(self.limits.conversation_cache_bytes))
        self.lanes = LaneCache(list(loaded.kinds))
        self.active: list[Stream] = []  # row i of self.lanes is self.active[i]
        self.joining: list[Joining] = []
        self.waiting: list[Request] = []  # admitted in order once streams and KV memory have room
        self.round = 0
        self.forward_s = 0.0  # summed over rounds: forward passes
        self.host_s = 0.0  # summed over rounds: everything else in a round
        self.histogram: dict[int, int] = {}  # drafts accepted per verified window -> windows
        self.ahead: RunAhead | None = None
        self.rounds_ahead = 0  # rounds that ran ahead (see _run_ahead)
        self.rounds_grouped = 0  # rounds the cost model ran as a grouped pass (engine.forward)
        self.rounds_host = 0  # rounds run by numpy (engine.hostpass)
        self.chunks_ridden = 0  # prefill chunks computed inside a round's (grouped) pass

    # -- requests ------------------------------------------------------------
    def prompt_tokens(self, request: Request) -> list[int]:
        return self._render(request).tokens

    def _render(self, request: Request) -> Rendered:
        """The request's prompt tokens (its own, or its messages through the chat template), checked
        against the context limit."""
        if request.prompt_tokens is not None:
            rendered = Rendered(list(request.prompt_tokens), None)
        else:
            rendered = render(self.tokenizer, request.messages)
        tokens = rendered.tokens
        if len(tokens) < 2:
            raise LanesError("a prompt needs at least two tokens: give at least one message")
        limit = self.loaded.context_length
        if len(tokens) >= limit:
            raise PromptTooLongError(
                f"prompt of {len(tokens)} tokens exceeds {self.loaded.name}'s context limit of {limit} tokens"
            )
        return rendered

    def submit(self, request: Request) -> None:
        """Validate (raising before any compute) and queue ``request`` for prefill, or, when the
        running streams leave no room (engine.memory), to wait: a ``Waiting`` event says why."""
        if request.max_tokens < 1:
            raise LanesError(f"max_tokens must be at least 1 (got {request.max_tokens})")
        if not 0.0 <= request.top_p <= 1.0 or request.temperature < 0:
            raise LanesError("temperature must be >= 0 and top_p within 0..1")
        rendered = self._render(request)
        prompt = rendered.tokens
        if rendered.notice is not None:
            self.emit(Notice(request.id, rendered.notice))
        room = self.loaded.context_length - len(prompt)
        if request.max_tokens > room:
            request = replace(request, max_tokens=room)
        need = self._reserve(len(prompt), request.max_tokens)
        if need > self.limits.kv_bytes:
            raise MemoryLimitError(
                f"a reply of {len(prompt)} prompt and {request.max_tokens} new tokens needs {mib(need)} of KV "
                f"memory; {self.loaded.name} may use {mib(self.limits.kv_bytes)} for replies on this machine "
                f"({self.limits.kv_tokens:,} tokens): ask for fewer tokens or shorten the conversation"
            )
        reason = self._no_room(need)
        if reason is not None or self.waiting:
            self.waiting.append(request)
            self.emit(Waiting(request.id, reason or "waiting for earlier requests to start"))
            return
        self._join(request, prompt)

    def _reserve(self, prompt: int, max_tokens: int) -> int:
        """KV bytes a stream reserves: every position its reply may reach."""
        return (prompt + max_tokens) * self.limits.kv_bytes_per_token

    def _reserved(self) -> int:
        streams = [*self.active, *(j.stream for j in self.joining)]
        return sum(self._reserve(len(s.prompt), s.request.max_tokens) for s in streams)

    def _no_room(self, need: int) -> str | None:
        running = len(self.active) + len(self.joining)
        if running >= self.limits.max_streams:
            return f"{running} replies are running, the most {self.loaded.name} runs at once"
        if self._reserved() + need > self.limits.kv_bytes:
            return (f"running replies hold {mib(self._reserved())} of the {mib(self.limits.kv_bytes)} of KV "
                    f"memory {self.loaded.name} may use here")
        return None

    def _admit_waiting(self) -> None:
        while self.waiting:
            request = self.waiting[0]
            prompt = self.prompt_tokens(request)
            if self._no_room(self._reserve(len(prompt), request.max_tokens)) is not None:
                return
            self.waiting.pop(0)
            self._join(request, prompt)

    def _join(self, request: Request, prompt: list[int]) -> None:
        stream = Stream.start(request, prompt, self.loaded.family, self.tokenizer)
        caches: list[Any] | None = None
        if request.conversation:
            taken = self.conversations.take(request.conversation, prompt)
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
        for request in self.waiting:
            if request.id == request_id:  # never started: it ends here, with nothing said
                self.waiting.remove(request)
                stream = Stream.start(request, self.prompt_tokens(request), self.loaded.family, self.tokenizer)
                stream.stop_reason = "cancelled"
                self._finish(stream, caches=None)
                return True
        return False

    def reset(self) -> None:
        """Forget every stream (after a fault outside any one of them)."""
        self.active.clear()
        self.joining.clear()
        self.waiting.clear()
        self.ahead = None
        self.lanes = LaneCache(list(self.loaded.kinds))

    @property
    def busy(self) -> bool:
        return bool(self.active or self.joining or self.waiting)

    # -- the loop ------------------------------------------------------------
    def step(self) -> None:
        self._drop_cancelled()
        self._admit_waiting()
        rode = False
        if self.active:
            rode = self._round(self._rider())
        if self.joining:
            self._prefill_chunk(compute=not rode)

    def calibrate(self, repeats: int = 2) -> None:
        """Time the forward pass at a few shapes on this machine (before any stream).

        A few shapes are timed at a long context too, to price each key of context first
        (``engine.contextcost``); the short timings are then folded in net of their context.
        """
        short_ctx = self._filler_context(CALIBRATION_KEYS)
        long_ctx = self._filler_context(LONG_CALIBRATION_KEYS)
        short = {(b, w): self._time_pass(short_ctx, [w] * b, grouped=False, repeats=repeats)
                 for b, w in CALIBRATION_SHAPES}
        self.costs.context = fit([
            ContextSample(b, w, CALIBRATION_KEYS, short[(b, w)], LONG_CALIBRATION_KEYS,
                          self._time_pass(long_ctx, [w] * b, grouped=False, repeats=1))
            for b, w in CONTEXT_CALIBRATION_SHAPES
        ])
        for (batch, width), seconds in short.items():
            self.costs.observe(batch, width, seconds, keys=CALIBRATION_KEYS)
        if self.costs.grouped:
            for batch, width, wide in GROUPED_CALIBRATION_SHAPES:
                widths = [width] * wide + [1] * (batch - wide)
                seconds = self._time_pass(short_ctx, widths, grouped=True, repeats=repeats)
                self.costs.observe(batch, width, seconds, wide, keys=CALIBRATION_KEYS)

    def _filler_context(self, keys: int) -> list[Any]:
        """Per-layer caches holding ``keys`` tokens of context, for timing passes (the values don't matter)."""
        caches = make_caches(list(self.loaded.kinds))
        self.model(mx.zeros((1, CALIBRATION_KEYS), dtype=mx.int32), cache=caches)
        if keys > CALIBRATION_KEYS:  # the rest as zeros: computing it would cost a long prefill
            for c in caches:
                if not isinstance(c, KVCache):
                    continue  # a recurrent state is as large at any length
                k, v = c.keys, c.values
                c.update_and_fetch(mx.zeros((*k.shape[:2], keys - c.offset, k.shape[3]), dtype=k.dtype),
                                   mx.zeros((*v.shape[:2], keys - c.offset, v.shape[3]), dtype=v.dtype))
        mx.eval(cache_arrays(caches))
        return caches

    def _time_pass(self, context: list[Any], widths: list[int], grouped: bool, repeats: int) -> float:
        """Best of ``repeats`` timings of one pass, every stream holding the filler ``context``."""
        lanes = LaneCache(list(self.loaded.kinds))
        for _ in widths:
            lanes.add(context, length_of(context) or CALIBRATION_KEYS)
        width = max(widths)
        best = float("inf")
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            if self.host_pass is not None:
                lanes.begin_host(widths)
                self.host_pass.logits(lanes, [[0] * w for w in widths]).argmax(axis=-1)
            elif grouped or (self.host_exp and width > 1):
                groups = lanes.begin_grouped(widths)
                logits = grouped_logits(self.model, lanes, groups, [[0] * w for w in widths], self.row_multiple,
                                        host_exp=self.host_exp, rope_table=self.rope_table)
            else:
                lanes.begin_round(width)
                logits = self._padded(lanes, mx.zeros((len(widths), width), dtype=mx.int32))
            if self.host_pass is None:
                mx.eval(mx.argmax(logits, axis=-1))
            best = min(best, time.perf_counter() - t0)
            lanes.end_round()
        return best

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

    def _chunk_end(self, job: Joining) -> int:
        return min(job.done + self.prefill_chunk, len(job.stream.prompt) - 1)

    def _rider(self) -> Joining | None:
        """The joining stream whose next chunk can ride in this round's pass, if any.

        Not while a round that ran ahead is pending: its pass is already queued.
        """
        if not self.joining or self.ahead is not None or not self.costs.grouped:
            return None
        job = self.joining[0]
        return job if self._chunk_end(job) > job.done else None

    def _prefill_chunk(self, compute: bool = True) -> None:
        """Prefill the first joining stream's next chunk (unless it rode in the round: ``compute``
        False), and move it to the active streams once its prompt is in."""
        job = self.joining[0]
        s = job.stream
        try:
            end = self._chunk_end(job)
            if compute and end > job.done:
                # The transformer body only: prefill needs keys and values, not logits, and the
                # vocabulary projection is a fifth of this model's compute.
                if self.host_exp:
                    prefill(self.model, Chunk(s.prompt[job.done : end], job.caches), self.row_multiple, True,
                            self.rope_table)
                else:
                    body = _body(self.model)
                    body(mx.array(s.prompt[job.done : end])[None], cache=job.caches)
                    mx.eval(cache_arrays(job.caches))
                job.done = end
            if job.done < len(s.prompt) - 1:
                return
            self.joining.pop(0)
            self.lanes.add(job.caches, job.done)
            self.active.append(s)
        except Exception as exc:  # one stream's failure leaves the others running
            if self.joining and self.joining[0] is job:
                self.joining.pop(0)
            self._fail(s, exc)

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
                offers.append(Offer(stream=i, rate=rate, max_rows=len(w.tokens), probe=probe, first_rate=first))
        if offers:
            cost = partial(self.costs.cost, keys=max(self.lanes.lengths))
            alloc = allocate(offers, len(self.active), cost, self.costs.overhead,
                             min_row_value=self.loaded.family.min_row_value)
            rows = list(alloc.rows)
        else:
            rows = [0] * len(self.active)
        return RoundPlan(list(self.active), windows, rows)

    def _round(self, rider: Joining | None = None) -> bool:
        """One shared round; ``rider``'s next prompt chunk goes in its pass. Returns whether it did."""
        t_start = time.perf_counter()
        self.round += 1
        plan = self._plan()
        width = 1 + max(plan.rows)
        batch = len(plan.streams)
        drafts = [list(w.tokens[:k]) if w is not None else [] for w, k in zip(plan.windows, plan.rows, strict=True)]
        rows = [[s.last_token, *d] for s, d in zip(plan.streams, drafts, strict=True)]
        sampling = [i for i, s in enumerate(plan.streams) if s.request.temperature > 0]

        ahead = self._claim_ahead(plan, width)
        wide = sum(1 for d in drafts if d)
        keys = max(self.lanes.lengths)  # the longest context: a padded pass attends every stream over it
        chunk = None
        if rider is not None and ahead is None:
            chunk = Chunk(rider.stream.prompt[rider.done : self._chunk_end(rider)], rider.caches)
        host = chunk is None and ahead is None and self.host_pass is not None
        grouped = not host and (chunk is not None or (
            ahead is None and ((self.host_exp and width > 1) or self.costs.groups_pay(batch, width, wide, keys))
        ))
        saved = (self.lanes.save(width), chunk.save()) if chunk is not None else None
        choice_rows: list[list[int]] = []
        if host:
            self.rounds_host += 1
            self.lanes.begin_host([len(r) for r in rows])
        elif grouped:
            if chunk is None:  # rounds with a chunk are counted in chunks_ridden
                self.rounds_grouped += 1
            groups = self.lanes.begin_grouped([len(r) for r in rows])
        else:
            self.lanes.begin_round(width, [len(r) for r in rows])
        t_fwd = time.perf_counter()
        try:
            choices: mx.array | None = None
            advanced = False
            if ahead is not None:
                choices, picked = ahead, []
            elif host:
                assert self.host_pass is not None
                logits = self.host_pass.logits(self.lanes, rows)
                best = logits.argmax(axis=-1).tolist()
                starts = list(itertools.accumulate((len(r) for r in rows), initial=0))
                choice_rows = [best[starts[i] : starts[i + 1]] for i in range(batch)]
                picked = [logits[starts[i] : starts[i + 1]] for i in sampling]
            elif grouped:
                flat = grouped_logits(self.model, self.lanes, groups, rows, self.row_multiple, chunk, self.host_exp,
                                      self.rope_table)
                starts = list(itertools.accumulate((len(r) for r in rows), initial=0))
                pad = [[starts[i] + min(j, len(r) - 1) for j in range(width)] for i, r in enumerate(rows)]
                choices = mx.argmax(flat, axis=-1)[mx.array(pad, dtype=mx.int32)]
                picked = [flat[starts[i] : starts[i + 1]] for i in sampling]
            else:
                # Padding repeats a stream's last row: masked out by position, never kept.
                inputs = [r + [r[-1]] * (width - len(r)) for r in rows]
                logits = self._padded(self.lanes, mx.array(inputs, dtype=mx.int32))
                choices = mx.argmax(logits, axis=-1)
                picked = [logits[i, : len(drafts[i]) + 1] for i in sampling]
            if choices is not None:
                advanced = self._run_ahead(plan, width, sampling, choices)
                mx.eval(choices, *picked, *([c.keys for c in chunk.caches] if chunk is not None else []))
                choice_rows = choices.tolist()
        except Exception as exc:
            self.ahead = None
            self.lanes.end_round()
            if chunk is not None and saved is not None:
                # Whose fault is unknown: undo the whole pass (not counted as a round), run the round
                # alone now and leave the chunk to step(), so the fault lands on whoever caused it.
                self.lanes.restore(saved[0])
                chunk.restore(saved[1])
                self.round -= 1
                log.warning("a round with a prompt chunk in its pass raised (%s); running them apart", exc)
                self._round()
                return False
            for row in reversed(range(len(plan.streams))):
                self._fail_row(row, exc)
            return False
        forward_s = time.perf_counter() - t_fwd
        if chunk is not None and rider is not None:
            rider.done += len(chunk.tokens)
            self.chunks_ridden += 1
        sampled = dict(zip(sampling, picked, strict=True))

        done: list[int] = []
        failures: dict[int, Exception] = {}
        for i, s in enumerate(plan.streams):
            try:
                d = drafts[i]
                if i in sampled:
                    req = s.request
                    probs = adjusted_probs(np.array(sampled[i], dtype=np.float32), req.temperature, req.top_p)
                    assert s.rng is not None
                    accepted, nxt = verify_sampled(probs, d, s.rng)
                else:
                    accepted, nxt = verify_greedy(choice_rows[i][: len(d) + 1], d)
                if not advanced:
                    self.lanes.advance(i, accepted + 1)
                window = plan.windows[i] if d else None  # a window granted no rows was not verified
                origins: list[Origin] = []
                if window is not None:
                    s.record_window(window, len(d), accepted)
                    self.histogram[accepted] = self.histogram.get(accepted, 0) + 1
                    origins = [window.source] * accepted  # type: ignore[list-item]
                source = window.source if window is not None else None
                tokens, origins, text = s.accept([*d[:accepted], nxt], [*origins, "model"])
                s.rounds += 1
                if tokens or text:
                    self.emit(Tokens(s.id, tuple(tokens), tuple(origins), text))
                self.emit(
                    RoundStats(s.id, self.round, batch, width, len(d), accepted, source, forward_s,
                               time.perf_counter() - t_start - forward_s,
                               window.rate_key if window is not None else None,
                               len(chunk.tokens) if chunk is not None else 0)
                )
                if s.stop_reason is not None:
                    done.append(i)
            except Exception as exc:  # one stream's failure leaves the others running
                failures[i] = exc
                done.append(i)
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
        # A round that ran ahead waited for part of a pass, one with a chunk for more than its rows.
        if ahead is None and chunk is None:
            # numpy's pass is unpadded, as a grouped one is; with no stream drafting both are uniform.
            self.costs.observe(batch, width, forward_s, wide if grouped or (host and wide) else None, keys)
        self.costs.observe_overhead(host_s)
        return chunk is not None

    def _claim_ahead(self, plan: RoundPlan, width: int) -> mx.array | None:
        """This round's choices if a round that ran ahead computed it, else None (dropping it).

        Streams that left since it started are cut out of its rows; a stream it does not hold (none
        can join while one runs ahead) or a round that drafts after all means it cannot be used:
        the round is then computed afresh and overwrites the positions it wrote.
        """
        ahead, self.ahead = self.ahead, None
        if ahead is None or width != 1:
            return None
        rows = {id(s): i for i, s in enumerate(ahead.streams)}
        index = [rows.get(id(s)) for s in plan.streams]
        if any(i is None for i in index):
            return None
        self.rounds_ahead += 1
        if index == list(range(len(ahead.streams))):
            return ahead.choices
        return ahead.choices[mx.array(index, dtype=mx.int32)]

    def _run_ahead(self, plan: RoundPlan, width: int, sampling: list[int], choices: mx.array) -> bool:
        """Start the next round before this one's tokens reach the host, when nothing can change it.

        That holds when this round drafts nothing, samples nothing, no stream is joining, and no
        stream can offer a copy window next round whatever token it gets now
        (``Stream.surely_draft_free_next``): then every stream keeps exactly one position and the
        next round's inputs are this round's greedy choices, still on the device. The next pass is
        queued behind this one, so building its graph and this round's host work overlap the
        computation (mlx-lm's ``batch_generate`` overlaps its steps the same way). Returns whether
        the lanes were advanced here (each stream by one position).
        """
        if width != 1 or sampling or self.joining or self.lanes.recurrent:
            return False  # a recurrent state, once advanced, could not be overwritten like keys
        if not all(s.surely_draft_free_next(self.recall) for s in plan.streams):
            return False
        for row in range(len(plan.streams)):
            self.lanes.advance(row, 1)
        self.lanes.end_round()
        self.lanes.begin_round(1)
        logits = self._padded(self.lanes, choices.astype(mx.int32))
        self.ahead = RunAhead(list(plan.streams), mx.argmax(logits, axis=-1))
        mx.async_eval(self.ahead.choices)
        self.lanes.end_round()
        return True

    def _padded(self, lanes: LaneCache, tokens: mx.array) -> mx.array:
        """A padded pass's logits (after ``lanes.begin_round``): mlx-lm's model, or on the CPU the
        same arithmetic with the rotary table made once (``engine.padded``)."""
        if self.rope_table:
            return padded_logits(self.model, lanes, tokens)
        return self.model(tokens, cache=lanes.views)

    def _leave(self, row: int) -> None:
        s = self.active.pop(row)
        caches = self.lanes.extract(row) if s.request.conversation else None
        kept = self.lanes.lengths[row]
        self.lanes.remove(row)
        self._finish(s, caches, kept)

    def _fail_row(self, row: int, exc: BaseException) -> None:
        s = self.active.pop(row)
        self.lanes.remove(row)
        self._fail(s, exc)

    def _finish(self, s: Stream, caches: list[Any] | None, kept: int = 0) -> None:
        if caches is not None and s.request.conversation:
            self.conversations.put(s.request.conversation, (s.prompt + s.output)[:kept], caches)
        now = time.perf_counter()
        stats = ReplyStats(
            prompt_tokens=len(s.prompt),
            generated=len(s.output),
            seconds=now - s.started,
            first_token_s=None if s.first_token_at is None else s.first_token_at - s.started,
            prefill_reused=s.reused,
            rounds=s.rounds,
            rows=s.source_counts(),
        )
        reason = s.stop_reason or "length"
        self.emit(
            Finished(s.id, reason, tuple(s.output), tuple(s.origins), s.text, stats, s.rates.snapshot())
        )

    def _fail(self, s: Stream, exc: BaseException) -> None:
        log.exception("stream %s failed", s.id, exc_info=exc)
        self.emit(Failed(s.id, str(exc) or type(exc).__name__, type(exc).__name__, s.text, s.rates.snapshot()))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters as loaded (quantized weights count as stored)."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def kv_bytes_per_token(model: nn.Module, kinds: list[LayerKind]) -> int:
    """Bytes one position of context takes in every layer's KV cache (sliding-window layers are held
    whole: engine.cachekinds): measured on a one-token pass (mlx-lm's caches grow in steps, so the
    bytes are divided by the positions allocated). Recurrent states do not grow with context."""
    caches = make_caches(kinds)
    model(mx.zeros((1, 1), dtype=mx.int32), cache=caches)
    total = 0
    for c in caches:
        keys = getattr(c, "keys", None)
        if keys is not None:
            total += (keys.nbytes + c.values.nbytes) // keys.shape[2]
    return max(1, total)


def _body(model: nn.Module) -> nn.Module:
    """The model without its output head, where mlx-lm names it (prefill needs no logits)."""
    for name in ("model", "backbone"):
        inner = getattr(model, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return model
