"""Greedy Lanes output equals mlx-lm's ``stream_generate``, token for token,
whatever drafts are proposed and however many rows are granted."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

import engine.rounds.run_ahead as run_ahead_mod
import engine.rounds.scheduler as scheduler_mod
from engine.bench.cell_specs import parse_cell
from engine.bench.runner import prompts_for, run_lanes
from engine.bench.workloads import WorkItem, load_workload
from engine.drafts.allocator import MIN_ROW_VALUE, Allocation
from engine.drafts.context_cost import NO_CONTEXT_COST, ContextCost
from engine.drafts.copy_index import Window
from engine.drafts.cost_model import CostModel
from engine.events import Event, Finished, Request, RoundStats
from engine.passes.choice import ACCELERATOR, CONTINUED_STEP, GENERIC, accelerator
from engine.passes.compiled import CompiledPass
from engine.rounds.scheduler import Scheduler
from engine.rounds.stream import Stream
from tests import prompts

pytestmark = pytest.mark.model

MAX = 40


def adversarial_proposer(rng: random.Random, refs: dict[str, list[int]], vocab: int, eos: int):
    """Windows from every source: true continuations, true-then-wrong, random, eos, repeats."""

    def propose(self: Stream, recall, exclude) -> Window | None:
        ref = refs[self.id]
        pos = len(self.output)
        kind = rng.choice(["none", "true", "true-then-wrong", "random", "eos", "repeat", "off-by-one"])
        n = rng.randint(1, 16)
        if kind == "none":
            return None
        if kind == "true":
            toks = ref[pos : pos + n] or [eos]
        elif kind == "true-then-wrong":
            toks = ref[pos : pos + n // 2] + [rng.randrange(vocab) for _ in range(n - n // 2)]
        elif kind == "random":
            toks = [rng.randrange(vocab) for _ in range(n)]
        elif kind == "eos":
            toks = [eos] * n
        elif kind == "repeat":
            toks = [self.last_token] * n
        else:  # the right tokens one position late
            toks = ref[pos + 1 : pos + 1 + n] or [0]
        return Window(rng.choice(["context", "recall"]), tuple(toks), rng.randint(1, 32))

    return propose


def random_allocator(rng: random.Random):
    def allocate(offers, n_streams, cost, overhead, max_width=32, min_row_value=MIN_ROW_VALUE,
                 keep_seconds=None, dropping=0.0) -> Allocation:
        rows = [0] * n_streams
        for o in offers:
            rows[o.stream] = rng.randint(0, o.max_rows)
        return Allocation(tuple(rows), 0.0, 0.0)

    return allocate


@pytest.mark.parametrize("mode", ["host", "grouped", "padded", "ahead", "compiled", "compiled-alone", "drafts-uncompiled"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_equals_mlx_lm_under_adversarial_drafts(loaded, reference, chat_prompt, monkeypatch, seed, mode) -> None:
    """Host: rounds without a prompt chunk run on numpy (engine.passes.numpy_pass), the CPU's default.
    Grouped: every round of several rows runs as a grouped pass (a llama numpy's pass does not know).
    Padded: the generic pass, every round padded to its widest stream (run ahead where nothing can draft).
    Ahead: a GPU's passes, every draft-free round's successor run ahead and dropped when it drafts,
    and a round's successor run ahead with its copies' continuations and starts, at offsets the
    device computes (engine.rounds.run_ahead): kept whether those drafts land or not.
    Compiled: the same, the padded passes compiled over lanes of fixed shapes, as a GPU runs them;
    compiled-alone: a lone stream's draft-free rounds too, run ahead or not (as CUDA runs them, there
    with its attention as one kernel; here on MLX's masked ops); drafts-uncompiled: compiled, but
    drafting rounds at their planned width, uncompiled (the cell ``compile_drafts=false``)."""
    grouped = mode == "grouped"
    rng = random.Random(seed)
    monkeypatch.setattr(CostModel, "groups_pay", lambda self, b, w, k, keys=0: grouped and k is not None and 0 < k < b and w > 1)
    texts = [prompts.COPY, prompts.FRANCE, prompts.CODE, prompts.OPEN]
    rng.shuffle(texts)
    refs_by_id: dict[str, list[int]] = {}
    eos = next(iter(loaded.tokenizer.eos_token_ids))
    monkeypatch.setattr(Stream, "propose", adversarial_proposer(rng, refs_by_id, len(loaded.tokenizer), eos))
    monkeypatch.setattr(scheduler_mod, "allocate", random_allocator(rng))
    monkeypatch.setattr(run_ahead_mod, "allocate", random_allocator(rng))  # starts in rounds run ahead too

    assert loaded.passes.numpy_pass is not None  # the CPU's default
    passes = {"host": loaded.passes, "grouped": replace(loaded.passes, numpy_pass=None), "padded": GENERIC,
              "ahead": ACCELERATOR, "compiled": accelerator(loaded.model, loaded.kinds),
              "compiled-alone": replace(accelerator(loaded.model, loaded.kinds), compile_alone=True),
              "drafts-uncompiled": replace(accelerator(loaded.model, loaded.kinds), compile_drafts=False)}[mode]
    compiled_calls: list[tuple[bool, bool, int]] = []  # (queued ahead, fixed lanes, width) of each compiled pass
    compiled_call = CompiledPass.__call__

    def spying(self, lanes, tokens):
        compiled_calls.append((lanes.pending, lanes.fixed, tokens.shape[1]))
        return compiled_call(self, lanes, tokens)

    monkeypatch.setattr(CompiledPass, "__call__", spying)
    events: list[Event] = []
    sched = Scheduler(replace(loaded, passes=passes), events.append)
    pending = []
    for text in texts:
        req = Request(prompt_tokens=tuple(chat_prompt(text)), max_tokens=MAX)
        refs_by_id[req.id] = reference(chat_prompt(text), MAX)
        pending.append(req)
    # Streams join at different rounds, while others are mid-reply.
    sched.submit(pending.pop())
    while sched.busy or pending:
        if pending and rng.random() < 0.3:
            sched.submit(pending.pop())
        sched.step()
        for row, s in enumerate(sched.active):
            # The cache holds exactly the accepted tokens (all but the newest, fed next round).
            assert sched.lanes.lengths[row] == len(s.prompt) + len(s.output) - 1

    assert (sched.rounds_grouped > 0) == grouped
    assert (sched.rounds_host > 0) == (mode == "host")
    stats = [e for e in events if isinstance(e, RoundStats)]
    if mode in ("compiled", "compiled-alone", "drafts-uncompiled"):
        # Rounds queued with continuations ran compiled, a multiple of CONTINUED_STEP wide; so did
        # drafting rounds, unless the passes say not (then each ran at its own width, uncompiled).
        queued = [width for ahead, fixed, width in compiled_calls if ahead]
        assert queued and all(fixed and width % CONTINUED_STEP == 0 for ahead, fixed, width in compiled_calls if ahead)
        drafting = [(fixed, width) for ahead, fixed, width in compiled_calls if not ahead and width > 1]
        assert drafting
        if mode == "drafts-uncompiled":
            assert not any(fixed for fixed, _ in drafting) and any(w % CONTINUED_STEP for _, w in drafting)
        else:
            assert all(fixed and w % CONTINUED_STEP == 0 for fixed, w in drafting)
    if mode in ("ahead", "compiled", "compiled-alone", "drafts-uncompiled"):
        assert sched.copies_continued > 0
        # Continued drafts verified after the copy had broken (no window), and some landing anyway.
        assert any(e.draft_rows and e.source is None for e in stats)
    else:
        assert sched.copies_continued == 0 and all(e.source is not None for e in stats if e.draft_rows)
    # Streams joined while others ran: their chunks rode in passes, where the passes let them.
    assert (sched.chunks_ridden > 0) == (mode in ("host", "grouped"))
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    assert len(done) == len(texts)
    for rid, ref in refs_by_id.items():
        assert list(done[rid].tokens) == ref, f"stream {rid} differs from mlx-lm"


@pytest.mark.parametrize("ahead", ["cpu", "starts", "no-starts"])
def test_copy_drafts_land_and_match(loaded, reference, chat_prompt, ahead: str) -> None:
    """With the real proposer and allocator, copies are accepted and tokens still equal.

    With an accelerator's passes (here on the CPU) rounds run ahead, with the copies going on and
    starting in them. Without starts (the ``on:start_copies=false`` cell) a copy starts only from
    the allocator, which drops the draft-free round that ran ahead: its positions are overwritten.
    """
    run_ahead_always = ahead != "cpu"
    events: list[Event] = []
    sched = Scheduler(replace(loaded, passes=ACCELERATOR) if run_ahead_always else loaded, events.append)
    sched.start_copies = ahead == "starts"
    reqs = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=64, own_copy_rates=False)
            for t in (prompts.COPY, prompts.CODE)]
    for r in reqs:
        sched.submit(r)
    while sched.busy:
        sched.step()
        for row, s in enumerate(sched.active):
            assert sched.lanes.lengths[row] == len(s.prompt) + len(s.output) - 1
    assert sched.rounds_ahead > 0 or not run_ahead_always
    assert sched.aheads_dropped > 0 or ahead != "no-starts"  # (with starts, as timing prices them)
    assert (sched.copies_continued > 0) == run_ahead_always
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    for r in reqs:
        assert list(done[r.id].tokens) == reference(list(r.prompt_tokens or ()), 64)
    accepted = sum(done[r.id].stats.rows["context"].accepted for r in reqs)
    assert accepted > 10, "a copy-friendly request should copy"
    # Rows accepted past a stop (eos, max tokens) are verified but never emitted.
    copied = [o for r in reqs for o in done[r.id].origins if o == "context"]
    assert 10 < len(copied) <= accepted


@pytest.mark.parametrize("ride", [True, False], ids=["in-the-pass", "apart"])
def test_long_prompt_prefills_chunk_by_chunk(loaded, reference, chat_prompt, ride: bool) -> None:
    """A stream joining with a long prompt is prefilled one chunk a round: in the round's own pass
    where the model has grouped passes (``ride``), else after it. Running streams get a round every
    step either way, and every token equals mlx-lm's."""
    from engine.events import RoundStats

    events: list[Event] = []
    sched = Scheduler(loaded if ride else replace(loaded, passes=GENERIC), events.append)
    running = Request(prompt_tokens=tuple(chat_prompt(prompts.OPEN)), max_tokens=40)
    sched.submit(running)
    sched.step()  # prefill
    joining = Request(prompt_tokens=tuple(chat_prompt(prompts.CODE * 4)), max_tokens=8)
    chunks = -(-(len(joining.prompt_tokens or ()) - 1) // sched.prefill_chunk)
    assert chunks >= 2
    sched.submit(joining)
    rounds_while_joining = 0
    while not any(s.id == joining.id for s in sched.active):
        before = sum(1 for e in events if isinstance(e, RoundStats) and e.request_id == running.id)
        sched.step()
        after = sum(1 for e in events if isinstance(e, RoundStats) and e.request_id == running.id)
        assert after - before == 1  # every step still ran one round for the running stream
        rounds_while_joining += 1
    assert rounds_while_joining == chunks
    ridden = [e.prefill_rows for e in events if isinstance(e, RoundStats) and e.request_id == running.id]
    if ride:
        assert sum(ridden) == len(joining.prompt_tokens or ()) - 1
        assert max(ridden) == sched.prefill_chunk and sched.chunks_ridden == chunks
    else:
        assert not any(ridden) and sched.chunks_ridden == 0
    while sched.busy:
        sched.step()
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    assert list(done[running.id].tokens) == reference(list(running.prompt_tokens or ()), 40)
    assert list(done[joining.id].tokens) == reference(list(joining.prompt_tokens or ()), 8)


def test_a_shared_pass_that_raises_is_undone_and_run_apart(loaded, reference, chat_prompt, monkeypatch) -> None:
    """A fault inside a pass that carries a prompt chunk fails nobody: the pass is undone (the lane
    buffers and the chunk's caches, several layers of which were already written), then the round
    and the chunk run apart in the same step."""
    import engine.passes.grouped as forward_mod
    from engine.events import Failed, RoundStats

    real = forward_mod._chunk_qkv
    calls = {"n": 0}

    def faulty(*args):
        calls["n"] += 1
        if calls["n"] == 6:  # layer 5 of the first pass with a chunk
            raise RuntimeError("injected")
        return real(*args)

    events: list[Event] = []
    sched = Scheduler(loaded, events.append)
    running = Request(prompt_tokens=tuple(chat_prompt(prompts.OPEN)), max_tokens=24)
    sched.submit(running)
    sched.step()
    monkeypatch.setattr(forward_mod, "_chunk_qkv", faulty)
    joining = Request(prompt_tokens=tuple(chat_prompt(prompts.CODE * 4)), max_tokens=8)
    sched.submit(joining)
    sched.step()  # the pass raises in layer 5: undone, then the round and the chunk run apart
    # Six layers of the pass that raised, then every layer of the chunk alone.
    assert calls["n"] == 6 + loaded.n_layers
    assert sched.chunks_ridden == 0 and sched.joining[0].done == sched.prefill_chunk
    assert [e.round for e in events if isinstance(e, RoundStats)] == [1]  # the running stream's round
    while sched.busy:
        sched.step()
    assert not [e for e in events if isinstance(e, Failed)]
    assert sched.chunks_ridden >= 1  # later chunks rode again
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    assert list(done[running.id].tokens) == reference(list(running.prompt_tokens or ()), 24)
    assert list(done[joining.id].tokens) == reference(list(joining.prompt_tokens or ()), 8)


def test_plain_rounds_run_ahead_and_stay_equal(loaded, reference, chat_prompt) -> None:
    """Draft-free rounds start before the previous round's tokens reach the host; streams leaving,
    a cancellation and a stream joining mid-run leave every token equal to mlx-lm's."""
    events: list[Event] = []
    sched = Scheduler(replace(loaded, passes=GENERIC), events.append)  # numpy's passes never run ahead
    lengths = {prompts.OPEN: 40, prompts.FRANCE: 12, prompts.CODE: 30}
    reqs = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=n, drafts=False) for t, n in lengths.items()]
    for r in reqs:
        sched.submit(r)
    doomed = Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=40, drafts=False)
    late = Request(prompt_tokens=tuple(chat_prompt(prompts.TYPOS)), max_tokens=20, drafts=False)
    steps = 0
    while sched.busy:
        sched.step()
        steps += 1
        if steps == 3:
            sched.submit(doomed)
        if steps == 8:
            assert sched.cancel(doomed.id)
        if steps == 10:
            sched.submit(late)
    assert sched.rounds_ahead > 20
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    for r in [*reqs, late]:
        assert list(done[r.id].tokens) == reference(list(r.prompt_tokens or ()), r.max_tokens)
    assert done[doomed.id].reason == "cancelled"
    assert list(done[doomed.id].tokens) == reference(list(doomed.prompt_tokens or ()), 40)[: len(done[doomed.id].tokens)]



