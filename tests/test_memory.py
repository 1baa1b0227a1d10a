"""Memory limits: the arithmetic on literal data, then the scheduler on the real model of a smaller
machine (a request that does not fit waits and is told why; one that never could is refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import MemoryLimitError
from engine.events import Event, Finished, Request, Tokens, Waiting
from engine.model.memory_limits import (
    MIN_CONVERSATION_CACHE,
    MemoryLimits,
    kv_bytes_per_token,
    limits_for,
    weight_bytes,
)
from engine.rounds.admission import Admission
from engine.rounds.scheduler import Scheduler
from tests import prompts

GIB = 2**30


def test_the_worked_example() -> None:
    limits = limits_for(24 * GIB, GIB // 10, 61_440)
    assert limits.max_streams == 16
    assert round(limits.kv_bytes / GIB, 2) == 10.72
    assert 187_000 < limits.kv_tokens < 188_000
    assert round(limits.conversation_cache_bytes / GIB, 2) == 1.43


def test_a_model_bigger_than_the_machine_leaves_no_room_but_a_small_turn_cache() -> None:
    limits = limits_for(8 * GIB, 16 * GIB, 100_000)
    assert limits.kv_bytes == 0 and limits.kv_tokens == 0
    assert limits.conversation_cache_bytes == MIN_CONVERSATION_CACHE


def test_the_limits_follow_the_machine() -> None:
    small, big = limits_for(8 * GIB, GIB, 1000), limits_for(64 * GIB, GIB, 1000)
    assert big.kv_bytes > 8 * small.kv_bytes and big.conversation_cache_bytes > 8 * small.conversation_cache_bytes


def test_a_budget_replaces_the_machines_share_and_must_hold_the_weights() -> None:
    limits = limits_for(24 * GIB, GIB // 10, 61_440, budget=GIB)  # 1 GiB in all, 0.9 GiB past the weights
    assert limits.kv_bytes == int((GIB - GIB // 10) * 0.75)
    assert limits.conversation_cache_bytes == int((GIB - GIB // 10) * 0.10)
    with pytest.raises(MemoryLimitError, match="weights take 1,024 MiB, more than the memory limit of 512 MiB"):
        limits_for(24 * GIB, GIB, 61_440, budget=GIB // 2)


@pytest.mark.model
def test_streams_together_reserve_their_count_times_the_longest_reply(loaded) -> None:
    """The lanes keep every stream's row as long as the longest one's, in steps of 256 positions:
    streams reaching 300, 300 and 2,000 positions hold 3 x 2,048 of them, not the 2,600 they sum to."""
    def admission(kv_bytes: int) -> Admission:
        return Admission(loaded, MemoryLimits(max_streams=16, kv_bytes=kv_bytes, conversation_cache_bytes=0,
                                              kv_bytes_per_token=1000))

    assert admission(6_144_000).no_room(2000, [300, 300]) is None
    reason = admission(6_143_999).no_room(2000, [300, 300])
    assert reason == ("3 replies as long as the longest (2,000 tokens) would hold 6 MiB of the 6 MiB of KV memory "
                      "SmolLM2-135M-Instruct may use here")
    assert admission(6_143_999).no_room(300, [2000, 300]) is not None  # whichever stream is the long one
    assert admission(1_536_000).no_room(300, [300, 300]) is None  # three of 512
    assert admission(10**9).no_room(10, [10] * 16) == "16 replies are running, the most SmolLM2-135M-Instruct runs at once"
    assert admission(10**9).reserve(290, 10) == 512_000  # a lone reply's lane, 300 positions and the next


def ask(chat_prompt, text: str, max_tokens: int) -> Request:
    return Request(prompt_tokens=tuple(chat_prompt(text)), max_tokens=max_tokens)


@pytest.mark.model
def test_a_request_that_does_not_fit_waits_then_runs_token_equal(loaded, reference, chat_prompt) -> None:
    per_token = kv_bytes_per_token(loaded.model, list(loaded.kinds))
    first, second = ask(chat_prompt, prompts.OPEN, 24), ask(chat_prompt, prompts.FRANCE, 12)
    assert len(first.prompt_tokens or ()) + first.max_tokens < 200 and len(second.prompt_tokens or ()) + second.max_tokens < 200
    # A machine whose KV share holds one reply's lane (256 positions) but not two: room for 384 positions,
    # more than both replies' 400 tokens in all.
    kv_wanted = 384 * per_token
    total = int((kv_wanted / 0.75 + weight_bytes(loaded.model)) / 0.6) + 1
    events: list[Event] = []
    sched = Scheduler(loaded, events.append, limits=limits_for(total, weight_bytes(loaded.model), per_token))
    assert sched.conversations.max_bytes == sched.limits.conversation_cache_bytes
    sched.submit(first)
    sched.submit(second)
    (waiting,) = [e for e in events if isinstance(e, Waiting)]
    assert waiting.request_id == second.id and "KV memory" in waiting.reason and "MiB" in waiting.reason
    while sched.busy:
        sched.step()
    order = [e.request_id for e in events if isinstance(e, Tokens | Finished)]
    assert order.index(second.id) > order.index(first.id) and order[order.index(second.id) - 1] == first.id
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    for r in (first, second):
        assert list(done[r.id].tokens) == reference(list(r.prompt_tokens or ()), r.max_tokens)


@pytest.mark.model
def test_a_reply_that_could_never_fit_is_refused_naming_the_limit(loaded, chat_prompt) -> None:
    per_token = kv_bytes_per_token(loaded.model, list(loaded.kinds))
    total = int((200 * per_token / 0.75 + weight_bytes(loaded.model)) / 0.6)
    sched = Scheduler(loaded, lambda _e: None, limits=limits_for(total, weight_bytes(loaded.model), per_token))
    with pytest.raises(MemoryLimitError, match=r"needs \d+ MiB of KV memory; SmolLM2-135M-Instruct may use .* tokens"):
        sched.submit(ask(chat_prompt, prompts.FRANCE, 400))
    assert not sched.busy


@pytest.mark.model
def test_a_waiting_request_can_be_cancelled_before_it_starts(loaded, chat_prompt) -> None:
    per_token = kv_bytes_per_token(loaded.model, list(loaded.kinds))
    total = int((384 * per_token / 0.75 + weight_bytes(loaded.model)) / 0.6)  # one lane of 256 positions, not two
    events: list[Event] = []
    sched = Scheduler(loaded, events.append, limits=limits_for(total, weight_bytes(loaded.model), per_token))
    first, second = ask(chat_prompt, prompts.FRANCE, 60), ask(chat_prompt, prompts.FRANCE, 60)
    sched.submit(first)
    sched.submit(second)
    assert [e.request_id for e in events if isinstance(e, Waiting)] == [second.id]
    assert sched.cancel(second.id)
    while sched.busy:
        sched.step()
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    assert done[second.id].reason == "cancelled" and not done[second.id].tokens
    assert done[first.id].tokens


HEAP_SCRIPT = """
import gc, sys
import mlx.core as mx
from engine.bench.soak import rss_bytes
from engine.model.loading import load_model
if sys.argv[1] == "loaded":
    load_model()  # the embedded model, as every engine loads one
