"""Tests for engine.drafts.copy_index: literal cases plus property tests against brute-force references."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.drafts.copy_index import MAX_CANDIDATES, ContextIndex, RecallIndex, Window
from engine.drafts.edits import Applied


def _ctx(tokens: list[int], min_match: int, max_match: int = 32) -> ContextIndex:
    index = ContextIndex(min_match, max_match)
    index.extend(tokens)
    return index


# ---- brute-force references (the spec, written the slow obvious way) ----


def _best(
    candidates: list[tuple[list[int], int]], tail: list[int], min_match: int, max_match: int, max_tokens: int
) -> tuple[tuple[int, ...], int] | None:
    """candidates: (text, gram start), newest first, already filtered to usable ones."""
    best: tuple[tuple[int, ...], int] | None = None
    for text, start in candidates[:MAX_CANDIDATES]:
        end = start + min_match
        n = 0
        while n < min(max_match, end, len(tail)) and text[end - 1 - n] == tail[len(tail) - 1 - n]:
            n += 1
        if n >= min_match and (best is None or n > best[1]):
            best = (tuple(text[end : end + max_tokens]), n)
    return best


def ref_context(tokens: list[int], min_match: int, max_match: int, max_tokens: int) -> Window | None:
    n = len(tokens)
    if max_tokens <= 0 or n < min_match:
        return None
    gram = tokens[n - min_match :]
    starts = [s for s in range(n - min_match - 1, -1, -1) if tokens[s : s + min_match] == gram]
    best = _best([(tokens, s) for s in starts], tokens, min_match, max_match, max_tokens)
    return None if best is None else Window("context", *best)


class RefRecall:
    """Recall spec: grams are logged in the order they complete; newest usable ones are candidates."""

    def __init__(self, min_match: int, max_match: int) -> None:
        self.min_match, self.max_match = min_match, max_match
        self.docs: dict[str, list[int]] = {}
        self.log: list[tuple[str, list[int], int]] = []  # (doc id, that doc's token list, gram start)

    def add(self, doc_id: str, tokens: list[int]) -> None:
        doc = self.docs.setdefault(doc_id, [])
        old = len(doc)
        doc.extend(tokens)
        for s in range(max(0, old - self.min_match + 1), len(doc) - self.min_match + 1):
            self.log.append((doc_id, doc, s))

    def remove(self, doc_id: str) -> None:
        self.docs.pop(doc_id, None)
        self.log = [entry for entry in self.log if entry[0] != doc_id]

    def propose(self, tail: list[int], max_tokens: int, exclude: str | None) -> Window | None:
        m = self.min_match
        if max_tokens <= 0 or len(tail) < m:
            return None
        tail = tail[-self.max_match :]
        gram = tail[-m:]
        cands = [
            (doc, s)
            for doc_id, doc, s in reversed(self.log)
            if doc_id != exclude and s + m < len(doc) and doc[s : s + m] == gram
        ]
        best = _best(cands, tail, m, self.max_match, max_tokens)
        return None if best is None else Window("recall", *best)


# ---- ContextIndex ----


def test_worked_example() -> None:
    index = _ctx([5, 6, 7, 8, 9, 5, 6, 7], min_match=3)
    assert len(index) == 8
    assert index.propose(8) == Window(source="context", tokens=(8, 9, 5, 6, 7), match_len=3)
    assert index.propose(2) == Window("context", (8, 9), 3)


def test_min_match_respected() -> None:
    assert _ctx([1, 2, 3, 9, 2, 3], min_match=3).propose(4) is None  # only "2 3" repeats
    assert _ctx([1, 2, 3, 9, 2, 3], min_match=2).propose(4) == Window("context", (9, 2, 3), 2)
    assert _ctx([1, 2], min_match=2).propose(4) is None  # the tail is not an earlier occurrence


def test_no_window_for_nonpositive_max_tokens() -> None:
    index = _ctx([5, 6, 7, 8, 9, 5, 6, 7], min_match=3)
    assert index.propose(0) is None
    assert index.propose(-1) is None


def test_longest_match_beats_more_recent_shorter() -> None:
    # "2 3" occurs at 2 (after "9 1", like the tail) and at 6 (after 8): the older one matches 4.
    index = _ctx([9, 1, 2, 3, 4, 8, 2, 3, 5, 9, 1, 2, 3], min_match=2)
    assert index.propose(3) == Window("context", (4, 8, 2), 4)


def test_ties_go_to_most_recent() -> None:
    index = _ctx([1, 2, 7, 1, 2, 8, 1, 2], min_match=2)
    assert index.propose(1) == Window("context", (8,), 2)
    assert index.propose(10) == Window("context", (8, 1, 2), 2)


def test_max_tokens_truncates() -> None:
    index = _ctx([1, 2, 3, 4, 5, 6, 7, 0, 1, 2], min_match=2)
    assert index.propose(3) == Window("context", (3, 4, 5), 2)
    assert index.propose(100) == Window("context", (3, 4, 5, 6, 7, 0, 1, 2), 2)


def test_max_match_caps_match_len() -> None:
    tokens = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert _ctx(tokens, min_match=2).propose(1) == Window("context", (1,), 5)
    assert _ctx(tokens, min_match=2, max_match=3).propose(1) == Window("context", (1,), 3)


def test_continuation_runs_into_tail() -> None:
    # The copy of "1 2" (at 1) continues with the tail itself: a loop repeating.
    assert _ctx([3, 1, 2, 1, 2], min_match=2).propose(5) == Window("context", (1, 2), 2)
    # Overlapping occurrences: the match extends through the repeats and the copy reaches the end.
    assert _ctx([1, 2, 1, 2, 1, 2], min_match=2).propose(5) == Window("context", (1, 2), 4)
    assert _ctx([7, 7, 7, 7], min_match=1, max_match=8).propose(5) == Window("context", (7,), 3)


def test_incremental_extend_equals_one_go() -> None:
    tokens = [5, 6, 7, 8, 9, 5, 6, 7, 8, 1, 5, 6]
    built = ContextIndex(2)
    for tok in tokens:
        built.extend([tok])
    assert built.propose(4) == _ctx(tokens, 2).propose(4) == Window("context", (7, 8, 1, 5), 2)


def test_bad_lengths_rejected() -> None:
    with pytest.raises(ValueError):
        ContextIndex(0)
    with pytest.raises(ValueError):
        ContextIndex(4, max_match=3)
    with pytest.raises(ValueError):
        RecallIndex(2, max_tokens_total=0)


def test_candidate_bound_only_checks_recent_occurrences() -> None:
    # The 4-token match "5 9 1 2" sits behind newer 2-token matches "8 1 2": with fewer than
    # MAX_CANDIDATES of them it wins, with MAX_CANDIDATES of them it is never looked at.
    def tokens(fillers: int) -> list[int]:
        filler = [x for i in range(fillers) for x in (8, 1, 2, 100 + i)]
        return [5, 9, 1, 2, 50, *filler, 5, 9, 1, 2]

    assert _ctx(tokens(MAX_CANDIDATES - 1), 2).propose(1) == Window("context", (50,), 4)
    assert _ctx(tokens(MAX_CANDIDATES), 2).propose(1) == Window("context", (100 + MAX_CANDIDATES - 1,), 2)
    for fillers in (MAX_CANDIDATES - 1, MAX_CANDIDATES):
        assert _ctx(tokens(fillers), 2).propose(1) == ref_context(tokens(fillers), 2, 32, 1)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2), max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=8),
    min_match=st.integers(1, 4),
    extra=st.integers(0, 5),
    max_tokens=st.integers(0, 6),
)
def test_context_matches_reference(
    tokens: list[int], cuts: list[int], min_match: int, extra: int, max_tokens: int
) -> None:
    max_match = min_match + extra
    bounds = sorted({0, len(tokens), *(c for c in cuts if c <= len(tokens))})
    incremental = ContextIndex(min_match, max_match)
    for lo, hi in pairwise(bounds):
        incremental.extend(tokens[lo:hi])
        assert len(incremental) == hi
        assert incremental.propose(max_tokens) == ref_context(tokens[:hi], min_match, max_match, max_tokens)
    one_go = _ctx(tokens, min_match, max_match)
    assert one_go.propose(max_tokens) == incremental.propose(max_tokens)


# ---- RecallIndex ----


def test_recall_exclude() -> None:
    index = RecallIndex(2)
    index.add("a", [1, 2, 3, 4])
    index.add("b", [1, 2, 3, 5])
    assert index.propose([0, 1, 2, 3], 4) == Window("recall", (5,), 3)  # tie: newest doc
    assert index.propose([0, 1, 2, 3], 4, exclude="b") == Window("recall", (4,), 3)
    assert index.propose([0, 1, 2, 3], 4, exclude="a") == Window("recall", (5,), 3)


def test_recall_never_crosses_doc_end() -> None:
    index = RecallIndex(2)
    index.add("a", [1, 2, 3, 4])
    index.add("b", [9, 9, 9])
    assert index.propose([2, 3], 10) == Window("recall", (4,), 2)
    assert index.propose([3, 4], 10) is None  # "3 4" ends doc a; nothing follows it
    assert index.propose([4, 9], 10) is None  # docs are not joined


def test_recall_append_joins_pieces() -> None:
    index = RecallIndex(2)
    index.add("a", [1, 2])
    index.add("a", [3, 4])
    assert len(index) == 4
    assert index.propose([1, 2], 10) == Window("recall", (3, 4), 2)
    assert index.propose([7, 2, 3], 10) == Window("recall", (4,), 2)


def test_recall_min_match_and_max_tokens() -> None:
    index = RecallIndex(3, max_match=4)
    index.add("a", [1, 2, 3, 4, 5, 6, 7])
    assert index.propose([2, 3], 5) is None  # shorter than min_match
    assert index.propose([9, 2, 3], 5) is None
    assert index.propose([1, 2, 3], 2) == Window("recall", (4, 5), 3)
    assert index.propose([1, 2, 3, 4, 5], 0) is None
    assert index.propose([0, 1, 2, 3, 4, 5], 1) == Window("recall", (6,), 4)  # max_match caps it


def test_recall_longest_beats_newest() -> None:
    index = RecallIndex(2)
    index.add("old", [7, 1, 2, 3, 10])
    index.add("new", [8, 2, 3, 11])
    assert index.propose([7, 1, 2, 3], 2) == Window("recall", (10,), 4)
    assert index.propose([5, 2, 3], 2) == Window("recall", (11,), 2)


def test_recall_remove() -> None:
    index = RecallIndex(2)
    index.add("a", [1, 2, 3, 4])
    index.add("b", [1, 2, 3, 5])
    index.remove("b")
    index.remove("missing")  # ignored
    assert index.doc_ids() == ["a"]
    assert len(index) == 4
    assert index.propose([1, 2, 3], 4) == Window("recall", (4,), 3)
    index.remove("a")
    assert index.propose([1, 2, 3], 4) is None
    assert len(index) == 0
    index.add("a", [1, 2, 6])  # a fresh document under the old id
    assert index.propose([1, 2], 4) == Window("recall", (6,), 2)


def test_recall_eviction_drops_oldest() -> None:
    index = RecallIndex(2, max_tokens_total=10)
    index.add("a", [1, 2, 3, 4])
    index.add("b", [5, 6, 7, 8])
    index.add("a", [9])  # appending makes "a" the newest
    assert index.doc_ids() == ["b", "a"]
    index.add("c", [10, 11, 12])  # 12 tokens > 10: "b" goes
    assert index.doc_ids() == ["a", "c"]
    assert len(index) == 8
    assert index.propose([5, 6], 4) is None
    assert index.propose([1, 2], 4) == Window("recall", (3, 4, 9), 2)


def test_recall_oversized_doc_keeps_its_end() -> None:
    index = RecallIndex(2, max_tokens_total=4)
    index.add("a", [1, 2])
    index.add("b", [1, 2, 3, 4, 5, 6])
    assert index.doc_ids() == ["b"]
    assert len(index) == 4
    assert index.propose([1, 2], 4) is None
    assert index.propose([3, 4], 4) == Window("recall", (5, 6), 2)


def test_recall_compaction_keeps_answers() -> None:
    index = RecallIndex(2)
    ref = RefRecall(2, 32)
    for i in range(50):
        for target in (index, ref):
            target.add(f"d{i}", [1, 2, i % 7, 3, 1, 2, 100 + i])
            if i % 3:
                target.remove(f"d{i - 1}")
    for tail in ([1, 2], [3, 1, 2], [2, 4, 3, 1, 2], [1, 2, 6]):
        assert index.propose(tail, 3) == ref.propose(tail, 3, None)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("abc"), st.lists(st.integers(0, 2), max_size=12)),
        st.tuples(st.just("remove"), st.sampled_from("abc"), st.just([])),
        st.tuples(
            st.just("propose"), st.sampled_from([None, "a", "b"]), st.lists(st.integers(0, 2), max_size=8)
        ),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops=_ops, min_match=st.integers(1, 3), extra=st.integers(0, 4), max_tokens=st.integers(0, 5))
def test_recall_matches_reference(
    ops: list[tuple[str, str | None, list[int]]], min_match: int, extra: int, max_tokens: int
) -> None:
    max_match = min_match + extra
    index = RecallIndex(min_match, max_match)
    ref = RefRecall(min_match, max_match)
    for op, key, tokens in ops:
        if op == "add":
            assert key is not None
            index.add(key, tokens)
            ref.add(key, tokens)
        elif op == "remove":
            assert key is not None
            index.remove(key)
            ref.remove(key)
        else:
            assert index.propose(tokens, max_tokens, exclude=key) == ref.propose(tokens, max_tokens, key)
        assert len(index) == sum(len(d) for d in ref.docs.values())
        assert sorted(index.doc_ids()) == sorted(ref.docs)


def test_context_windows_know_where_they_start() -> None:
    idx = ContextIndex(min_match=3)
    idx.extend([5, 6, 7, 8, 9, 5, 6, 7])
    w = idx.propose(10)
    assert w is not None and w.start == 3


def test_resync_worked_example() -> None:
    idx = ContextIndex(min_match=3)
    idx.extend([10, 11, 12, 13, 14, 15, 90, 12, 13])
    w = idx.resync(anchor=2, max_tokens=3)
    assert w == Window("context", (14, 15, 90), 2) and w.start == 4


def test_resync_after_a_renamed_token() -> None:
    # Source "a cnt = 0 ;" copied as "a count = ..." : after the model's "count" and " =",
    # the one-token match " =" right after the anchor resumes the copy.
    a, cnt, count, eq, zero, semi = 1, 2, 3, 4, 5, 6
    idx = ContextIndex(min_match=4)
    idx.extend([a, cnt, eq, zero, semi, 99, a, count, eq])
    assert idx.propose(5) is None  # the suffix match is too short
    w = idx.resync(anchor=1, max_tokens=2)
    assert w is not None and w.tokens == (zero, semi) and w.match_len == 1


def test_resync_windows_keep_their_own_copy_history() -> None:
    idx = ContextIndex(min_match=2)
    idx.extend([1, 2, 3, 4, 9, 1, 2])
    matched = idx.propose(5)
    assert matched is not None and not matched.resync and matched.rate_key == "context.short"  # 2 tokens
    synced = idx.resync(anchor=2, max_tokens=2)
    assert synced is not None and synced.resync and synced.source == "context"
    assert synced.rate_key == "resync"  # priced and recorded apart; its tokens still count as context


def test_resync_prefers_two_token_matches_and_the_nearest() -> None:
    idx = ContextIndex(min_match=4)
    #        0  1  2  3  4  5  6  7  8  9 10
    idx.extend([7, 1, 8, 1, 2, 9, 1, 2, 3, 0, 1])
    # Trailing "1": nearest to anchor 6 among ends {2, 4, 7} is 7.
    assert idx.resync(anchor=6, max_tokens=1).start == 7
    idx.extend([2])
    # Trailing "1 2": ends 5 and 8 match two tokens; 5 is nearer to anchor 4.
    w = idx.resync(anchor=4, max_tokens=2)
    assert w is not None and w.match_len == 2 and w.start == 5 and w.tokens == (9, 1)


def test_resync_stays_near_the_anchor() -> None:
    idx = ContextIndex(min_match=4)
    idx.extend([3, 4] + [0] * 60 + [3])
    assert idx.resync(anchor=50, max_tokens=3) is None


def test_may_propose_next_on_literal_tokens() -> None:
    idx = ContextIndex(min_match=3)
    idx.extend([1, 2, 3, 4, 5, 6, 7])
    assert not idx.may_propose_next()  # "6 7" begins no gram: no next token can make a match
    idx.extend([1, 2])
    assert idx.may_propose_next()  # "1 2" begins "1 2 3": a 3 next would match
    idx.extend([3])
    assert idx.propose(4) is not None


@settings(deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 4))
def test_may_propose_next_false_means_no_token_can_match(tokens: list[int], m: int) -> None:
    idx = ContextIndex(min_match=m)
    idx.extend(tokens)
    if idx.may_propose_next():
        return
    for x in range(5):
        probe = ContextIndex(min_match=m)
        probe.extend([*tokens, x])
        assert probe.propose(8) is None, (tokens, x)


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=3),
       st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(1, 4))
def test_recall_may_propose_after_false_means_no_token_can_match(
    docs: list[list[int]], tail: list[int], m: int
) -> None:
    idx = RecallIndex(min_match=m)
    for i, d in enumerate(docs):
        idx.add(f"d{i}", d)
    if idx.may_propose_after(tail):
        return
    for x in range(4):
        assert idx.propose([*tail, x], 8) is None, (docs, tail, x)


def test_recall_may_propose_after_on_literal_tokens() -> None:
    idx = RecallIndex(min_match=3)
    idx.add("a", [5, 6, 7, 8])
    assert idx.may_propose_after([1, 5, 6])  # "5 6" begins "5 6 7"
    assert not idx.may_propose_after([1, 6, 8])


def test_long_matches_short_matches_and_edited_copies_have_their_own_first_row_histories() -> None:
    text = list(range(100, 120))
    idx = ContextIndex(min_match=4)
    idx.extend([*text, 7, *text[:9]])
    long = idx.propose(5)
    assert long is not None and long.match_len == 9 and long.rate_key == "context.first"
    idx = ContextIndex(min_match=4)
    idx.extend([*text, 7, *text[:8]])
    short = idx.propose(5)
    assert short is not None and short.match_len == 8 and short.rate_key == "context.short"
    edited = replace(short, applied=(Applied(0, (1,), 1),))
    assert edited.rate_key == "context.first"  # it replays edits the reply was seen making


def test_an_unambiguous_propose_refuses_a_match_that_another_occurrence_ties() -> None:
    idx = ContextIndex(min_match=2, max_match=3)
    idx.extend([5, 6, 7, 1, 5, 6, 8, 2, 5, 6])
    # "5 6" occurs twice before the tail: the newest wins a plain propose, none an unambiguous one.
    assert idx.propose(3) == Window("context", (8, 2, 5), 2)
    assert idx.propose(3, unambiguous=True) is None
    idx.extend([8])  # "5 6 8" matches three tokens at one place only
    assert idx.propose(2, unambiguous=True) == Window("context", (2, 5), 3)
