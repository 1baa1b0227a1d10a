"""Proof at load that a model's layers take Lanes' rounds: two streams at different lengths in one
pass get the logits each gets alone.

A round gives every stream its own rotary offset and mask through the cache protocol. Most of
mlx-lm's layers take that as they are; a few do not (``DynamicNTKScalingRoPE`` sizes its table from
the offset, so an offset per stream raises). Found here, at load, such a model is refused with the
reason, instead of failing the first time two streams share a round.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine.errors import ModelLoadError
from engine.model.cache_kinds import LayerKind, cache_arrays, make_caches
from engine.model.lane_cache import LaneCache

PROMPTS = ((3, 4, 5, 6, 7), (8, 9, 10))  # two streams of different lengths
NEXT = ((11, 12), (13, 14))  # the round's two rows each


def check_rounds(model: nn.Module, kinds: list[LayerKind], name: str) -> None:
    """Run one two-stream round of two rows each against each stream alone; raise ``ModelLoadError``
    naming the model and what failed when they differ or the round raises."""
    lanes = LaneCache(kinds)
    alone = []
    for prompt, rows in zip(PROMPTS, NEXT, strict=True):
        caches = make_caches(kinds)
        model(mx.array([prompt]), cache=caches)
        mx.eval(cache_arrays(caches))
        lanes.add(caches, len(prompt))
        solo = make_caches(kinds)
        alone.append(model(mx.array([[*prompt, *rows]]), cache=solo)[0, len(prompt) :])
    try:
        lanes.begin_round(2)
        together = model(mx.array(NEXT), cache=lanes.views)
        mx.eval(together)
    except Exception as exc:
        ropes = sorted({type(m).__name__ for _, m in model.named_modules() if "rope" in type(m).__name__.lower()})
        raise ModelLoadError(
            f"model '{name}' cannot run several replies in one pass ({type(exc).__name__}: {exc}); its "
            f"positional encoding ({', '.join(ropes) or 'unknown'}) takes no position per reply"
        ) from exc
    for i, solo in enumerate(alone):
        scale = max(1.0, mx.abs(solo).max().item())
        if not mx.allclose(together[i].astype(mx.float32), solo.astype(mx.float32), atol=0.05 * scale).item():
            raise ModelLoadError(
                f"model '{name}': a reply's logits in a shared pass differ from its logits alone, so Lanes "
                "cannot run it (its layers ignore the per-reply positions or masks Lanes gives them)"
            )
