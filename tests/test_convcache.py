"""Conversation KV caches: prefix reuse, take/put, least-recently-used eviction by bytes."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine.model.turn_cache import ConversationCache, common_prefix


def caches(n_tokens: int, layers: int = 2) -> list[KVCache]:
    out = []
    for _ in range(layers):
        c = KVCache()
        c.update_and_fetch(mx.zeros((1, 1, n_tokens, 4)), mx.zeros((1, 1, n_tokens, 4)))
        out.append(c)
    return out


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_take_trims_to_the_shared_prefix_and_leaves_one_token_to_feed() -> None:
    cc = ConversationCache()
    cc.put("c", [1, 2, 3, 4, 5], caches(5))
    taken = cc.take("c", [1, 2, 3, 9, 9])
    assert taken is not None
    got, reused = taken
    assert reused == 3 and all(c.offset == 3 for c in got)
    assert cc.take("c", [1, 2, 3]) is None  # taken caches are gone until put back
    cc.put("c", [1, 2, 3], caches(3))
    _, reused = cc.take("c", [1, 2, 3])  # the same prompt again: its last token is fed anew
    assert reused == 2


def test_no_shared_prefix_means_no_reuse() -> None:
    cc = ConversationCache()
    cc.put("c", [1, 2, 3], caches(3))
    assert cc.take("c", [7, 8, 9]) is None


def test_least_recently_used_is_evicted_by_bytes() -> None:
    one = sum(c.nbytes for c in caches(256))
    cc = ConversationCache(max_bytes=int(one * 2.5))
    cc.put("a", list(range(256)), caches(256))
    cc.put("b", list(range(256)), caches(256))
    cc.put("c", list(range(256)), caches(256))
    assert len(cc) == 2 and cc.take("a", list(range(10))) is None
    assert cc.nbytes <= cc.max_bytes
    cc.put("huge", list(range(256)), caches(256 * 4))  # bigger than the whole budget: not kept
    assert cc.take("huge", list(range(10))) is None


def test_take_longest_finds_the_request_whose_tokens_a_prompt_extends() -> None:
    """The module's worked example: a prompt reusing most of an entry takes it, one sharing a little
    gets a copy and leaves the entry for the client whose history it is."""
    from engine.model.turn_cache import PREFIX

    cc = ConversationCache()
    cc.put(PREFIX + "r1", [1, 2, 3, 4], caches(4))
    cc.put(PREFIX + "r2", [5, 6], caches(2))
    cc.put("conversation-7", [1, 2, 3, 4, 5], caches(5))  # the window's, found by its id only
    short = cc.take_longest([1, 7])
    assert short is not None and short[1] == 1 and all(c.offset == 1 for c in short[0])
    assert len(cc) == 3
    got, reused = cc.take_longest([1, 2, 3, 9])
    assert reused == 3 and all(c.offset == 3 for c in got)
    assert len(cc) == 2  # r1 was taken
    assert cc.take_longest([1, 2, 3, 9]) is None  # only the conversation's entry shares that prefix now
    assert cc.take_longest([8, 9]) is None
