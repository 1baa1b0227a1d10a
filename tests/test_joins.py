"""Joining streams prefilled together (engine.passes.joined, engine.rounds.joins): how many share a
pass, that a shared pass leaves each stream's caches as mlx-lm's own prefill does, and that a shared
pass that raises costs no stream its reply."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import engine.rounds.joins as joins_mod
from engine.bench.cell_specs import parse_cell
from engine.bench.runner import run_lanes
from engine.bench.workloads import WorkItem
from engine.drafts.cost_model import CostModel
from engine.events import Event, Failed, Finished, Request
from engine.model.cache_kinds import make_caches
from engine.model.loading import LoadedModel
from engine.passes.choice import GENERIC, body_of
from engine.passes.joined import packed, prefill_together
from engine.rounds.scheduler import Scheduler
from tests import prompts


@pytest.mark.parametrize(("chunks", "budget", "chosen"), [
    ([120, 60, 200, 40], 512, [0, 1, 3]),  # the worked example: 4 x 200 = 800 would pass the budget
    ([40, 40, 40], 128, [0, 1, 2]),  # 3 x 40 = 120
    ([40, 40, 40, 40], 128, [0, 1, 2]),
    ([600, 10], 512, [0]),  # the first goes even over the budget, alone
    ([265, 40, 396, 101, 265, 40], 512, [0]),  # 2 x 265 would pass it: the long first goes alone
    ([40, 396, 101, 265, 40, 396, 101], 512, [0, 2, 4, 6]),  # 4 x 101; 5 x 265 would not fit
    ([], 512, []),
    ([10, 10], 1, [0]),  # a budget of 1: each alone
])
def test_packed_takes_the_first_stream_and_the_shortest_that_fit(chunks: list[int], budget: int,
                                                              chosen: list[int]) -> None:
    assert packed(chunks, budget) == chosen


def _prefilled(loaded: LoadedModel, tokens: list[int]) -> list:
    caches = make_caches(list(loaded.kinds))
    GENERIC.prefill(loaded.model, tokens, caches)
    return caches


def test_a_shared_pass_fills_each_stream_as_its_own_prefill_does(loaded: LoadedModel, chat_prompt) -> None:
    """Three prompts of different lengths, one of them with a prefix already held: each stream's keys
    and values after the shared pass are those of prefilling its whole prompt alone, and the caches
    it came with are unchanged (a pass that raised would leave it as it was)."""
    a, b, c = chat_prompt(prompts.FRANCE), chat_prompt(prompts.CODE), chat_prompt(prompts.OPEN)
    held = _prefilled(loaded, b[:20])
    before = [np.array(x.keys) for x in held]
    streams = [(make_caches(list(loaded.kinds)), 0), (held, 20), (make_caches(list(loaded.kinds)), 0)]
    out = prefill_together(body_of(loaded.model), loaded.kinds, streams, [a, b[20:], c])
    assert all(np.array_equal(np.array(x.keys), k) for x, k in zip(held, before, strict=True))
    for caches, whole in zip(out, (a, b, c), strict=True):
        alone = _prefilled(loaded, whole)
        for mine, theirs in zip(caches, alone, strict=True):
            assert mine.offset == theirs.offset == len(whole)
            for x, y in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                got, want = np.array(x[..., : len(whole), :]), np.array(y[..., : len(whole), :])
                assert np.allclose(got, want, atol=2e-4), float(np.abs(got - want).max())


def test_a_shared_pass_that_raises_prefills_the_first_alone(loaded: LoadedModel, chat_prompt, reference,
                                                          monkeypatch) -> None:
    """The shared pass raises (its fault anybody's): the first stream is prefilled alone, the others
    wait their turn, and every reply is mlx-lm's."""
    generic = replace(loaded, passes=GENERIC)  # the CPU's grouped passes prefill one stream at a time

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(joins_mod, "prefill_together", broken)
    events: list[Event] = []
    sched = Scheduler(generic, events.append)
    reqs = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=8) for t in (prompts.FRANCE, prompts.OPEN)]
    for r in reqs:
        sched.submit(r)
    sched.step()
    assert len(sched.active) == 1 and len(sched.joining) == 1 and sched.prefills_joined == 0
    while sched.busy:
        sched.step()
    assert not [e for e in events if isinstance(e, Failed)]
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    for r in reqs:
        assert list(done[r.id].tokens) == reference(list(r.prompt_tokens or ()), 8)


