"""A padded round's pass through ``mx.compile``: mlx-lm's model over fixed-shape lanes.

On an accelerator a decode step of a small model is bound by the host: the Python that builds
its graph (every layer's modules, called again each round) and the dispatch of its kernels cost
more than the device's work. ``mx.compile`` traces ``model(tokens, cache=lanes.views)`` once per
shape and replays the recorded graph afterwards, without the Python, fusing chains of
element-wise operations on the way.

A replay sees only its inputs, so nothing that changes between rounds of one shape may reach the
graph as a Python number: the lanes run with ``fixed`` shapes (``LaneCache.place``), where each
stream's length is an input array, every stream attends the whole capacity under a mask and
writes its keys by one scatter. Only draft-free rounds (one row per stream) are compiled: they are
most rounds and the ones run ahead, and their shapes are few (the batch and the capacity, which
grows 256 positions at a time), so a trace is rare; a drafting round's width changes from round to
round, and tracing each new one would cost more than it saves.

Example: 4 streams of lengths [300, 293, 286, 279] in buffers of capacity 512 run a round of
width 1. The first such round traces the model; the next one, at [301, 294, 287, 280], replays
the same graph with the new lengths as its input, and so on until a stream reaches 511 and the
buffers grow to 768, which traces once more.

A lone stream is not compiled: its uncompiled graph (a number offset, no mask, its own keys, as
in mlx-lm's cache) has fewer kernels than the masked one, and ran faster on an H200.
Recurrent layers keep Python state (``StateView``) and are not compiled.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.model.lane_cache import LaneCache


class CompiledPass:
    """``model(tokens, cache=lanes.views)``, compiled where the lanes' shapes are fixed; call after
    ``lanes.begin_round(width)``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._lanes: LaneCache | None = None
        self._compiled = mx.compile(self._traced)

    def __call__(self, lanes: LaneCache, tokens: mx.array) -> mx.array:
        if not lanes.fixed:  # a lone stream or a drafting round (see the module docstring)
            return self.model(tokens, cache=lanes.views)
        assert not lanes.recurrent
        self._lanes = lanes
        n = lanes.n_layers
        offsets = lanes.offsets
        try:
            logits, *buffers = self._compiled(tokens, offsets, *lanes.keys, *lanes.values)
        finally:
            self._lanes = None
            lanes.place(offsets)  # a trace left its own arrays there
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
