"""The cache each layer of a model needs, as Lanes holds it, and the kinds it refuses.

mlx-lm's models say what they need through ``make_cache()``; Lanes keeps three kinds, each rolled
back per stream (``engine.model.lane_cache``):

- ``KVCache``: plain attention keys and values;
- ``RotatingKVCache`` (sliding-window layers: Gemma 3/4, gpt-oss, Cohere 2, ...): held whole, as a
  plain KV cache, with the window applied by the mask. A ring buffer would evict the keys of rows a
  round then rejects; a full cache never evicts, and the window mask gives the same attention (a
  query at position p attends keys p - window + 1 .. p, as mlx-lm's rotating cache does);
- ``ArraysCache`` / ``MambaCache`` (short convolutions and recurrent state: LFM2, Qwen3-Next and
  Qwen3.5's gated delta nets, Nemotron-H's and Mamba2's SSMs): a state per stream, rolled back by
  replaying the kept rows through the layer's own mixer (``engine.model.state_replay``).

Anything else (chunked, quantized or nested caches) is refused at load, naming the kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from engine.errors import ModelLoadError


@dataclass(frozen=True)
class LayerKind:
    """What one cached layer holds: attention keys and values (``window``: the sliding window, or
    None for full attention), or ``states`` arrays of recurrent state."""

    states: int = 0  # arrays of state (an ArraysCache's size); 0: keys and values
    window: int | None = None
    # A recurrent layer whose mixer stops its state where mlx-lm's mask and lengths end (checked at
    # load: engine.model.state_replay). Others are replayed a stream at a time on exactly its kept rows.
    masked: bool = True

    @property
    def recurrent(self) -> bool:
        return self.states > 0


def _template(model: nn.Module) -> list[Any]:
    if hasattr(model, "make_cache"):
        return list(model.make_cache())
    return [KVCache() for _ in model.layers]


def layer_kinds(model: nn.Module, name: str = "") -> list[LayerKind]:
    """One ``LayerKind`` per cached layer, in the order the model takes its caches; raises
    ``ModelLoadError`` naming a kind Lanes cannot roll back per stream."""
    kinds = []
    for c in _template(model):
        if type(c) is KVCache:
            kinds.append(LayerKind())
        elif type(c) is RotatingKVCache and c.keep == 0:
            kinds.append(LayerKind(window=c.max_size))
        elif isinstance(c, ArraysCache):
            kinds.append(LayerKind(states=len(c.cache)))
        else:
            what = type(c).__name__ + (" with kept sink tokens" if isinstance(c, RotatingKVCache) else "")
            family = getattr(getattr(model, "args", None), "model_type", type(model).__module__)
            raise ModelLoadError(
                f"model '{name}' ({family}) uses {what} layers, which Lanes cannot roll back per stream; "
                "it runs plain, sliding-window and recurrent (conv / SSM / gated delta) layers"
            )
    return kinds


def make_caches(kinds: list[LayerKind]) -> list[Any]:
    """Fresh single-stream caches for prefill: a sliding-window layer gets a plain ``KVCache``
    (the model's window mask still applies), a recurrent one an ``ArraysCache``."""
    return [ArraysCache(k.states) if k.recurrent else KVCache() for k in kinds]


def cache_arrays(caches: Sequence[Any]) -> list[mx.array]:
    """Every array the caches hold, to evaluate them."""
    out: list[mx.array] = []
    for c in caches:
        if isinstance(c, ArraysCache):
            out += [a for a in c.cache if a is not None]
        elif c.keys is not None:
            out += [c.keys, c.values]
    return out


def length_of(caches: Sequence[Any]) -> int | None:
    """Tokens held by prefilled caches, where a KV layer says (a recurrent layer keeps no count)."""
    return next((c.offset for c in caches if not isinstance(c, ArraysCache)), None)
