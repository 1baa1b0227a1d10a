"""Who gets draft rows this round.

All active streams advance together in one forward pass of ``n_streams`` x W rows, where W = 1 +
the most draft rows granted to any one stream (padded, or grouped so that streams without drafts
attend one row: ``engine.passes.grouped``; the cost model says which is cheaper). Every stream always has
its own row (its next token, worth exactly 1 token). A stream offering a copy window of
``max_rows`` tokens at copy rate r can be granted draft rows 1..k of it; row j is worth r**j
expected tokens (it lands only if rows 1..j-1 did). A window whose first row has its own chance r1
(own copy rates price first rows apart: ``engine.drafts.copy_rates``) has rows worth r1 * r**(j - 1).

Algorithm
---------
1. Candidate rows: for each offer, rows j = 1..max_rows (capped so W <= ``max_width``) valued r**j
   (or r1 * r**(j - 1)).
2. Take rows greedily in descending value across all streams (a heap; ties go to the lowest stream
   index; a stream's row j only becomes available after its row j-1 is taken).
3. After each taken row, throughput = (n_streams + taken value) / (cost(n_streams, W, k) + overhead),
   k being the streams with a row taken (the cost model prices a grouped pass when k < n_streams).
   Keep the prefix with the highest throughput; the empty prefix (no draft rows) is a valid answer,
   and ties keep the shorter prefix.
4. Probe offers whose stream got no row get exactly one row added afterwards, outside the pricing.

Where draft-free rounds run ahead (``engine.rounds.run_ahead``), the empty prefix costs
``keep_seconds`` (what such a round takes) instead of a width-1 pass plus overhead. When one is
already on the device, drafting drops it: every drafting prefix then pays ``dropping`` (that
pass) too, and probes wait for a round that drafts anyway or has nothing to drop (a lone stream's
also start in the round run ahead: ``engine.rounds.run_ahead``).

Rows worth less than ``MIN_ROW_VALUE`` are never candidates, and a window whose first row is less
likely to land than not (row 1 worth less than ``MIN_FIRST_ROW``) gets no rows at all. Inside a
pass that another stream has already widened, such rows cost no extra compute, so pure throughput would take them;
but they would mostly be wasted rows (compute, and on a laptop battery, spent for nothing), and a
stream whose copies keep breaking must stop paying verify rows for them (the seed's check),
whoever else is in the round. A window that does start keeps rows down to ``MIN_ROW_VALUE``: a
copy that has landed its first rows tends to run on.

Worked example: 4 streams on the measured 2-core CPU (ms: W=1 101, W=4 145, linear in between, so
W=2 115.7, W=3 130.3), overhead 0, offers: stream 0 at r=0.94 with 16 rows, stream 1 at r=0.36
with 16 rows. Stream 1's first row is below ``MIN_FIRST_ROW``, so it offers none. Greedy order:
s0 rows 1..16 (0.940, 0.884, 0.831, ... 0.371).

    prefix                 value     W   seconds   tokens/s
    (none)                 4.000     1   0.1010    39.6
    s0:1                   4.940     2   0.1157    42.7
    s0:1-2                 5.824     3   0.1303    44.7
    s0:1-3                 6.654     4   0.1450    45.9   <- best
    s0:1-4                 7.435     5   0.1633    45.5
    ...
    s0:1-16               13.845    17   0.3541    39.1

Result: rows (3, 0), expected_tokens 6.654, seconds 0.145.

The same offer on a GPU (ms: every width 7.0, overhead 2.5) with a round already run ahead that
takes 9.6 ms to keep (``keep_seconds``), so drafting costs 7.0 + 2.5 + the dropped 7.0 = 16.5 ms: keeping gives 4 /
9.6 = 0.417 tokens/ms; s0:1-16 gives 13.845 / 16.5 = 0.839, so the copy is still worth starting.
A window at r=0.6 (row 1 worth 0.6, rows 1-2 worth 0.96) gives at best 4.96 / 16.5 = 0.30: kept.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_ROW_VALUE = 0.3  # a row less likely than this to land is not worth verifying
MIN_FIRST_ROW = 0.5  # a window whose first row is more likely to break than land is not started


@dataclass(frozen=True, slots=True)
class Offer:
    """One stream's copy window this round."""

    stream: int  # index of the stream in this round (0..n_streams-1)
    rate: float  # copy rate of the window's source for this stream
    max_rows: int  # length of the stream's copy window (draft tokens available)
    probe: bool = False  # the probe rule fired: grant exactly one row regardless of price
    first_rate: float | None = None  # chance the first row lands, when it differs from ``rate``

    def value(self, j: int) -> float:
        """Expected tokens from row ``j`` (1-based): first_rate * rate**(j - 1), i.e. rate**j by default."""
        first = self.rate if self.first_rate is None else self.first_rate
        return first * self.rate ** (j - 1)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Draft rows granted per stream, with the value and time the allocator predicted for them."""

    rows: tuple[int, ...]  # draft rows granted per stream (len n_streams), 0 allowed
    expected_tokens: float  # n_streams + sum of granted row values
    seconds: float  # predicted round time: cost(B, 1 + max(rows)) + overhead


def allocate(
    offers: Sequence[Offer],
    n_streams: int,
    cost: Callable[[int, int], float],
    overhead: float,
    max_width: int = 32,
    min_row_value: float = MIN_ROW_VALUE,
    keep_seconds: float | None = None,
    dropping: float = 0.0,
) -> Allocation:
    """Grant draft rows to maximise expected tokens per second this round (see module docstring).

    ``cost(batch, width, wide)`` gives seconds for a pass of ``batch`` streams, ``width`` rows at the
    widest, ``wide`` of them drafting (e.g. ``CostModel.cost``, which prices padding). At most one offer
    per stream. Rates outside [0, 1] are clamped (NaN reads as 0); ``max_width`` caps W, so a stream
    gets at most ``max_width - 1`` draft rows, and with ``max_width == 1`` nobody drafts, probes
    included. ``min_row_value`` replaces ``MIN_ROW_VALUE`` (a family setting). ``keep_seconds``, when
    given, is what the round costs with no draft rows, and ``dropping`` what drafting adds to it
    (module docstring: rounds run ahead).

    >>> cpu = {1: 0.101, 2: 0.1157, 3: 0.1303, 4: 0.145, 5: 0.1633}
    >>> a = allocate([Offer(0, 0.94, 4)], 4, lambda b, w, k: cpu[w], 0.0)
    >>> a.rows, round(a.expected_tokens, 3), a.seconds
    ((3, 0, 0, 0), 6.654, 0.145)
    >>> gpu = lambda b, w, k: 0.007
    >>> allocate([Offer(0, 0.6, 4)], 4, gpu, 0.0025, keep_seconds=0.0096, dropping=0.007).rows
    (0, 0, 0, 0)
    """
    if n_streams < 1:
        raise ValueError(f"n_streams must be >= 1, got {n_streams}")
    if max_width < 1:
        raise ValueError(f"max_width must be >= 1, got {max_width}")
    if not (math.isfinite(overhead) and overhead >= 0.0):
        raise ValueError(f"overhead must be finite and >= 0, got {overhead!r}")
    if keep_seconds is not None and not (math.isfinite(keep_seconds) and keep_seconds > 0.0):
        raise ValueError(f"keep_seconds must be finite and > 0, got {keep_seconds!r}")
    if not (math.isfinite(dropping) and dropping >= 0.0):
        raise ValueError(f"dropping must be finite and >= 0, got {dropping!r}")

    row_cap = max_width - 1
    priced: list[Offer | None] = [None] * n_streams  # offers with rates clamped to [0, 1]
    caps = [0] * n_streams
    probes: list[int] = []
    seen: set[int] = set()
    for offer in offers:
        s = offer.stream
        if not 0 <= s < n_streams:
            raise ValueError(f"offer for stream {s} but only {n_streams} streams")
        if s in seen:
            raise ValueError(f"more than one offer for stream {s}")
        seen.add(s)
        first = offer.first_rate
        priced[s] = Offer(s, _clamp(offer.rate), offer.max_rows, offer.probe,
                          None if first is None else _clamp(first))
        caps[s] = max(0, min(offer.max_rows, row_cap))
        if offer.probe:
            probes.append(s)

    # Only a few (width, drafting streams) pairs occur, so price each once.
    round_seconds: dict[tuple[int, int], float] = {} if keep_seconds is None else {(1, 0): keep_seconds}

    def seconds_at(width: int, wide: int) -> float:
        t = round_seconds.get((width, wide))
        if t is None:
            t = cost(n_streams, width, wide) + overhead + (dropping if width > 1 else 0.0)
            if not (math.isfinite(t) and t > 0.0):
                raise ValueError(f"cost({n_streams}, {width}, {wide}) + overhead gave {t!r}; need > 0")
            round_seconds[(width, wide)] = t
        return t

    # Heap of each stream's next untaken row: (-value, stream, j). Rows worth 0 can never pay.
    def row_value(s: int, j: int) -> float:
        o = priced[s]
        return 0.0 if o is None else o.value(j)

    heap = [(-row_value(s, 1), s, 1) for s in range(n_streams) if caps[s] > 0 and row_value(s, 1) >= MIN_FIRST_ROW]
    heapq.heapify(heap)
    order: list[int] = []  # stream of each taken row, in greedy order
    value = float(n_streams)
    width, wide = 1, 0  # streams with a draft row taken
    best_len, best_tp = 0, value / seconds_at(1, 0)
    while heap:
        neg_v, s, j = heapq.heappop(heap)
        order.append(s)
        value -= neg_v
        width = max(width, j + 1)
        wide += j == 1
        tp = value / seconds_at(width, wide)
        if tp > best_tp:  # strict: on a tie keep the shorter prefix
            best_len, best_tp = len(order), tp
        if j < caps[s] and row_value(s, j + 1) >= min_row_value:
            heapq.heappush(heap, (-row_value(s, j + 1), s, j + 1))

    rows = [0] * n_streams
    for s in order[:best_len]:
        rows[s] += 1
    for s in probes if dropping == 0.0 or any(rows) else ():
        if rows[s] == 0 and caps[s] >= 1:
            rows[s] = 1

    expected = float(n_streams)
    for s, k in enumerate(rows):
        expected += sum(row_value(s, j) for j in range(1, k + 1))
    drafting = sum(1 for k in rows if k)
    return Allocation(rows=tuple(rows), expected_tokens=expected, seconds=seconds_at(1 + max(rows), drafting))


def _clamp(rate: float) -> float:
    """A rate within [0, 1]; NaN reads as 0."""
    return min(1.0, max(0.0, rate)) if rate == rate else 0.0
