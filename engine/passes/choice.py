"""Which passes a model's rounds use, chosen once when the model is loaded.

Every model runs the *generic* pass: its own mlx-lm forward over the lanes' cache views
(``model(tokens, cache=lanes.views)``), padded to the round's widest stream, with a joining
prompt prefilled after the round. mlx-lm's llama on the CPU gets faster passes of the same
arithmetic, each tested equal to the generic one (tests/test_forward.py, tests/test_hostpass.py,
tests/test_fidelity.py) and measured against it side by side in ``make bench-families``
(a cell ``on:generic_pass=true``; docs/benchmarks.md):

- grouped passes (``engine.passes.grouped``): streams that draft and streams that do not are
  attended apart, and a joining prompt's chunk rides in the round's pass;
- softmax and SiLU on numpy (``engine.passes.numpy_ops``) and a rotary table made once a pass
  (``engine.passes.rope_table``), where MLX's CPU kernels are slow;
- rounds without a chunk computed by numpy itself (``engine.passes.numpy_pass``).

On an accelerator (a GPU: CUDA, Metal) a pass takes a few milliseconds and the host's work per round
is as dear, so the generic pass there runs every draft-free round's successor ahead, before knowing
whether it will draft (``speculate_ahead``; ``engine.rounds.run_ahead``): the device computes while
the host verifies, and the allocator prices dropping that pass against keeping it. On the CPU the
dropped pass would be compute taken from the next one, so the CPU runs ahead only when no stream can
draft next round. On an accelerator the model's graph is also compiled for draft-free rounds of
several streams, for rounds queued with copies' continuations and for drafting rounds, the last
two padded to a multiple of ``CONTINUED_STEP`` rows (``engine.passes.compiled``), unless a layer is
recurrent. On CUDA a round's masked attention runs as one kernel reading each stream's length
(``engine.model.lane_attention``).

Nothing else chooses: the scheduler reads ``LoadedModel.passes``; a test or a benchmark that wants
another choice loads the model with it (``dataclasses.replace(loaded, passes=GENERIC)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.model import lane_attention
from engine.model.cache_kinds import LayerKind, cache_arrays
from engine.model.lane_cache import LaneCache
from engine.passes.compiled import CompiledPass
from engine.passes.grouped import ROW_MULTIPLE, Chunk, supports_grouped
from engine.passes.grouped import prefill as grouped_prefill
from engine.passes.numpy_pass import HostPass, supports_host
from engine.passes.padded import padded_logits, supports_padded

CONTINUED_STEP = 8  # compiled continued and drafting rounds are a multiple of this many rows wide


@dataclass(frozen=True)
class RoundPasses:
    name: str
    grouped: bool = False  # grouped passes; a joining prompt's chunk rides in the round's pass
    numpy_ops: bool = False  # softmax and SiLU on numpy: then every pass of several rows runs grouped
    rope_table: bool = False  # rotary cosines and sines made once a pass
    numpy_pass: HostPass | None = None  # rounds without a chunk computed by numpy
    row_multiple: int = 1  # flattened rows of a grouped pass padded to a multiple of this
    speculate_ahead: bool = False  # run a draft-free round's successor ahead even if it may draft
    compiled: CompiledPass | None = None  # padded passes compiled, over lanes of fixed shapes
    fused_attention: bool = False  # masked attention as one kernel (engine.model.lane_attention: CUDA)
    compile_alone: bool = False  # a lone stream's draft-free rounds compiled too (with fused attention)
    compile_drafts: bool = False  # drafting rounds compiled too, padded to a multiple of CONTINUED_STEP rows
    round_costs: bool = False  # calibrated as rounds run (engine.rounds.calibration): where they run ahead

    @property
    def compiled_draws(self) -> bool:
        """Sampled rows drawn through ``mx.compile`` (``engine.rounds.sampling``): an accelerator's
        passes, the ones that speculate ahead."""
        return self.speculate_ahead

    def lanes(self, kinds: Sequence[LayerKind]) -> LaneCache:
        """Empty lanes for these passes (of fixed shapes where the padded pass is compiled)."""
        return LaneCache(list(kinds), fixed=self.compiled is not None, fused=self.fused_attention,
                         fixed_alone=self.compile_alone)

    def continued_width(self, width: int) -> int:
        """The width of a round queued with copies' continuations (``engine.rounds.run_ahead``): where
        it runs compiled, ``width`` rounded up to a multiple of ``CONTINUED_STEP``, so that few
        widths are traced (each width at each capacity is one trace); the padding rows are never read."""
        return width if self.compiled is None else padded_width(width)

    @property
    def draft_step(self) -> int:
        """Rows a drafting round's width is rounded up to a multiple of (1: run as planned). Where it
        runs compiled, every width is a trace at each capacity, so widths are padded like continued
        rounds' (and share their traces); the cost model prices a width as its padded one."""
        return CONTINUED_STEP if self.compiled is not None and self.compile_drafts else 1

    def prefill(self, model: nn.Module, tokens: Sequence[int], caches: Sequence[Any]) -> None:
        """Append ``tokens`` to one stream's ``caches``: the transformer body only (prefill needs
        keys, values and states, not logits; the vocabulary projection is a fifth of the embedded
        model's compute)."""
        if self.numpy_ops:
            grouped_prefill(model, Chunk(tokens, caches), self.row_multiple, True, self.rope_table)
            return
        body_of(model)(mx.array(list(tokens))[None], cache=list(caches))
        mx.eval(cache_arrays(caches))

    def padded(self, model: nn.Module, lanes: LaneCache, tokens: mx.array) -> mx.array:
        """A padded pass's logits (after ``lanes.begin_round``): mlx-lm's model, or its arithmetic with
        the rotary table made once (``engine.passes.padded``), or compiled (``engine.passes.compiled``)."""
        if self.compiled is not None:
            return self.compiled(lanes, tokens)
        if self.rope_table:
            return padded_logits(model, lanes, tokens)
        return model(tokens, cache=lanes.views)


