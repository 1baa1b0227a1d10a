"""Per-stream copy history by source: each stream's "own copy rates".

Vocabulary
----------
A *stream* is one reply being generated. Each round a stream may draft rows from a *copy window*
(tokens copied from earlier text) whose *source* is ``"context"`` (the stream's own tokens) or
``"recall"`` (other conversations). Verification is sequential: row j is accepted only if rows
1..j-1 were. A window's *tested* rows are those verified up to and including its first rejection
(all rows if none was rejected); its *accepted* rows are those that matched. The *copy rate* r of a
source is the chance that a copied row lands, so row j (1-based) is worth r**j expected tokens.

Estimate
--------
For each source we keep decayed counts of accepted and tested rows and estimate::

    rate = (accepted + PRIOR_ROWS * prior) / (tested + PRIOR_ROWS)

i.e. a Beta-style estimate whose prior is worth ``PRIOR_ROWS`` (4) rows at ``prior`` (0.94). This
is the maximum-likelihood per-row acceptance under sequential verification (shrunk toward the prior):
a window that tests t rows and accepts a of them gives t Bernoulli outcomes, a successes and t - a
failures. Rows after the first rejection were never tested, so they carry no evidence.

Each recorded window first multiplies both counts by ``decay`` and then adds its own rows, so a
window k windows old weighs ``decay**k``.

First rows apart
----------------
Rows of one window do not land independently: whether a copy applies here at all is one bet, and
once it has, it tends to run on. On the mixed workload (ad hoc count, 2-core CPU) windows' first
rows landed 69% of the time and later rows, given the row before landed, 93-95%. So each window's
first row is recorded in its own history (``first_key``: ``"context.first"``, or ``"resync"`` for a
copy picked up again after an edit) and only the rows after it in the source's, both with the same
estimate and prior. The allocator values row j at r1 * r**(j - 1), r1 being the first-row rate: a
window that seldom starts well is not started (its r1 falls under ``MIN_FIRST_ROW``), and one that
starts well is given the longer run its source's continuation rate pays for. Until a stream has a
first-row history (e.g. one stored before it existed) r1 is its source's rate.

Doubtful first rows
-------------------
How a window was found says how likely its first row is to land. In ad hoc counts (2-core CPU,
``on``, the three main workloads) windows found by a match of 9 or more tokens landed their first
row 97% of the time (91-100% by workload), those found by a match of at most ``SHORT_MATCH`` (8)
tokens 63% (50-95%) and resyncs 46% (34-61%), while copies carrying learned edits (engine.drafts.edits)
landed 21 times in the 22 counted. So short-match windows (``"context.short"``, ``"recall.short"``) and resyncs
(``"resync"``) without learned edits are *doubtful*: their first rows keep a history of their own
whose prior is ``doubt_prior`` (0.45, a family setting) instead of 0.94, and the rows after their
first row one of their own too (``"context.short.rest"``, ``"resync.rest"``; the source's rate until
it has one). The prior sits under ``MIN_FIRST_ROW`` (0.5), so a stream starts no doubtful window of
a kind until it has seen one land: the probe rule (below) tests one first row of that kind after
``probe_every`` rounds. One landing raises the rate to (1 + 4 * 0.45) / 5 = 0.56 and the kind is
started from then on; a broken probe lowers it to 0.36 and doubles the wait. After a landing and
then a break (decay 0.9) it is (0.9 + 1.8) / (1.9 + 4) = 0.46: stopped again until a probe lands.

Why not start them and learn: a prior of 0.6 did, and one broken first row then stopped the next
((0 + 4 * 0.6) / 5 = 0.48). On the mixed workload (``on``, ad hoc count, 2-core CPU) the doubtful
windows so started were 37 of its 105 windows and 29 of its 48 broken ones, for 51 of its 533
accepted tokens. Side by side in one ``lanes bench`` run (``docs/benchmarks.md`` as of b5b3d36, "The
doubt prior side by side in one run"), mixed's wasted rows were 0.45x ``off``'s at 0.45, 0.63x at 0.6
and 0.83x at 0.94, all level with ``off`` in speed; the cost is on copy-heavy, 0.93x ``off`` at 0.45 against
1.02x at 0.94 (7% fewer accepted tokens: a kind waits for its probe). From 0.94 it had taken five
broken first rows in a row to stop them, and a reply seldom offers that many.

Brief matches (``"context.brief"``): with own copy rates, when no match of ``min_match`` tokens, no
edited copy and no resync offers a window, the stream looks for 2-3 trailing tokens (the family's
``brief_match``) that the prompt has once and no other text matches as long (engine.rounds.stream). A
table row's name, written after ``|`` where the list had ``-``, is one; its copy is what teaches the
edits (``,`` -> `` |``) that later copies replay. Their first rows are doubtful with a history of
their own, so a broken brief window does not stop the short matches that land.

Worked example (prior 0.94, decay 0.9)::

    start                          accepted 0      tested 0      rate (0 + 3.76) / (0 + 4)   = 0.9400
    window tested 3, accepted 2    accepted 2      tested 3      rate 5.76 / 7               = 0.8229
    window tested 1, accepted 0    accepted 1.8    tested 3.7    rate 5.56 / 7.7             = 0.7221
    window tested 4, accepted 4    accepted 5.62   tested 7.33   rate 9.38 / 11.33           = 0.8279

Probe rule
----------
Once a source's rate is low enough that the allocator stops granting it rows, nothing would ever
test it again and the rate could never recover. So if a source's probe interval (``probe_every``
rounds, i.e. ``tick`` calls, at first) passes without a window of it being recorded,
``probe_due(source)`` turns True; the engine then grants that stream's window one row outside the
normal pricing (engine.drafts.allocator; a lone stream's rounds that run ahead start it there,
engine.rounds.run_ahead), and recording the window resets the count. A window that lands nothing doubles the
source's interval (8, 16, 32, 64 rounds at most) and one that lands anything resets it: in text
that stays uncopyable the probes themselves would otherwise be most of the wasted rows, while a
source whose text turns copyable again is re-tested within 64 rounds and recovers at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PRIOR_ROWS = 4.0

# Per-window decay. Worth ~1 / (1 - 0.9) = 10 windows of memory. Why 0.9 (numbers for the measured
# 2-core CPU, 4 streams, where a first draft row pays only when rate > ~0.58):
#  - slow enough: one fully broken window (tested 1, accepted 0) moves a fresh 0.94 to 0.75, still
#    above break-even, so one unlucky window does not shut copying off;
#  - fast enough: three broken windows in a row give 0.64 -> 0.56, below break-even, so a stream whose
#    text stopped being copyable stops paying within ~3 of its windows; after 10 it sits at 0.36.
# The allocator starts no window whose first row is worth < 0.5 (MIN_FIRST_ROW): five broken windows
# in a row (0.94 -> 0.75, 0.64, 0.56, 0.51, 0.46) price a source out even where a row would be nearly
# free (a single CPU stream, or a GPU). With only 1-row failures the rate tends to
# 3.76 / (4 + 10) = 0.27; probes (below) re-test it.
DEFAULT_DECAY = 0.9
RESYNC = "resync"  # history of resync windows' first rows (see record_window)
SHORT_MATCH = 8  # a window found by a match of at most this many tokens is a "short" one
DOUBT_PRIOR = 0.45  # prior of doubtful first rows (short matches, resyncs): see "Doubtful first rows"
MAX_PROBE_INTERVAL = 64  # rounds; the longest a priced-out source waits between probes


def first_key(source: str, resync: bool = False, short: bool = False, brief: bool = False) -> str:
    """The history of the first rows of ``source``'s windows: ``"resync"`` for resync windows,
    ``"<source>.brief"`` for windows found by a match shorter than the source's minimum (the
    fallback search, engine.rounds.stream), ``"<source>.short"`` for windows found by a short match, else
    ``"<source>.first"``."""
    if resync:
        return RESYNC
    if brief:
        return f"{source}.brief"
    return f"{source}.short" if short else f"{source}.first"


def doubtful(key: str) -> bool:
    """Whether ``key`` is a first-row history that starts from the doubt prior."""
    return key == RESYNC or key.endswith((".short", ".brief"))


def rest_key(source: str, first: str) -> str:
    """The history of the rows after the first of a window whose first row is ``first``'s: the
    source's, or for a doubtful window its own (``"resync.rest"``, ``"context.short.rest"``)."""
    return f"{first}.rest" if doubtful(first) else source


