"""What a longer context adds to a forward pass.

Attention is the one part of a pass whose work grows with the context: each query row scores,
weighs and sums every key its stream holds (on the CPU the softmax's exponentials are most of it).
The linear layers see only the rows. So a pass of B streams x W rows over K keys costs

    base(B, W) + K * B * (per_stream + per_row * W)

``per_stream`` is what every stream pays per key whatever its width (reading its keys and values,
the mask); ``per_row`` is what each query row adds per key. The cost model (``engine.drafts.cost_model``)
keeps ``base`` per shape and adds this term for the round's K, the longest context in the batch
(a padded pass attends every stream over that many keys). Without it, costs measured at one context
price another wrongly: a draft row at 2,000 keys costs several times what it does at 64.

The two coefficients come from timing the same shapes at two contexts (``fit``). Worked example,
with timings of one slow day on a 2-core CPU (ms), 64 and 2,000 keys:

    shape (B, W)    64 keys   2000 keys   added per stream and key (ms)
    (1, 1)          153       216         63 / 1936 / 1  = 0.0325
    (1, 16)         227       563         336 / 1936 / 1 = 0.1736
    (4, 1)          215       431         216 / 1936 / 4 = 0.0279
    (4, 8)          264       1067        803 / 1936 / 4 = 0.1037

Least squares of the last column on W (y = per_stream + per_row * W, W = 1, 16, 1, 8) gives
per_row = 0.00962 ms and per_stream = 0.0219 ms, so at 2,000 keys a 4 x 8 pass adds
2000 * 4 * (0.0219 + 0.00962 * 8) = 791 ms to its base, where at 64 keys it adds 25 ms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContextCost:
    """Seconds a pass adds per key of context: per stream, and per query row of a stream."""

    per_stream: float = 0.0
    per_row: float = 0.0

    def seconds(self, batch: int, width: int, keys: int, wide: int | None = None) -> float:
        """Attention's context term for B x W rows over ``keys`` keys.

        ``wide`` = k < B prices a grouped pass: k streams attend W rows and the others one row.

        >>> c = ContextCost(per_stream=2e-5, per_row=1e-5)
        >>> round(c.seconds(4, 8, 1000), 3)              # 1000 * 4 * (2e-5 + 8e-5)
        0.4
        >>> round(c.seconds(4, 8, 1000, wide=1), 3)      # 1000 * (3 * 3e-5 + 1 * 1e-4)
        0.19
        """
        if keys <= 0:
            return 0.0
        if wide is None or not 0 < wide < batch:
            return keys * batch * (self.per_stream + self.per_row * width)
        narrow = batch - wide
        return keys * (narrow * (self.per_stream + self.per_row) + wide * (self.per_stream + self.per_row * width))


NO_CONTEXT_COST = ContextCost()


@dataclass(frozen=True, slots=True)
class ContextSample:
    """One shape timed at two contexts (seconds)."""

    batch: int
    width: int
    short_keys: int
    short_s: float
    long_keys: int
    long_s: float


def fit(samples: Sequence[ContextSample]) -> ContextCost:
    """Least squares ``per_stream + per_row * W`` over each sample's added seconds per stream and key.

    Both coefficients are kept >= 0 (noise must never make a longer context look cheaper); samples
    with invalid timings or no added keys are skipped, and with nothing usable the answer is
    :data:`NO_CONTEXT_COST`: contexts then cost nothing extra, as before this term existed.
    """
    points = [
        (float(s.width), (s.long_s - s.short_s) / ((s.long_keys - s.short_keys) * s.batch))
        for s in samples
        if s.long_keys > s.short_keys and s.batch >= 1 and s.width >= 1
        and all(math.isfinite(t) and t > 0.0 for t in (s.short_s, s.long_s))
    ]
    if not points:
        return NO_CONTEXT_COST
    n = len(points)
    mean_w = sum(w for w, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_w = sum((w - mean_w) ** 2 for w, _ in points)
    per_row = sum((w - mean_w) * (y - mean_y) for w, y in points) / var_w if var_w > 0 else 0.0
    per_row = max(per_row, 0.0)
    per_stream = mean_y - per_row * mean_w
    if per_stream < 0.0:  # the line through the origin, slope still >= 0
        per_stream = 0.0
        per_row = max(sum(w * y for w, y in points) / sum(w * w for w, _ in points), 0.0)
    return ContextCost(per_stream=per_stream, per_row=per_row)