def test_each_round_is_priced_at_the_longest_context(loaded, reference, chat_prompt) -> None:
    """The allocator prices rows at the longest context held: where each key makes a row dear,
    a copy-friendly stream gets no rows at all, and its tokens stay equal either way."""
    prompt = tuple(chat_prompt(prompts.COPY))
    granted = {}
    for name, context in (("free", NO_CONTEXT_COST), ("dear", ContextCost(per_stream=0.0, per_row=1e-2))):
        events: list[Event] = []
        sched = Scheduler(loaded, events.append)
        sched.costs.context = context  # at ~100 keys a row costs a second more: no copy pays that
        req = Request(prompt_tokens=prompt, max_tokens=48, own_copy_rates=False)
        sched.submit(req)
        while sched.busy:
            sched.step()
        done = next(e for e in events if isinstance(e, Finished))
        assert list(done.tokens) == reference(list(prompt), 48)
        granted[name] = done.stats.rows["context"].granted
    assert granted["free"] > 10 and granted["dear"] == 0


def test_a_cell_turns_off_continuing_copies_ahead(loaded, reference, chat_prompt) -> None:
    """On an accelerator's passes (here on the CPU) a drafting round's successor runs ahead with the
    copies' continuations; the cell ``on:continue_copies=false`` runs none, the A/B that
    ``scripts/gpu-bench.sh`` measures. Both write mlx-lm's tokens."""
    texts = (prompts.COPY, prompts.CODE)
    items = [WorkItem(str(i), ({"role": "user", "content": t},), 48) for i, t in enumerate(texts)]
    accelerated = replace(loaded, passes=ACCELERATOR)
    runs = {spec: run_lanes(accelerated, items, CostModel(), parse_cell(spec)) for spec in ("on", "on:continue_copies=false")}
    assert runs["on"].copies_continued > 0 and runs["on:continue_copies=false"].copies_continued == 0
    for run in runs.values():
        assert run.tokens == {str(i): reference(chat_prompt(t), 48) for i, t in enumerate(texts)}