def test_a_stream_holding_a_long_chat_prefills_alone(loaded: LoadedModel, chat_prompt, reference) -> None:
    """A follow-up whose conversation already holds more than a shared pass's positions is not
    copied into one (it prefills alone); the two short chats sent with it share the next step's pass."""
    generic = replace(loaded, passes=GENERIC)
    events: list[Event] = []
    sched = Scheduler(generic, events.append)
    first = chat_prompt(prompts.CODE * 3)
    assert len(first) > sched.prefill_pass
    sched.submit(Request(prompt_tokens=tuple(first), max_tokens=4, conversation="c1"))
    while sched.busy:
        sched.step()
    reply = list(next(e for e in events if isinstance(e, Finished)).tokens)
    follow = [*first, *reply, *chat_prompt(prompts.FRANCE)[1:]]
    reqs = [Request(prompt_tokens=tuple(follow), max_tokens=8, conversation="c1"),
            *(Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=8) for t in (prompts.FRANCE, prompts.OPEN))]
    for r in reqs:
        sched.submit(r)
    sched.step()
    assert [s.id for s in sched.active] == [reqs[0].id] and sched.prefills_joined == 0
    sched.step()
    assert len(sched.active) == 3 and sched.prefills_joined == 1
    while sched.busy:
        sched.step()
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    assert done[reqs[0].id].stats.prefill_reused == len(first) + len(reply) - 1
    for r in reqs:
        assert list(done[r.id].tokens) == reference(list(r.prompt_tokens or ()), 8)


def test_a_cell_sets_how_many_positions_a_shared_pass_takes(loaded: LoadedModel) -> None:
    """``lanes bench`` cells: the default shares a pass between short prompts sent together;
    ``prefill_pass=1`` prefills each alone; both answer alike."""
    items = [WorkItem(str(i), ({"role": "user", "content": t},), 4) for i, t in enumerate((prompts.FRANCE, prompts.OPEN))]
    costs = CostModel()
    shared = run_lanes(loaded, items, costs, parse_cell("plain:generic_pass=true"))
    alone = run_lanes(loaded, items, costs, parse_cell("plain:generic_pass=true:prefill_pass=1"))
    assert (shared.prefills_joined, alone.prefills_joined) == (1, 0)
    assert shared.tokens == alone.tokens
    assert parse_cell("plain:prefill_pass=2048").prefill_pass == 2048 and parse_cell("plain").prefill_pass is None


def test_a_gpu_shares_passes_of_four_chunks_and_the_cpu_of_one(loaded: LoadedModel) -> None:
    """The budget follows the device the model loaded on: a GPU's pass costs its kernel launches
    more than its rows (four chunks' padded positions, 2,048), the CPU's attention pays per padded
    position (one chunk's, 128)."""
    on_cpu = Scheduler(loaded, lambda e: None)
    on_gpu = Scheduler(replace(loaded, device="gpu"), lambda e: None)
    assert (on_cpu.prefill_chunk, on_cpu.prefill_pass) == (128, 128)
    assert (on_gpu.prefill_chunk, on_gpu.prefill_pass) == (512, 2048)
    assert packed([300, 300, 300, 300, 500], on_gpu.prefill_pass) == [0, 1, 2, 3]  # 4 x 300; 5 x 500 would not fit
    assert packed([300, 300], on_cpu.prefill_pass) == [0]
