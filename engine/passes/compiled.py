"""A padded round's pass through ``mx.compile``: mlx-lm's model over fixed-shape lanes.

On an accelerator a decode step of a small model is bound by the host: the Python that builds
its graph (every layer's modules, called again each round) and the dispatch of its kernels cost
more than the device's work. ``mx.compile`` traces ``model(tokens, cache=lanes.views)`` once per
shape and replays the recorded graph afterwards, without the Python, fusing chains of
element-wise operations on the way.

A replay sees only its inputs, so nothing that changes between rounds of one shape may reach the
graph as a Python number: the lanes run with ``fixed`` shapes (``LaneCache.place``), where each
stream's length is an input array, every stream attends the whole capacity under a mask and
writes its keys by one scatter. Draft-free rounds (one row per stream) are compiled: they are
most rounds and the ones run ahead, and their shapes are few (the batch and the capacity, which
grows 256 positions at a time), so a trace is rare. So are rounds queued ahead with copies'
continuations (``engine.rounds.run_ahead``), most of a copy-heavy reply's rounds, their width
padded to a multiple of 8 rows (``RoundPasses.continued_width``), and the drafting rounds the
allocator plans, padded alike (``RoundPasses.draft_step``; ``LaneCache.begin_round(fixed=True)``):
their width changes from round to round, so each planned width would be a trace of its own, but
padded they share the continued rounds' few (the cost model prices a width as its padded one).
Padding them to powers of two was tried before Lanes' attention kernel and lost (docs/engine.md,
item 8); the cell setting ``compile_drafts=false`` runs them uncompiled at their planned width.

Example: 4 streams of lengths [300, 293, 286, 279] in buffers of capacity 512 run a round of
width 1. The first such round traces the model; the next one, at [301, 294, 287, 280], replays
the same graph with the new lengths as its input, and so on until a stream reaches 511 and the
buffers grow to 768, which traces once more.

A lone stream's draft-free round is compiled only where its attention is one kernel masked or not
(CUDA's lanes attention, ``engine.model.lane_attention``; ``RoundPasses.compile_alone``): elsewhere
its uncompiled graph (a number offset, no mask, its own keys, as in mlx-lm's cache) has fewer
kernels than the masked one, and ran faster on an H200. Its continued rounds are masked anyway
(their offsets are on the device), so they are compiled.
Recurrent layers keep Python state (``StateView``) and are not compiled. A model whose layers cannot
be traced (one that reads an array's value in its forward pass) runs uncompiled from its first
failed trace on, with a warning in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.model.lane_cache import LaneCache

log = logging.getLogger(__name__)


class CompiledPass:
    """``model(tokens, cache=lanes.views)``, compiled where the lanes' shapes are fixed; call after
    ``lanes.begin_round(width)``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.failed: str | None = None  # why tracing this model failed: its rounds then run uncompiled
        self._lanes: LaneCache | None = None
        # A trace is replayed whatever the lanes' ``fused`` attention says: one compiled function each.
        self._compiled = {fused: mx.compile(self._traced) for fused in (False, True)}

    def __call__(self, lanes: LaneCache, tokens: mx.array) -> mx.array:
        if not lanes.fixed or self.failed:  # a planned drafting round, or a lone stream (module docstring)
            return self.model(tokens, cache=lanes.views)
        assert not lanes.recurrent
        self._lanes = lanes
        n = lanes.n_layers
        offsets, keys, values = lanes.offsets, lanes.keys, lanes.values
        try:
            logits, *buffers = self._compiled[lanes.fused](tokens, offsets, *keys, *values)
        except Exception as exc:  # e.g. a layer that reads an array's value while it is traced
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("the model's rounds cannot be compiled (%s); they run uncompiled", self.failed)
            lanes.keys, lanes.values = keys, values
        finally:
            self._lanes = None
            lanes.place(offsets)  # a trace left its own arrays there
        if self.failed:
            return self.model(tokens, cache=lanes.views)
        lanes.keys, lanes.values = list(buffers[:n]), list(buffers[n:])
        return logits

    def _traced(self, tokens: mx.array, offsets: mx.array, *buffers: Any) -> list[mx.array]:
        lanes = self._lanes
        assert lanes is not None
        n = lanes.n_layers
        lanes.keys, lanes.values = list(buffers[:n]), list(buffers[n:])
        lanes.place(offsets)
        logits = self.model(tokens, cache=lanes.views)
        return [logits, *lanes.keys, *lanes.values]
