"""Prompt chunks of several joining streams prefilled in one pass.

A prefill pass of one short prompt costs an accelerator about what a pass of several does: the
device waits on the kernels it is given, not on rows. So streams that join together (chats sent at
once, a server's burst of requests) are prefilled together, as mlx-lm's ``batch_generate``
prefills its prompts: each stream's next chunk, right-padded to the longest, in one pass of the
model's body over lanes of their own (``LaneCache``, the interface every cache kind shares: its
mask hides the padding, and a recurrent layer's state stops at each stream's real rows). The
joining streams' own caches are only read: the pass's results come back as new caches, so a pass
that raises leaves every stream as it was.

``packed`` decides which join a pass: the first joining stream and as many others, shortest chunks
first, as fit a budget of padded positions (streams x the longest chunk; the scheduler's
``prefill_pass``: four chunks' on a GPU, one chunk's on the CPU, where attention pays per padded position).
A stream that already holds more positions than that prefills alone (``engine.rounds.joins``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.model.cache_kinds import LayerKind
from engine.model.lane_cache import LaneCache


def packed(chunks: Sequence[int], budget: int) -> list[int]:
    """Which joining streams one pass prefills, given each one's next chunk (``chunks``: tokens, in
    joining order) and ``budget`` padded positions (streams x the longest chunk): the first, so every
    stream's turn comes, then the others shortest first while they fit.

    Worked example, budget 512: chunks [120, 60, 200, 40] take the first (1 x 120), then 40
    (2 x 120 = 240) and 60 (3 x 120 = 360); 200 would make 4 x 200 = 800 > 512, so [0, 1, 3] join
    this pass and the third waits its turn.
    """
    if not chunks:
        return []
    chosen, width = [0], chunks[0]
    for i in sorted(range(1, len(chunks)), key=lambda i: chunks[i]):
        wider = max(width, chunks[i])
        if (len(chosen) + 1) * wider > budget:
            break  # the rest are longer still
        chosen.append(i)
        width = wider
    return sorted(chosen)


def prefill_together(body: nn.Module, kinds: Sequence[LayerKind], streams: Sequence[tuple[Sequence[Any], int]],
                     chunks: Sequence[Sequence[int]]) -> list[list[Any]]:
    """Each stream's caches after its chunk: ``streams`` are (caches, tokens they hold) and
    ``chunks`` the tokens each appends; ``body`` is the model without its output head (a prefill
    needs no logits). Returns new mlx-lm caches, one list per stream; the given ones are unchanged."""
    lanes = LaneCache(list(kinds))
    for caches, held in streams:
        lanes.add(caches, held)
    sizes = [len(c) for c in chunks]
    width = max(sizes)
    lanes.begin_round(width, sizes)
    rows = [list(c) + [c[-1]] * (width - len(c)) for c in chunks]  # padding: masked out, never kept
    body(mx.array(rows, dtype=mx.int32), cache=lanes.views)
    for row, n in enumerate(sizes):
        lanes.advance(row, n)
    lanes.settle()
    lanes.end_round()
    return [lanes.extract(row) for row in range(len(streams))]
