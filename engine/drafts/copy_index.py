"""Indexes that propose copy windows (drafts) for copy-speculative decoding.

Vocabulary:

- A *stream* is one reply being generated; its tokens are prompt + output so
  far (ints).
- A *copy window* is a draft: the tokens that followed an earlier occurrence of
  the stream's trailing tokens, copied in the hope that the text repeats.
- Sources: ``"context"`` is the stream's own prompt + output
  (``ContextIndex``); ``"recall"`` is text outside the stream: other
  conversations' messages and finished replies, fed in by the caller as
  documents (``RecallIndex``).

Worked example, ``min_match=3``: the stream holds ``[5, 6, 7, 8, 9, 5, 6, 7]``.
Its trailing 3-gram ``(5, 6, 7)`` also occurs at positions 0..2 and ends there
before the current end; extending the match backwards stops at the start of the
text, so ``match_len`` is 3. What followed it is ``8, 9`` and then the tail
itself, so ``propose(8)`` returns
``Window(source="context", tokens=(8, 9, 5, 6, 7), match_len=3)``: the copy
stops at the end of the indexed text, and ``propose(2)`` gives ``(8, 9)``.

How it works: every position where a ``min_match``-gram starts is linked into a
hash chain (as in zlib's LZ77 matcher): ``head[hash(gram)]`` is the newest
position with that gram and ``prev[pos]`` the one before it, both compact
``array('i')`` / int maps, so indexing is O(min_match) per token and never
rescans history. ``propose`` hashes the stream's trailing gram, walks the chain
newest first and, for each candidate, extends the match backwards up to
``max_match`` tokens; the longest wins, ties going to the newest.

Bound: at most ``MAX_CANDIDATES`` (16) usable candidates are extended per
``propose`` (older occurrences of a very common gram are not looked at), and a
``RecallIndex`` walks at most ``MAX_CHAIN_STEPS`` (256) chain links, counting
the ones it skips (removed documents, the excluded document, occurrences at a
document's end). So ``propose`` costs O(16 * max_match) whatever the index size.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.drafts.copy_rates import SHORT_MATCH, first_key
from engine.drafts.edits import Applied

MAX_CANDIDATES = 16  # usable candidates extended per propose; keeps it well under 1 ms
MAX_CHAIN_STEPS = 256  # chain links walked per recall propose, skipped ones included


@dataclass(frozen=True, slots=True)
class Window:
    """A copy window: a draft copied from earlier text."""

    source: str  # "context" or "recall"
    tokens: tuple[int, ...]  # the copied continuation (the draft), len >= 1
    match_len: int  # how many trailing tokens of the stream matched the earlier occurrence
    start: int = field(default=-1, compare=False)  # context windows: index of the first copied token in the stream's tokens
    resync: bool = field(default=False, compare=False)  # found by ContextIndex.resync (a 1-2 token match)
    brief: bool = field(default=False, compare=False)  # found by a match under the source's min_match (engine.rounds.stream)
    # Drafts with learned edits applied (engine.drafts.edits): where each token's source text starts (one
    # more entry: after the last), where the edits sit, and the edit a resync would confirm.
    sources: tuple[int, ...] = field(default=(), compare=False)
    applied: tuple[Applied, ...] = field(default=(), compare=False)
    learn: tuple[tuple[int, ...], tuple[int, ...]] | None = field(default=None, compare=False)

    @property
    def rate_key(self) -> str:
        """The copy history that decides whether this window starts: its first rows' (``first_key``):
        a resync's, a brief match's or a short match's (at most ``SHORT_MATCH`` tokens), unless it
        carries learned edits, else its source's (engine.drafts.copy_rates, "Doubtful first rows").

        A resync window's first row (does the copy resume after an edit?) lands often in edited
        copies and seldom in free-form text (3 times in 4 it failed there, in an ad hoc count on the
        mixed and no-copy workloads), so resyncs have a first-row history of their own.
        """
        if self.applied:  # a copy carrying learned edits: the reply has been seen making them
            return first_key(self.source)
        return first_key(self.source, self.resync, short=self.match_len <= SHORT_MATCH, brief=self.brief)

    def source_at(self, i: int) -> int:
        """Where the source text behind draft token ``i`` starts (``i == len(tokens)``: after the last)."""
        return self.sources[i] if self.sources else self.start + i

    def rewind(self, accepted: int) -> int:
        """Draft tokens that count as copied: a copy that stopped inside an edit counts up to its start."""
        for a in self.applied:
            if a.at < accepted < a.at + a.length:
                return a.at
        return accepted


def _check_lengths(min_match: int, max_match: int) -> None:
    if min_match < 1:
        raise ValueError(f"min_match must be >= 1, got {min_match}")
    if max_match < min_match:
        raise ValueError(f"max_match ({max_match}) must be >= min_match ({min_match})")


def _match_len(text: Sequence[int], end: int, tail: Sequence[int], tail_end: int, limit: int) -> int:
    """How many tokens before ``text[end]`` equal those before ``tail[tail_end]``, up to ``limit``."""
    n = 0
    while n < limit and text[end - 1 - n] == tail[tail_end - 1 - n]:
        n += 1
    return n


class ContextIndex:
    """Incremental index over one stream's own tokens (prompt + output)."""

    source = "context"

    def __init__(self, min_match: int, max_match: int = 32) -> None:
        _check_lengths(min_match, max_match)
        self.min_match = min_match
        self.max_match = max_match
        self._tokens = array("i")
        self._prev = array("i")  # prev[s]: previous start with the same gram hash, or -1
        self._head: dict[int, int] = {}  # gram hash -> newest start
        self._prefixes: set[int] = set()  # hashes of every indexed gram's first min_match - 1 tokens

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> Sequence[int]:
        """The indexed tokens (read only)."""
        return self._tokens

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens and index the grams they complete (amortised O(len(tokens)))."""
        toks = self._tokens
        toks.extend(tokens)
        m = self.min_match
        head, prev = self._head, self._prev
        # len(prev) is the next gram start to index; grams straddling the old end complete now.
        for s in range(len(prev), len(toks) - m + 1):
            h = hash(tuple(toks[s : s + m]))
            prev.append(head.get(h, -1))
            head[h] = s
            self._prefixes.add(hash(tuple(toks[s : s + m - 1])))

    def may_propose_next(self) -> bool:
        """False only when, whatever token comes next, ``propose`` will then find no match.

        A match after one more token x needs an earlier gram equal to the last ``min_match - 1``
        tokens followed by x, i.e. an indexed gram with that prefix. Hash collisions can only say
        True wrongly, never False, so False is certain (the scheduler runs ahead on it).
        """
        toks, m = self._tokens, self.min_match
        return len(toks) >= m and hash(tuple(toks[len(toks) - m + 1 :])) in self._prefixes

    def propose(self, max_tokens: int, unambiguous: bool = False) -> Window | None:
        """The continuation of the longest earlier occurrence of the trailing tokens, or None.

        The occurrence must end before the current end, but its continuation may
        run into the tail (that is how loops copy); it stops at the end of the text.
        With ``unambiguous``, None when another of the candidates matches as long: a
        two-token match that occurs more than once is chance (" of the"), one that
        occurs once is mostly a name or an identifier.
        """
        toks = self._tokens
        n = len(toks)
        m = self.min_match
        if max_tokens <= 0 or n <= m:
            return None
        s = self._head.get(hash(tuple(toks[n - m : n])), -1)
        if s == n - m:  # the tail's own gram is the newest entry; it has no continuation
            s = self._prev[s]
        prev = self._prev
        best_len, best_end, tied = 0, -1, False
        checked = 0
        while s >= 0 and checked < MAX_CANDIDATES:
            checked += 1
            end = s + m
            # end < n, so limit <= end keeps the comparison inside the text.
            got = _match_len(toks, end, toks, n, min(self.max_match, end))
            if got > best_len:
                best_len, best_end, tied = got, end, False
                if got == self.max_match and not unambiguous:  # nothing older can beat it (ties go to the newest)
                    break
            elif got == best_len:
                tied = True
            s = prev[s]
        if best_len < m or (unambiguous and tied):
            return None
        return Window(self.source, tuple(toks[best_end : min(best_end + max_tokens, n)]), best_len, best_end)

    def resync(self, anchor: int, max_tokens: int, back: int = 4, ahead: int = 24) -> Window | None:
        """After a copy broke at ``anchor``, find where the source picks up again.

        An edit (a renamed word, a fixed typo) breaks a copy for a token or two, and
        the suffix match then needs ``min_match`` fresh tokens before it finds the source
        again. Instead look for the last one or two tokens just around ``anchor`` and
        copy what follows: 2-token matches first, then 1, the nearest to ``anchor`` first.

        Worked example: tokens ``[10, 11, 12, 13, 14, 15, 90, 12, 13]``, where a copy of
        ``10 11 12 ...`` broke at index 2 and the reply has since written ``12 13``:
        ``resync(anchor=2, max_tokens=3)`` finds ``12 13`` at indexes 2..3 and proposes
        ``(14, 15, 90)`` starting at index 4.
        """
        toks = self._tokens
        n = len(toks)
        if max_tokens <= 0 or anchor < 0 or n < 2:
            return None
        lo, hi = max(1, anchor - back), min(n - 2, anchor + ahead)  # an end below n - 1 is earlier text
        for k in (2, 1):
            tail = toks[n - k : n]
            best = -1
            for end in range(lo, hi + 1):
                if end >= k and toks[end - k : end] == tail and (best < 0 or abs(end - anchor) < abs(best - anchor)):
                    best = end
            if best >= 0:
                return Window(self.source, tuple(toks[best : min(best + max_tokens, n)]), k, best, resync=True)
        return None


class _Doc:
    __slots__ = ("doc_id", "serial", "tokens")

    def __init__(self, doc_id: str, serial: int) -> None:
        self.doc_id = doc_id
        self.serial = serial  # never reused, so chain entries of a removed document stay dead
        self.tokens = array("i")


class RecallIndex:
    """Incremental index over documents outside any one stream (other conversations, finished replies).

    All documents share one hash chain over "entries" (doc serial, gram start),
    appended in the order the grams were added, so newer means added later.
    ``remove`` only marks a document dead; when dead entries outnumber live
    ones the chain is rebuilt from the live ones (amortised O(1) per entry).

    Eviction: when the total tokens exceed ``max_tokens_total`` the documents
    least recently added to (``add`` counts appending) are removed, oldest first.
    A single document longer than the cap keeps only its last
    ``max_tokens_total`` tokens.
    """

    source = "recall"

    def __init__(self, min_match: int, max_match: int = 32, max_tokens_total: int = 2_000_000) -> None:
        _check_lengths(min_match, max_match)
        if max_tokens_total < 1:
            raise ValueError(f"max_tokens_total must be >= 1, got {max_tokens_total}")
        self.min_match = min_match
        self.max_match = max_match
        self.max_tokens_total = max_tokens_total
        self._docs: OrderedDict[str, _Doc] = OrderedDict()  # least recently added-to first
        self._by_serial: dict[int, _Doc] = {}
        self._next_serial = 0
        self._total = 0  # live tokens
        self._dead = 0  # chain entries belonging to removed documents
        self._reset_chain()

    def _reset_chain(self) -> None:
        self._entry_doc = array("i")  # entry -> doc serial
        self._entry_start = array("i")  # entry -> gram start in that document
        self._prev = array("i")  # entry -> previous entry with the same gram hash, or -1
        self._head: dict[int, int] = {}  # gram hash -> newest entry
        # Hashes of every linked gram's first min_match - 1 tokens; removed documents' stay until the
        # next compaction, which only makes may_propose_after say True more often.
        self._prefixes: set[int] = set()

    def _link(self, doc: _Doc, start: int) -> None:
        h = hash(tuple(doc.tokens[start : start + self.min_match]))
        self._prefixes.add(hash(tuple(doc.tokens[start : start + self.min_match - 1])))
        self._entry_doc.append(doc.serial)
        self._entry_start.append(start)
        self._prev.append(self._head.get(h, -1))
        self._head[h] = len(self._prev) - 1

    def __len__(self) -> int:
        return self._total

    def doc_ids(self) -> list[str]:
        """Document ids, least recently added-to first (the eviction order)."""
        return list(self._docs)

    def add(self, doc_id: str, tokens: Sequence[int]) -> None:
        """Add a document, or append to it; copies never cross a document's end."""
        doc = self._docs.get(doc_id)
        if doc is None:
            doc = _Doc(doc_id, self._next_serial)
            self._next_serial += 1
            self._docs[doc_id] = doc
            self._by_serial[doc.serial] = doc
        else:
            self._docs.move_to_end(doc_id)
        old = len(doc.tokens)
        doc.tokens.extend(tokens)
        self._total += len(doc.tokens) - old
        m = self.min_match
        # Grams straddling the old end complete now, so appending joins the pieces.
        for s in range(max(0, old - m + 1), len(doc.tokens) - m + 1):
            self._link(doc, s)
        if len(doc.tokens) > self.max_tokens_total:
            keep = doc.tokens[len(doc.tokens) - self.max_tokens_total :]
            self.remove(doc_id)
            self.add(doc_id, keep)
            return
        while self._total > self.max_tokens_total:
            self.remove(next(iter(self._docs)))  # never `doc`: it is newest and fits alone

    def remove(self, doc_id: str) -> None:
        """Forget a document (a conversation that opts out or is deleted); unknown ids are ignored."""
        doc = self._docs.pop(doc_id, None)
        if doc is None:
            return
        del self._by_serial[doc.serial]
        self._total -= len(doc.tokens)
        self._dead += max(0, len(doc.tokens) - self.min_match + 1)
        if self._dead * 2 > len(self._prev):
            self._compact()

    def _compact(self) -> None:
        """Rebuild the chain from live entries, keeping their order (and so the recency ties)."""
        docs, starts = self._entry_doc, self._entry_start
        self._reset_chain()
        for serial, start in zip(docs, starts):
            doc = self._by_serial.get(serial)
            if doc is not None:
                self._link(doc, start)
        self._dead = 0

    def may_propose_after(self, tail: Sequence[int]) -> bool:
        """False only when ``propose`` can find no match once one more token follows ``tail``.

        Same reasoning as ``ContextIndex.may_propose_next``: the last ``min_match - 1`` tokens must
        begin some linked gram.
        """
        m = self.min_match
        return len(tail) >= m - 1 and hash(tuple(tail[len(tail) - m + 1 :])) in self._prefixes

    def propose(self, tail: Sequence[int], max_tokens: int, exclude: str | None = None) -> Window | None:
        """The continuation of the longest occurrence of ``tail``'s trailing tokens in any document but ``exclude``.

        Only the last ``max_match`` tokens of ``tail`` matter. The copy stops at
        the end of the document it came from.
        """
        m = self.min_match
        if max_tokens <= 0 or len(tail) < m:
            return None
        t = tuple(tail[-self.max_match :])
        k = len(t)
        e = self._head.get(hash(t[k - m :]), -1)
        prev, entry_doc, entry_start = self._prev, self._entry_doc, self._entry_start
        limit_cap = min(self.max_match, k)
        best_len, best_doc, best_end = 0, None, -1
        checked = steps = 0
        while e >= 0 and checked < MAX_CANDIDATES and steps < MAX_CHAIN_STEPS:
            steps += 1
            doc = self._by_serial.get(entry_doc[e])
            if doc is not None and doc.doc_id != exclude:
                end = entry_start[e] + m
                if end < len(doc.tokens):  # an occurrence at the document's end has nothing to copy
                    checked += 1
                    got = _match_len(doc.tokens, end, t, k, min(limit_cap, end))
                    if got > best_len:
                        best_len, best_doc, best_end = got, doc, end
                        if got == limit_cap:  # nothing older can beat it (ties go to the newest)
                            break
            e = prev[e]
        if best_doc is None or best_len < m:
            return None
        dt = best_doc.tokens
        return Window(self.source, tuple(dt[best_end : min(best_end + max_tokens, len(dt))]), best_len)
