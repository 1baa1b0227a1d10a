"""Edits a reply makes to the text it copies, learned from its own breaks and replayed in its drafts.

A reply that rewrites given text (rename a variable, turn a list into a table, JSON into YAML)
makes the same small edit again and again: ``cnt`` -> ``count``, ``,`` -> `` |``. A plain copy
breaks at every one of them and needs a round or two to find the source again. A stream's
``EditBook`` learns an edit the first time a copy breaks there and resumes (a resync whose first
row lands), and applies it to later drafts copied from the prompt, so the copy runs through the
edit. Drafts are only proposals that the model verifies row by row: a wrong edit costs a rejected
row, never a changed token.

An edit replaces ``old`` (1 to ``MAX_EDIT_TOKENS`` source tokens) with ``new`` (0 or more). It is
applied while it has failed no more often than it has landed; learning it again counts as a landing.

Worked example (one token per word; ``-``=1, ``,``=2, ``\\n``=3, ``|``=4, `` |``=5):

    prompt  1 Maria 2 Berlin 3 1 James 2 Paris 3      ("- Maria, Berlin" / "- James, Paris")
    reply   4 Maria 5 Berlin 5 3 4 ...                ("| Maria | Berlin |" ...)

A copy of the prompt broke at its ``2`` where the reply wrote ``5``; one token later the reply
went on with ``Berlin``, as the prompt does. ``edit_between`` trims the common tail of
``[2, Berlin]`` and ``[5, Berlin]`` to the edit ``(2,) -> (5,)``; the breaks at ``3`` and ``1``
give ``(3,) -> (5, 3)`` (the common tail is kept so ``old`` is never empty) and ``(1,) -> (4,)``.
Drafting from ``1 James 2 Paris 3`` then gives ``4 James 5 Paris 5 3``: the next row whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MAX_EDIT_TOKENS = 8  # longer differences are rewrites, not edits, and seldom recur
MAX_EDITS = 64  # per stream; the oldest learned is forgotten first


@dataclass
class Edit:
    new: tuple[int, ...]
    landed: int = 1  # learning it is its first landing
    failed: int = 0

    @property
    def active(self) -> bool:
        return self.failed <= self.landed


@dataclass(frozen=True)
class Applied:
    """Where an edit sits in a draft: its new tokens start at draft index ``at``."""

    at: int
    old: tuple[int, ...]
    length: int  # len(new)

    def outcome(self, granted: int, accepted: int) -> bool | None:
        """True if the rows through the edit landed, False if one of them was rejected, None if unknown.

        A deletion (no new tokens) is judged by the row after it. Unknown: the copy broke before the
        edit, or the granted rows ran out inside it.
        """
        span = max(1, self.length)
        if accepted >= self.at + span:
            return True
        if self.at <= accepted < granted:
            return False
        return None


@dataclass(frozen=True)
class Draft:
    """Tokens copied from ``text[start:]`` with edits applied.

    ``sources[i]`` is where draft token i's source text starts (an edit's new tokens all point
    at its old text); ``sources[len(tokens)]`` is where the source after the last token starts.
    """

    tokens: tuple[int, ...]
    sources: tuple[int, ...]
    applied: tuple[Applied, ...] = field(default=())


def edit_between(old: Sequence[int], new: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The edit that turned ``old`` into ``new``, both ending where the copy resumed.

    Their common tail is dropped, but ``old`` keeps at least one token (an insertion is written
    as a replacement of the token it comes before). None when nothing changed or it is too long.

    >>> edit_between([2, 11], [5, 11])
    ((2,), (5,))
    >>> edit_between([3], [5, 3])
    ((3,), (5, 3))
    """
    o, n = list(old), list(new)
    while len(o) > 1 and n and o[-1] == n[-1]:
        o.pop()
        n.pop()
    if not o or o == n or len(o) > MAX_EDIT_TOKENS or len(n) > MAX_EDIT_TOKENS:
        return None
    return tuple(o), tuple(n)


class EditBook:
    """The edits one stream has learned, by old text.

    >>> book = EditBook()
    >>> book.learn((2,), (5,))
    >>> book.learn((3,), (5, 3))
    >>> book.apply([1, 10, 2, 11, 3], start=0, stop=5, limit=8).tokens
    (1, 10, 5, 11, 5, 3)
    """

    def __init__(self) -> None:
        self._edits: dict[tuple[int, ...], Edit] = {}
        self._by_first: dict[int, list[tuple[int, ...]]] = {}  # longest old first

    def __len__(self) -> int:
        return len(self._edits)

    def __contains__(self, old: tuple[int, ...]) -> bool:
        return old in self._edits

    def get(self, old: tuple[int, ...]) -> Edit | None:
        return self._edits.get(old)

    def learn(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """Record that the reply wrote ``new`` where the source had ``old``."""
        edit = self._edits.get(old)
        if edit is not None and edit.new == new:
            edit.landed += 1
            return
        if edit is None and len(self._edits) >= MAX_EDITS:
            self._forget(next(iter(self._edits)))
        self._edits[old] = Edit(new)
        keys = self._by_first.setdefault(old[0], [])
        if old not in keys:
            keys.append(old)
            keys.sort(key=len, reverse=True)

    def score(self, applied: Iterable[Applied], granted: int, accepted: int) -> None:
        """Count which of a verified draft's edits landed and which broke the copy."""
        for a in applied:
            edit = self._edits.get(a.old)
            result = a.outcome(granted, accepted)
            if edit is None or result is None:
                continue
            if result:
                edit.landed += 1
            else:
                edit.failed += 1

    def apply(
        self,
        text: Sequence[int],
        start: int,
        stop: int,
        limit: int,
        edit_until: int | None = None,
        extra: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> Draft:
        """Copy ``text[start:stop]``, at most ``limit`` tokens, applying active edits.

        Edits apply only to old text that ends by ``edit_until`` (the prompt: the reply's own text
        is already edited). ``extra`` is one more edit to try, not yet learned.
        """
        until = stop if edit_until is None else min(stop, edit_until)
        tokens: list[int] = []
        sources: list[int] = []
        applied: list[Applied] = []
        j = start
        while j < stop and len(tokens) < limit:
            hit = self._match(text, j, until, extra)
            if hit is None:
                tokens.append(text[j])
                sources.append(j)
                j += 1
                continue
            old, new = hit
            applied.append(Applied(len(tokens), old, len(new)))
            tokens.extend(new)
            sources.extend([j] * len(new))
            j += len(old)
        if len(tokens) > limit:  # an edit's new tokens ran past the limit
            cut = limit
            j = sources[cut]
            tokens, sources = tokens[:cut], sources[:cut]
        return Draft(tuple(tokens), (*sources, j), tuple(applied))

    def _match(
        self, text: Sequence[int], j: int, until: int, extra: tuple[tuple[int, ...], tuple[int, ...]] | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        if j >= until:
            return None
        first = text[j]
        if extra is not None and extra[0][0] == first and _starts(text, j, until, extra[0]):
            return extra
        for old in self._by_first.get(first, ()):
            edit = self._edits[old]
            if edit.active and _starts(text, j, until, old):
                return old, edit.new
        return None

    def _forget(self, old: tuple[int, ...]) -> None:
        del self._edits[old]
        keys = self._by_first[old[0]]
        keys.remove(old)
        if not keys:
            del self._by_first[old[0]]


def _starts(text: Sequence[int], j: int, until: int, old: tuple[int, ...]) -> bool:
    end = j + len(old)
    return end <= until and tuple(text[j:end]) == old