def test_a_lone_stream_that_has_copied_probes_in_rounds_run_ahead(loaded, reference, monkeypatch) -> None:
    """On an accelerator's passes (here on the CPU) a lone stream's draft-free rounds all run ahead,
    so a probe of a kind its own rates priced out starts one row in one once the reply has copied
    (engine.rounds.run_ahead); the cell ``on:probe_starts=false`` starts none, and neither does a
    round of two streams (seen by a spy on the real ``priced_starts``) nor a reply that copies
    nothing (alone it would probe three times without that rule). Every reply equals mlx-lm's."""
    probing: list[int] = []  # the batch of each round run ahead that offered a probe start
    real = run_ahead_mod.priced_starts

    def spy(conts, drafts, offers, *args):
        probing.extend(len(conts) for o in offers if o.probe)
        return real(conts, drafts, offers, *args)

    monkeypatch.setattr(run_ahead_mod, "priced_starts", spy)
    accelerated = replace(loaded, passes=ACCELERATOR)
    workloads = Path(__file__).parent.parent / "resources/workloads"
    item = load_workload(workloads / "copy-heavy.jsonl", max_tokens=128)[0]
    uncopied = load_workload(workloads / "no-copy.jsonl", max_tokens=128)[0]
    items = [item, uncopied]
    refs = {it.id: reference(p, 128) for it, p in zip(items, prompts_for(loaded, items), strict=True)}
    runs = {spec: run_lanes(accelerated, [item], CostModel(), parse_cell(spec))
            for spec in ("on", "on:probe_starts=false")}
    assert runs["on"].probes_started > 0 and runs["on:probe_starts=false"].probes_started == 0
    together = run_lanes(accelerated, items, CostModel(), parse_cell("on"))
    alone = run_lanes(accelerated, [uncopied], CostModel(), parse_cell("on"))
    assert probing and set(probing) == {1}, "probes start in rounds of one stream only"
    assert alone.probes_started == 0 and alone.rows["context"]["accepted"] == 0
    for run in (*runs.values(), together, alone):
        assert run.tokens == {k: refs[k] for k in run.tokens} and run.tokens