def padded_width(width: int, step: int = CONTINUED_STEP) -> int:
    """``width`` rounded up to a multiple of ``step``.

    >>> padded_width(2), padded_width(8), padded_width(13), padded_width(33)
    (8, 8, 16, 40)
    """
    return -(-width // step) * step


GENERIC = RoundPasses("generic")
ACCELERATOR = RoundPasses("generic-ahead", speculate_ahead=True, round_costs=True)


def llama_cpu(model: nn.Module) -> RoundPasses:
    """mlx-lm's llama on the CPU: every faster pass that knows the model."""
    return RoundPasses("llama-cpu", grouped=True, numpy_ops=True, rope_table=supports_padded(model),
                       numpy_pass=HostPass(model) if supports_host(model) else None, row_multiple=ROW_MULTIPLE)


def accelerator(model: nn.Module, kinds: Sequence[LayerKind]) -> RoundPasses:
    """An accelerator's passes: run ahead, and compiled, drafting rounds too, unless a layer is
    recurrent (its state is Python's: ``engine.passes.compiled``); on CUDA, masked attention as one
    kernel, and then a lone stream's rounds compiled too (its masked graph no longer has more
    kernels than mlx-lm's)."""
    fused = lane_attention.available()
    if fused:
        lane_attention.install()
    if any(k.recurrent for k in kinds):
        return replace(ACCELERATOR, fused_attention=fused)
    return RoundPasses("compiled-ahead", speculate_ahead=True, compiled=CompiledPass(model), fused_attention=fused,
                       compile_alone=fused, compile_drafts=True, round_costs=True)


def choose(model: nn.Module, device: str, kinds: Sequence[LayerKind]) -> RoundPasses:
    """The passes for ``model`` (whose cached layers are ``kinds``) on ``device`` ("cpu" or "gpu")."""
    if device != "cpu":
        return accelerator(model, kinds)
    return llama_cpu(model) if supports_grouped(model) else GENERIC


def body_of(model: nn.Module) -> nn.Module:
    """The model without its output head, where mlx-lm names it (prefill needs no logits)."""
    for name in ("model", "backbone"):
        inner = getattr(model, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return model