@dataclass
class SourceHistory:
    """Decayed counts of accepted and tested draft rows for one source."""

    accepted: float = 0.0
    tested: float = 0.0


def _clean_count(value: Any) -> float:
    """A stored count as a finite non-negative float; garbage reads as 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        return 0.0
    return value


def _clean_history(accepted: Any, tested: Any) -> SourceHistory:
    tested_f = _clean_count(tested)
    # A row cannot be accepted without being tested.
    return SourceHistory(accepted=min(_clean_count(accepted), tested_f), tested=tested_f)


class CopyRates:
    """Copy history of one stream, by source.

    >>> rates = CopyRates()
    >>> rates.rate("context")
    0.94
    >>> rates.record("context", tested=3, accepted=2)
    >>> round(rates.rate("context"), 4)
    0.8229
    """

    def __init__(
        self,
        prior: float = 0.94,
        decay: float = DEFAULT_DECAY,
        history: Mapping[str, SourceHistory] | None = None,
        probe_every: int = 8,
        doubt_prior: float = DOUBT_PRIOR,
    ) -> None:
        for name, value in (("prior", prior), ("doubt_prior", doubt_prior)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every!r}")
        self.prior = float(prior)
        self.doubt_prior = float(doubt_prior)
        self.decay = float(decay)
        self.probe_every = int(probe_every)
        # Copies, so the caller's objects are never mutated by record().
        self._history: dict[str, SourceHistory] = {
            source: _clean_history(h.accepted, h.tested) for source, h in (history or {}).items()
        }
        self._round = 0
        # Round at which each source last had a window recorded; absent = since creation (round 0).
        self._last_recorded: dict[str, int] = {}
        self._interval: dict[str, int] = {}  # probe interval by source; absent = probe_every

    def rate(self, source: str) -> float:
        """Chance a copied row from ``source`` lands: (accepted + 4 * prior) / (tested + 4), the prior
        being ``doubt_prior`` for doubtful first-row histories (``doubtful``)."""
        prior = self.doubt_prior if doubtful(source) else self.prior
        h = self._history.get(source)
        if h is None:
            return prior
        return (h.accepted + PRIOR_ROWS * prior) / (h.tested + PRIOR_ROWS)

    def record(self, source: str, tested: int, accepted: int) -> None:
        """Record one verified window of ``source``: decay both counts, then add this window's rows.

        A window with ``tested == 0`` verified nothing and is ignored (it neither decays the history
        nor counts as a probe).
        """
        if tested < 0 or accepted < 0 or accepted > tested:
            raise ValueError(f"need 0 <= accepted <= tested, got tested={tested}, accepted={accepted}")
        if tested == 0:
            return
        h = self._history.setdefault(source, SourceHistory())
        h.accepted = h.accepted * self.decay + accepted
        h.tested = h.tested * self.decay + tested
        self._last_recorded[source] = self._round
        if accepted:
            self._interval.pop(source, None)
        else:
            wait = self._interval.get(source, self.probe_every)
            self._interval[source] = min(2 * wait, max(MAX_PROBE_INTERVAL, self.probe_every))

    def record_window(self, source: str, granted: int, accepted: int, first: str | None = None) -> int:
        """Record a verified window of ``granted`` rows of which the first ``accepted`` landed.

        Returns its tested rows: all of them if none was rejected, else up to and including the first
        rejection. The first row goes to the window's first-row history ``first`` (``first_key``;
        by default ``"<source>.first"``) and the rest, if the first landed, to ``rest_key``'s: the
        source's, or a doubtful window's own (see "First rows apart" and "Doubtful first rows").

        >>> rates = CopyRates()
        >>> rates.record_window("context", granted=5, accepted=2, first=RESYNC)
        3
        >>> rates.record_window("context", granted=4, accepted=4)
        4
        >>> rates.snapshot()
        {'resync': {'accepted': 1.0, 'tested': 1.0}, 'resync.rest': {'accepted': 1.0, 'tested': 2.0}, 'context.first': {'accepted': 1.0, 'tested': 1.0}, 'context': {'accepted': 3.0, 'tested': 3.0}}
        """
        if granted < 0 or not 0 <= accepted <= granted:
            raise ValueError(f"need 0 <= accepted <= granted, got granted={granted}, accepted={accepted}")
        tested = granted if accepted == granted else accepted + 1
        first = first or first_key(source)
        if tested:
            self.record(first, 1, min(accepted, 1))
            if tested > 1:
                self.record(rest_key(source, first), tested - 1, accepted - 1)
        return tested

    def first_rate(self, source: str, first: str | None = None) -> float:
        """Chance the first row of a ``source`` window lands, from its first-row history ``first``
        (by default ``"<source>.first"``). A doubtful history starts from the doubt prior; the
        others from the source's rate until they have a history (one stored before they existed)."""
        key = first or first_key(source)
        return self.rate(key) if doubtful(key) or key in self._history else self.rate(source)

    def rest_rate(self, source: str, first: str | None = None) -> float:
        """Chance a row after the first of a ``source`` window lands, given the row before it did:
        from its own history for a doubtful window once it has one, else from the source's."""
        key = rest_key(source, first or first_key(source))
        return self.rate(key) if key in self._history else self.rate(source)

    def tick(self) -> None:
        """Advance one round for this stream (call once per round it takes part in)."""
        self._round += 1

    def probe_due(self, source: str) -> bool:
        """True when the source's probe interval has passed without a window of it being recorded.

        The engine then grants this stream's ``source`` window one row whatever its price, so a
        source priced out of drafting is still re-tested now and then.

        >>> rates = CopyRates(probe_every=8)
        >>> rates.record("context", tested=1, accepted=0)   # nothing landed: wait 16 rounds
        >>> for _ in range(15): rates.tick()
        >>> rates.probe_due("context"), rates.probe_interval("context")
        (False, 16)
        >>> rates.tick(); rates.probe_due("context")
        True
        """
        return self._round - self._last_recorded.get(source, 0) >= self.probe_interval(source)

    def probe_interval(self, source: str) -> int:
        """Rounds ``source`` must go unrecorded before a probe: ``probe_every``, doubled per barren window."""
        return self._interval.get(source, self.probe_every)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """JSON-able counts, e.g. ``{"context": {"accepted": 5.62, "tested": 7.33}}``."""
        return {s: {"accepted": h.accepted, "tested": h.tested} for s, h in self._history.items()}

    @classmethod
    def from_snapshot(
        cls, data: Mapping[str, Mapping[str, float]] | None, prior: float = 0.94, **kw: Any
    ) -> CopyRates:
        """Rebuild from :meth:`snapshot` output, tolerating damage.

        ``None`` or a non-mapping gives a fresh history. Non-string source names and sources whose
        entry is not a mapping are dropped; fields other than ``accepted``/``tested`` are ignored;
        missing, non-numeric, non-finite or negative counts read as 0; ``accepted`` is capped at
        ``tested``. Other keyword arguments (``decay``, ``probe_every``) go to the constructor.
        """
        history: dict[str, SourceHistory] = {}
        if isinstance(data, Mapping):
            for source, entry in data.items():
                if isinstance(source, str) and isinstance(entry, Mapping):
                    history[source] = _clean_history(entry.get("accepted"), entry.get("tested"))
        return cls(prior=prior, history=history, **kw)
