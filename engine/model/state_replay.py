"""Per-stream rollback of recurrent state by replaying the kept rows through the layer's own mixer.

A round verifies up to W rows a stream; a recurrent layer (a short convolution, a gated delta net,
an SSM) folds all of them into its state, but the stream keeps only the first ``kept``. Two ways
back exist: keep a state per verified position, or replay the kept rows from the state before the
round. Lanes replays, for three reasons:

- mlx-lm's mixers compute their state in a fused scan (a Metal kernel on Macs) that returns only
  the last state; a state per position would mean rewriting each family's scan;
- the replay is mlx-lm's own mixer called again on the inputs it got in the round (by causality
  they are what a sequential pass would have fed it for the kept rows), with the ``lengths`` and
  mask of mlx-lm's batched generation, so the state stops at ``kept``; it runs only the recurrent
  layers, never the attention, MLP or output head;
- it runs only in rounds where some stream rejected a row it verified; a stream with one row, or
  one that kept all its rows, is already right (the round's own pass stops each stream's state at
  its real rows, as padding rows are masked).

``find_mixers`` locates each recurrent layer's mixer once at load: a probe pass notes which module
reads each cache. ``record`` turns each mixer into a recording subclass of its own class (the same
module and weights), which hands its call's arguments to the Lanes cache it was given, so the round
knows what to replay. ``masked_layers`` checks at load which mixers stop their state where the mask
ends: those replay every stream in one batched call; the others replay each stream that needs it
alone, on exactly its kept rows (and there a padded stream's state is replayed too, since its
padding rows entered it).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from engine.errors import ModelLoadError
from engine.model.cache_kinds import LayerKind, make_caches


@dataclass(frozen=True)
class Call:
    """A mixer's call in a round: the module and its bound arguments (its input, mask, cache)."""

    module: nn.Module
    arguments: dict[str, Any]

    def replay(self, cache: Any, mask: mx.array) -> None:
        """Call the mixer again on the same inputs with ``mask`` (rows to keep per stream); only
        the state it writes into ``cache`` is wanted."""
        args = dict(self.arguments, cache=cache, mask=mask)
        _original_call(type(self.module))(self.module, **args)

    def replay_row(self, row: int, kept: int, state: list[mx.array | None]) -> list[mx.array | None]:
        """The state after stream ``row``'s first ``kept`` rows of this call, from its ``state``
        before it: the mixer called on exactly those rows, alone (no mask needed)."""
        first = next(iter(self.arguments))  # the input comes first
        cache = ArraysCache(len(state))
        cache.cache = list(state)
        args = dict(self.arguments, cache=cache, mask=None)
        args[first] = self.arguments[first][row : row + 1, :kept]
        _original_call(type(self.module))(self.module, **args)
        return list(cache.cache)


class _Probe(ArraysCache):
    """An ``ArraysCache`` that notes the innermost module whose call reads it."""

    def __init__(self, size: int, found: dict[int, nn.Module], layer: int) -> None:
        super().__init__(size)
        self._found, self._layer = found, layer

    def __getitem__(self, idx: int) -> Any:
        if self._layer not in self._found:
            frame = sys._getframe(1)
            while frame is not None:
                me = frame.f_locals.get("self")
                if isinstance(me, nn.Module) and any(v is self for v in frame.f_locals.values()):
                    self._found[self._layer] = me
                    break
                frame = frame.f_back
        return super().__getitem__(idx)


def find_mixers(model: nn.Module, kinds: list[LayerKind]) -> dict[int, nn.Module]:
    """The module that reads each recurrent layer's cache, by the layer's index among the caches."""
    found: dict[int, nn.Module] = {}
    caches = [_Probe(k.states, found, i) if k.recurrent else c for i, (k, c) in enumerate(zip(kinds, make_caches(kinds)))]
    mx.eval(model(mx.zeros((1, 2), dtype=mx.int32), cache=caches))
    missing = [i for i, k in enumerate(kinds) if k.recurrent and i not in found]
    if missing:
        raise ModelLoadError(f"cannot find the module that updates recurrent layer {missing[0]}'s state")
    for i, m in found.items():
        params = inspect.signature(_original_call(type(m))).parameters
        if "mask" not in params or "cache" not in params:
            raise ModelLoadError(
                f"layer {i}'s {type(m).__name__} takes no mask and cache arguments, so Lanes cannot stop its "
                "state at each stream's kept rows"
            )
    return found


_RECORDING: dict[type, type] = {}


def _original_call(cls: type) -> Callable[..., Any]:
    return getattr(cls, "_lanes_original", cls).__call__


def record(mixers: dict[int, nn.Module]) -> None:
    """Make each mixer hand its calls to a Lanes cache (one with a ``record`` method) it is given."""
    for m in mixers.values():
        cls = type(m)
        if cls in _RECORDING.values():
            continue
        if cls not in _RECORDING:
            _RECORDING[cls] = type(cls.__name__, (cls,), {"__call__": _recording_call, "_lanes_original": cls})
        m.__class__ = _RECORDING[cls]


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.__call__)


def _recording_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    original = type(self)._lanes_original
    bound = _signature(original).bind(self, *args, **kwargs)
    cache = bound.arguments.get("cache")
    if hasattr(cache, "record"):
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        cache.record(Call(self, arguments))
    return original.__call__(self, *args, **kwargs)


def masked_layers(model: nn.Module, kinds: list[LayerKind]) -> set[int]:
    """The recurrent layers whose mixer stops its state where the mask and lengths end: three rows
    with the third masked leave the state two rows leave. (mlx-lm 0.32's Nemotron-H mixer does not:
    its SSM still takes in masked rows; those layers are replayed a stream at a time.)"""
    found: dict[int, Call] = {}

    class Recorder(ArraysCache):
        def __init__(self, size: int, layer: int) -> None:
            super().__init__(size)
            self.layer = layer

        def record(self, call: Call) -> None:
            found.setdefault(self.layer, call)

    caches = [Recorder(k.states, i) if k.recurrent else c for i, (k, c) in enumerate(zip(kinds, make_caches(kinds)))]
    model(mx.array([[1, 2, 3]], dtype=mx.int32), cache=caches)
    honours = set()
    for layer, call in found.items():
        size = len(caches[layer].cache)
        two = call.replay_row(0, 2, [None] * size)
        masked = ArraysCache(size)
        masked.lengths = mx.array([2])
        call.replay(masked, mx.array([[True, True, False]]))
        if all(a is not None and b is not None and mx.allclose(a, b, rtol=1e-4, atol=1e-5).item()
               for a, b in zip(two, masked.cache, strict=True)):
            honours.add(layer)
    return honours


def prepare(model: nn.Module, kinds: list[LayerKind]) -> list[LayerKind]:
    """Ready a model's recurrent layers for per-stream rollback (nothing to do without any): find
    and record their mixers; the kinds come back saying which honour a mask (``masked``)."""
    if not any(k.recurrent for k in kinds):
        return kinds
    record(find_mixers(model, kinds))
    honours = masked_layers(model, kinds)
    return [replace(k, masked=i in honours) if k.recurrent else k for i, k in enumerate(kinds)]
