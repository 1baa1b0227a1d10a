"""How much a model may hold at once on this machine: streams, KV memory and the conversation cache.

Pure: the machine's memory and the model's sizes come in as numbers, so the limits can be checked on
literal data. A stream reserves the KV memory of its whole reply when it is admitted (prompt plus
``max_tokens`` positions, and as many as the longest running reply's: the lanes keep every row that
long), so a reply that started never runs out half way: a request that does not fit now waits (the
engine tells it why), and one that could never fit is refused at once, naming the limit.

Worked example: a 24 GiB machine, a model of 0.1 GiB weights, 61,440 bytes of KV a token (30 layers
x 2 x 3 heads x 64 x 4 bytes, SmolLM2-135M in float32). Lanes takes at most 60% of memory (14.4 GiB);
less the weights, 14.3 GiB are left: 75% for the running streams' KV (10.7 GiB, ~187,000 tokens,
e.g. 16 streams of 11,700) and 10% (1.4 GiB) for the caches of finished turns; the rest is headroom
for a pass's activations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.errors import MemoryLimitError
from engine.model.cache_kinds import LayerKind, make_caches

MAX_STREAMS = 16  # streams decoding at once: the widest the engine's rounds are measured at
MEMORY_SHARE = 0.6  # of the machine's memory, for the weights, every KV cache and the turn cache
KV_SHARE = 0.75  # of what is left after the weights: the running streams' KV
TURN_CACHE_SHARE = 0.10  # of what is left: finished turns' KV (the rest is headroom: activations, buffers)
MIN_CONVERSATION_CACHE = 64 * 2**20


@dataclass(frozen=True)
class MemoryLimits:
    max_streams: int  # streams running or prefilling at once
    kv_bytes: int  # KV memory all of those may reserve together
    conversation_cache_bytes: int  # KV of finished turns kept for the next turn
    kv_bytes_per_token: int

    @property
    def kv_tokens(self) -> int:
        return self.kv_bytes // max(1, self.kv_bytes_per_token)


def machine_memory() -> int:
    """Physical memory in bytes (Linux and macOS)."""
    return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))


def limits_for(total_memory: int, weight_bytes: int, kv_bytes_per_token: int,
               max_streams: int = MAX_STREAMS, budget: int | None = None) -> MemoryLimits:
    """The limits for a model of ``weight_bytes`` on a machine of ``total_memory`` (module docstring),
    or within ``budget`` bytes in all where one is given (``lanes serve --memory-limit``): a budget
    the weights alone fill raises MemoryLimitError naming both."""
    if budget is not None and budget <= weight_bytes:
        raise MemoryLimitError(f"the model's weights take {mib(weight_bytes)}, more than the memory limit of "
                               f"{mib(budget)}: allow more memory")
    left = max(0, (int(total_memory * MEMORY_SHARE) if budget is None else budget) - weight_bytes)
    return MemoryLimits(
        max_streams=max_streams,
        kv_bytes=int(left * KV_SHARE),
        conversation_cache_bytes=max(MIN_CONVERSATION_CACHE, int(left * TURN_CACHE_SHARE)),
        kv_bytes_per_token=kv_bytes_per_token,
    )


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters as loaded (quantized weights count as stored)."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def kv_bytes_per_token(model: nn.Module, kinds: list[LayerKind]) -> int:
    """Bytes one position of context takes in every layer's KV cache (sliding-window layers are held
    whole: engine.model.cache_kinds): measured on a one-token pass (mlx-lm's caches grow in steps, so the
    bytes are divided by the positions allocated). Recurrent states do not grow with context."""
    caches = make_caches(kinds)
    model(mx.zeros((1, 1), dtype=mx.int32), cache=caches)
    total = 0
    for c in caches:
        keys = getattr(c, "keys", None)
        if keys is not None:
            total += (keys.nbytes + c.values.nbytes) // keys.shape[2]
    return max(1, total)