mx.set_cache_limit(0)  # MLX's own cache of freed buffers apart: only malloc's behaviour is measured
big = mx.zeros((8 << 20) // 4); mx.eval(big); del big  # a large block freed: glibc raises its threshold
bufs, keep = [], []
for i in range(64):
    b = mx.full(((4 << 20) // 4,), float(i)); mx.eval(b); bufs.append(b)  # 4 MiB, like a KV buffer
    k = mx.full((1024,), float(i)); mx.eval(k); keep.append(k)  # small and kept: pins the heap's top
before = rss_bytes()
del bufs; gc.collect()
print((before - rss_bytes()) >> 20)
"""


@pytest.mark.model
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_large_freed_buffers_leave_a_process_that_loaded_a_model() -> None:
    """Loading a model fixes glibc's mmap threshold (``machine.return_freed_buffers``), so 256 MiB
    of freed 4 MiB arrays mostly leave the resident set; with glibc's default they stay (the soak's growth)."""
    returned = {}
    for mode in ("default", "loaded"):
        done = subprocess.run([sys.executable, "-c", HEAP_SCRIPT, mode], capture_output=True, text=True,
                              timeout=120, cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr
        returned[mode] = int(done.stdout.split()[-1])
    assert returned["loaded"] >= 128 and returned["default"] < 64, returned


EVICT_SCRIPT = """
import gc
import mlx.core as mx
from engine.bench.soak import rss_bytes
from engine.model.machine import return_freed_buffers
from engine.model.turn_cache import ConversationCache
return_freed_buffers()
mx.set_cache_limit(0)
cache = ConversationCache(max_bytes=300 << 20)
keep = []
for n in range(300):  # conversations of 512 KiB caches (under the mmap threshold: heap blocks)
    a = mx.full(((512 << 10) // 4,), float(n)); mx.eval(a)
    keep.append(mx.full((256,), float(n)))  # small and kept: pins the heap around them
    mx.eval(keep[-1])
    cache.put(f"c{n}", [1, 2, 3], [a])
    del a
before = rss_bytes()
cache.max_bytes = 10 << 20
cache.put("last", [1], [mx.zeros((4,))])  # evicts all but ~10 MiB
gc.collect()
print((before - rss_bytes()) >> 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_the_turn_cache_gives_evicted_pages_back() -> None:
    """Evicting ~140 MiB of conversations whose buffers sit between kept ones (heap blocks under the
    mmap threshold) leaves the resident set: the cache trims the heap when it evicts."""
    done = subprocess.run([sys.executable, "-c", EVICT_SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 100