def test_a_stream_cancelled_while_a_continued_round_is_pending_leaves_the_others_exact(
        loaded, reference, chat_prompt) -> None:
    """A round run ahead after a drafting one holds every stream's row; one stream leaves before it
    is claimed (cancelled, its row moved, the lanes shrunk at most to what that pass wrote): the
    others' replies still equal mlx-lm's, and the cancelled one's is a prefix of its own."""
    events: list[Event] = []
    sched = Scheduler(replace(loaded, passes=ACCELERATOR), events.append)
    reqs = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=64, own_copy_rates=False)
            for t in (prompts.TABLE, prompts.TYPOS)]
    for r in reqs:
        sched.submit(r)
    while sched.busy and not (sched.ahead is not None and sched.ahead.drafts is not None and len(sched.active) >= 2):
        sched.step()
    assert sched.ahead is not None and sched.ahead.drafts is not None, "no round continued copies ahead"
    cancelled = sched.active[0].id
    sched.cancel(cancelled)
    while sched.busy:
        sched.step()
        for row, s in enumerate(sched.active):
            assert sched.lanes.lengths[row] == len(s.prompt) + len(s.output) - 1
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    for r in reqs:
        ref = reference(list(r.prompt_tokens or ()), 64)
        if r.id == cancelled:
            assert done[r.id].reason == "cancelled" and list(done[r.id].tokens) == ref[: len(done[r.id].tokens)]
        else:
            assert list(done[r.id].tokens) == ref
