"""Seconds per forward pass as a function of batch shape.

Every round is one batched forward pass, padded to B streams x W rows each, where
W = 1 + the most draft rows granted to any stream that round. The engine times a few shapes at load
(:data:`CALIBRATION_SHAPES`) and then feeds every real round to :meth:`CostModel.observe`, so the
model follows the running machine (thermal throttling, other load).

How :meth:`CostModel.cost` answers for (B, W):

1. an observed shape -> its moving average;
2. a batch with observed widths -> linear in W between the nearest observed widths, and linear past
   the ends using the slope of the two outermost widths (never sloping down), past the widest never
   steeper than the fitted W-slope below (two close widths' noise, or a step between them, such as
   a GPU's compiled one-row pass beside an uncompiled wider one, must not be stretched over many
   rows); with only one observed width for that batch, the fitted W-slope is used;
3. an unobserved batch -> least-squares fit ``cost = a + b*B + c*B*W`` over all observed shapes, with
   b, c >= 0 so the fit never falls as B or W grows;
4. fewer than 3 shapes, or shapes that cannot pin down a, b, c -> :data:`DEFAULT_CURVE`, scaled by the
   mean ratio of the observed costs to it (so one calibration sample still sets the scale).

Answers are clamped to at least :data:`MIN_SECONDS`: never 0, negative or NaN.

Padded widths (``row_step``): where passes of several rows run padded to a multiple of ``row_step``
rows (a GPU's compiled drafting and continued rounds: ``RoundPasses.draft_step``), a width W > 1 is
priced and observed as that multiple, so rows inside the padding cost nothing more: with
``row_step=8``, ``cost(4, 3)`` is ``cost(4, 8)``, and a 3-row round timed is folded in as 4x8.

Worked example with the measured 2-core CPU numbers (SmolLM2-135M), milliseconds::

    B \\ W    1     4     8    16
    1        64    80    98   114
    2        72   108   139   189
    4       101   145   218   339

    cost(4, 16) = 339 ms                     observed
    cost(4, 2)  = 101 + (145 - 101) / 3      = 115.7 ms  (between W=1 and W=4)
    cost(4, 20) = 339 + 4 * (339 - 218) / 8  = 399.5 ms  (past W=16, slope of W=8..16)
    cost(3, 8)  = 52.1 + 8.78 * 3 + 3.92 * 24 = 172.5 ms (fit: a=52.1, b=8.78, c=3.92)

On a GPU the same table is nearly flat, so wide rounds cost little.

Grouped rounds (``engine.passes.grouped``; enabled with ``grouped=True`` where the model supports them):
when only k < B streams draft, the round can run their W rows as one group and the other streams'
single rows as another. ``cost(B, W, wide=k)`` is then the cheaper of the padded pass and the
grouped one; a grouped shape that has been observed answers with its moving average, else

    grouped(B, W, k) = cost(B, 1) + cost(k, W) - cost(k, 1)

(every stream's own row, plus what W rows add for k streams), never below cost(B, 1). With the
table above: grouped(4, 8, 1) = 101 + 98 - 64 = 135 ms against 218 ms padded.

Context (``engine.drafts.context_cost``): every answer above is a *base* cost, to which ``cost(..., keys=K)``
adds what attending K keys costs for that shape, and ``observe(..., keys=K)`` takes that term off a
timing before folding it in. So a round timed deep in a long conversation does not make the same
shape look dear in a short one, and wide rounds in a long one are priced as dear as they are. With
:data:`~engine.drafts.context_cost.NO_CONTEXT_COST` (the default) the term is 0 and keys change nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.drafts.context_cost import NO_CONTEXT_COST, ContextCost

# Shapes the engine times at load: narrow and wide passes at one and several streams.
CALIBRATION_SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (1, 8), (4, 1), (4, 8), (4, 16))
# Grouped passes timed too where the model has them (B, W, drafting streams): one stream drafting
# is the common uneven round, and its measured cost shows whether grouping pays on this machine.
GROUPED_CALIBRATION_SHAPES: tuple[tuple[int, int, int], ...] = ((4, 8, 1), (4, 16, 1))
# Context the shapes above are timed at, and the longer one that the shapes below are timed at too,
# to measure what a key of context adds (engine.drafts.context_cost).
CALIBRATION_KEYS = 64
LONG_CALIBRATION_KEYS = 1024
CONTEXT_CALIBRATION_SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (1, 8), (4, 1), (4, 8))

# Fallback curve (seconds) = a + b*B + c*B*W: the least-squares fit of the 2-core CPU table above.
# Deliberately the slow machine: before calibration it is better to under-draft than to over-pad.
DEFAULT_CURVE: tuple[float, float, float] = (0.0521, 0.00878, 0.00392)

MIN_SECONDS = 1e-6


def _valid_seconds(seconds: float) -> bool:
    return isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0.0


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Solve a small linear system by Gaussian elimination; None if (nearly) singular."""
    n = len(rhs)
    m = [[*row, r] for row, r in zip(matrix, rhs)]
    scale = max((abs(v) for row in matrix for v in row), default=0.0)
    if scale == 0.0:
        return None
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if abs(m[pivot][col]) <= 1e-12 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(n):
            if i != col:
                f = m[i][col] / m[col][col]
                for k in range(col, n + 1):
                    m[i][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def _fit(samples: Mapping[tuple[int, int], float]) -> tuple[float, float, float] | None:
    """Least squares ``a + b*B + c*B*W`` with b, c >= 0, or None if the shapes can't identify it.

    Non-negativity is exact: try every subset of {b, c} left free (a is always free), keep the
    feasible solution with the smallest squared error. Four 3x3-at-most solves, microseconds.
    """
    if len(samples) < 3:
        return None
    rows = [((1.0, float(b), float(b * w)), s) for (b, w), s in samples.items()]
    full = _lstsq(rows, (0, 1, 2))
    if full is None:
        return None  # shapes all on one line (e.g. one batch, or B*W constant): c and b not separable
    best: tuple[float, tuple[float, float, float]] | None = None
    for free in ((0, 1, 2), (0, 1), (0, 2), (0,)):
        coef = full if free == (0, 1, 2) else _lstsq(rows, free)
        if coef is None or coef[1] < 0.0 or coef[2] < 0.0:
            continue
        sse = sum((s - (coef[0] + coef[1] * x[1] + coef[2] * x[2])) ** 2 for x, s in rows)
        if best is None or sse < best[0] - 1e-18:
            best = (sse, coef)
    return None if best is None else best[1]


def _lstsq(
    rows: list[tuple[tuple[float, float, float], float]], free: tuple[int, ...]
) -> tuple[float, float, float] | None:
    """Least squares over the ``free`` coefficients (others fixed at 0), via the normal equations."""
    ata = [[sum(x[i] * x[j] for x, _ in rows) for j in free] for i in free]
    aty = [sum(x[i] * s for x, s in rows) for i in free]
    sol = _solve(ata, aty)
    if sol is None:
        return None
    coef = [0.0, 0.0, 0.0]
    for i, v in zip(free, sol):
        coef[i] = v
    return (coef[0], coef[1], coef[2])


class CostModel:
    """Predicted seconds for a padded B x W forward pass, plus host overhead per round.

    >>> m = CostModel({(4, 1): 0.101, (4, 4): 0.145})
    >>> round(m.cost(4, 2), 4)
    0.1157
    >>> m.observe(4, 4, 0.155)        # EMA with alpha 0.2: 0.8 * 0.145 + 0.2 * 0.155
    >>> round(m.cost(4, 4), 4)
    0.147
    """

    def __init__(
        self,
        samples: Mapping[tuple[int, int], float] | None = None,
        alpha: float = 0.2,
        overhead: float = 0.0,
        grouped: bool = False,
        context: ContextCost = NO_CONTEXT_COST,
        row_step: int = 1,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if not (math.isfinite(overhead) and overhead >= 0.0):
            raise ValueError(f"overhead must be finite and >= 0, got {overhead!r}")
        if row_step < 1:
            raise ValueError(f"row_step must be >= 1, got {row_step!r}")
        self.alpha = float(alpha)
        self.grouped = grouped  # whether rounds may be grouped (the scheduler sets it per model)
        self.row_step = row_step  # passes wider than a row run padded to a multiple of this (module docstring)
        self.context = context  # seconds per key of context (set from calibration before observing)
        self._samples: dict[tuple[int, int], float] = {}
        self._grouped: dict[tuple[int, int, int], float] = {}  # (B, W, k) -> observed seconds
        self._widths: dict[int, list[int]] = {}  # batch -> sorted observed widths
        self._coef: tuple[float, float, float] | None = None
        self._scale = 1.0  # DEFAULT_CURVE multiplier when the fit is not identifiable
        self._fitted = False
        self._overhead = float(overhead)
        self._overhead_seen = False
        self._kept: dict[int, float] = {}  # batch -> seconds of a round that ran ahead, whole
        for (batch, width), seconds in (samples or {}).items():
            _check_shape(batch, width)
            if not _valid_seconds(seconds):
                raise ValueError(f"sample {batch}x{width} must be finite and > 0 seconds, got {seconds!r}")
            self._samples[(batch, width)] = float(seconds)
        self._rebuild()

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any] | None, alpha: float = 0.2) -> CostModel:
        """Rebuild from :meth:`snapshot` output; malformed keys or values are skipped."""
        samples: dict[tuple[int, int], float] = {}
        if isinstance(data, Mapping):
            for key, seconds in data.items():
                try:
                    b_str, w_str = str(key).lower().split("x")
                    batch, width = int(b_str), int(w_str)
                except ValueError:
                    continue
                if batch >= 1 and width >= 1 and not isinstance(seconds, bool) and _valid_seconds(seconds):
                    samples[(batch, width)] = float(seconds)
        return cls(samples, alpha=alpha)

    @property
    def overhead(self) -> float:
        """Running average of host seconds per round (round time minus forward time)."""
        return self._overhead

    def observe_overhead(self, seconds: float) -> None:
        """Fold one round's host time into the overhead average (negative noise reads as 0)."""
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            return  # a clock glitch must not poison the average
        seconds = max(0.0, float(seconds))
        if self._overhead_seen:
            self._overhead += self.alpha * (seconds - self._overhead)
        else:
            self._overhead, self._overhead_seen = seconds, True

    def kept(self, batch: int, keys: int = 0) -> float:
        """Seconds of a whole round whose draft-free pass ran ahead (``engine.rounds.run_ahead``): its
        host work overlapped the pass. Until one is observed at this batch, a width-1 pass, scaled by
        what such rounds took against it at the nearest batch observed (where a width-1 pass is timed
        as a round that queues the next, ``engine.rounds.calibration``, it holds two passes' dispatch).

        >>> m = CostModel({(4, 1): 0.007, (4, 8): 0.0075}, overhead=0.0025)
        >>> m.kept(4)
        0.007
        >>> m.observe_kept(4, 0.0035)
        >>> m.kept(4), round(m.kept(3), 5), round(m.cost(3, 1), 5)  # 3 streams: their pass's half too
        (0.0035, 0.00233, 0.00466)
        """
        seen = self._kept.get(batch)
        if seen is not None:
            return seen
        near = min(self._kept, key=lambda b: (abs(b - batch), b), default=None)
        scale = 1.0 if near is None else self._kept[near] / self.cost(near, 1)
        return scale * self.cost(batch, 1, keys=keys)

    def observe_kept(self, batch: int, seconds: float) -> None:
        """Fold one whole round that ran ahead into ``kept(batch)``'s average."""
        if not _valid_seconds(seconds):
            return
        seen = self._kept.get(batch)
        self._kept[batch] = float(seconds) if seen is None else seen + self.alpha * (seconds - seen)

    def observe(self, batch: int, width: int, seconds: float, wide: int | None = None, keys: int = 0) -> None:
        """Fold one timed B x W pass over ``keys`` keys into that shape's base average; refit the fallback.

        ``wide`` = k < B means a grouped pass with k drafting streams (kept apart from padded ones).
        A new shape takes the timing as is; non-finite or non-positive timings are dropped.
        """
        _check_shape(batch, width)
        if not _valid_seconds(seconds):
            return
        width = self.priced_width(width)
        if wide is not None and wide < batch:
            seconds = max(seconds - self.context.seconds(batch, width, keys, wide), MIN_SECONDS)
            gkey = (batch, width, wide)
            old_g = self._grouped.get(gkey)
            self._grouped[gkey] = float(seconds) if old_g is None else old_g + self.alpha * (seconds - old_g)
            return
        seconds = max(seconds - self.context.seconds(batch, width, keys), MIN_SECONDS)
        key = (batch, width)
        old = self._samples.get(key)
        self._samples[key] = float(seconds) if old is None else old + self.alpha * (seconds - old)
        if old is None:
            self._rebuild()
        else:
            self._fitted = False

    def cost(self, batch: int, width: int, wide: int | None = None, keys: int = 0) -> float:
        """Predicted seconds for a B x W pass over ``keys`` keys where ``wide`` streams draft (None: all)."""
        width = self.priced_width(width)
        if wide is not None and self.groups_pay(batch, width, wide, keys):
            return self._grouped_cost(batch, width, wide, keys)
        return self._padded(batch, width) + self.context.seconds(batch, width, keys)

    def priced_width(self, width: int) -> int:
        """The rows a pass of ``width`` runs: ``width`` rounded up to a multiple of ``row_step`` past one.

        >>> m = CostModel({(4, 1): 0.005, (4, 8): 0.006}, row_step=8)
        >>> m.priced_width(1), m.priced_width(3), m.priced_width(9)
        (1, 8, 16)
        >>> m.cost(4, 3) == m.cost(4, 8)
        True
        """
        return width if width == 1 or self.row_step == 1 else -(-width // self.row_step) * self.row_step

    def groups_pay(self, batch: int, width: int, wide: int | None, keys: int = 0) -> bool:
        """Whether a grouped pass is expected to beat the padded one for this round."""
        if not self.grouped or wide is None or not 0 < wide < batch or width == 1:
            return False
        padded = self._padded(batch, width) + self.context.seconds(batch, width, keys)
        return self._grouped_cost(batch, width, wide, keys) < padded

    def _grouped_cost(self, batch: int, width: int, wide: int, keys: int) -> float:
        base = self._grouped.get((batch, width, wide))
        if base is None:
            own = self._padded(batch, 1)
            base = max(own, own + self._padded(wide, width) - self._padded(wide, 1))
        return base + self.context.seconds(batch, width, keys, wide)

    def at_keys(self, keys: int) -> CostModel:
        """A copy that prices every context as ``keys`` keys: its samples are this one's costs there.

        ``at_keys(CALIBRATION_KEYS)`` after calibration is the model as it was before contexts were
        priced (the benchmark runs it beside the context-aware one).
        """
        flat = CostModel(
            {shape: self.cost(*shape, keys=keys) for shape in self._samples},
            alpha=self.alpha, overhead=self._overhead, grouped=self.grouped, row_step=self.row_step,
        )
        flat._overhead_seen = self._overhead_seen
        flat._grouped = {
            (b, w, k): base + self.context.seconds(b, w, keys, k) for (b, w, k), base in self._grouped.items()
        }
        return flat

    def _padded(self, batch: int, width: int) -> float:
        _check_shape(batch, width)
        exact = self._samples.get((batch, width))
        if exact is not None:
            return exact
        widths = self._widths.get(batch)
        if not widths:
            return self._fallback(batch, width)
        if len(widths) == 1:
            w0 = widths[0]
            value = self._samples[(batch, w0)] + self._w_slope(batch) * (width - w0)
        else:
            # Pick the bracketing pair, or the two outermost widths when W lies outside them.
            hi_i = next((i for i, w in enumerate(widths) if w > width), len(widths) - 1)
            hi_i = max(1, hi_i)
            w_lo, w_hi = widths[hi_i - 1], widths[hi_i]
            c_lo, c_hi = self._samples[(batch, w_lo)], self._samples[(batch, w_hi)]
            slope = (c_hi - c_lo) / (w_hi - w_lo)
            if width < w_lo:
                value = c_lo + max(slope, 0.0) * (width - w_lo)  # noise must not make a wider pass cheaper
            elif width > w_hi:  # nor make one far past the widest dearer than the fit says a row adds
                rise = min(slope, self._w_slope(batch)) if slope > 0.0 else 0.0  # a refit only if it can cap
                value = c_hi + rise * (width - w_hi)
            else:
                value = c_lo + slope * (width - w_lo)
        return max(value, MIN_SECONDS)

    def snapshot(self) -> dict[str, float]:
        """Observed padded (base) averages as ``{"BxW": seconds}``, e.g. ``{"4x8": 0.218}``."""
        return {f"{b}x{w}": s for (b, w), s in sorted(self._samples.items())}

    def grouped_snapshot(self) -> dict[str, float]:
        """Observed grouped averages as ``{"BxW/k": seconds}``, e.g. ``{"4x8/1": 0.135}``."""
        return {f"{b}x{w}/{k}": s for (b, w, k), s in sorted(self._grouped.items())}

    # -- internals -----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        widths: dict[int, list[int]] = {}
        for b, w in sorted(self._samples):
            widths.setdefault(b, []).append(w)
        self._widths = widths
        self._fitted = False  # refit when an unobserved shape asks: observe() runs every round

    def _refit(self) -> None:
        self._fitted = True
        self._coef = _fit(self._samples)
        if self._coef is None and self._samples:
            a, b, c = DEFAULT_CURVE
            ratios = [s / (a + b * bb + c * bb * ww) for (bb, ww), s in self._samples.items()]
            self._scale = sum(ratios) / len(ratios)
        else:
            self._scale = 1.0

    def _curve(self) -> tuple[float, float, float]:
        if not self._fitted:
            self._refit()
        if self._coef is not None:
            return self._coef
        a, b, c = DEFAULT_CURVE
        return (a * self._scale, b * self._scale, c * self._scale)

    def _fallback(self, batch: int, width: int) -> float:
        a, b, c = self._curve()
        value = a + b * batch + c * batch * width
        if not value > MIN_SECONDS:  # also catches NaN
            value = MIN_SECONDS
        return value

    def _w_slope(self, batch: int) -> float:
        return self._curve()[2] * batch


def _check_shape(batch: int, width: int) -> None:
    if batch < 1 or width < 1:
        raise ValueError(f"batch and width must be >= 1, got {batch}x{width}")
