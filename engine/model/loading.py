"""Finding and loading a model: the embedded GGUF default, a local folder, or a
Hugging Face cache entry (never the network)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper

from engine.errors import ModelLoadError
from engine.model import openblas, state_replay
from engine.model.cache_kinds import LayerKind, layer_kinds
from engine.model.families import Family, family_for
from engine.model.gguf import gguf_tokenizer, load_gguf
from engine.model.locate import EMBEDDED, locate_model
from engine.model.machine import return_freed_buffers
from engine.model.round_check import check_rounds
from engine.passes.choice import RoundPasses, choose

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: TokenizerWrapper
    family: Family
    name: str  # what the user asked for, resolved
    path: Path
    context_length: int
    device: str  # "cpu" or "gpu"
    kinds: tuple[LayerKind, ...]  # what each cached layer holds (engine.model.cache_kinds)
    passes: RoundPasses  # how its rounds are computed (engine.passes.choice)
    warnings: tuple[str, ...] = ()

    @property
    def n_layers(self) -> int:
        """Cached layers: what the model's forward takes one cache each for."""
        return len(self.kinds)

    @property
    def recurrent(self) -> bool:
        return any(k.recurrent for k in self.kinds)


def on_gpu() -> bool:
    return mx.default_device() == mx.gpu


def device_kind() -> str:
    """The kind of device the model runs on: "cpu", or the GPU's backend, "metal" or "cuda"."""
    if not on_gpu():
        return "cpu"
    return "metal" if mx.metal.is_available() else "cuda"


def load_model(spec: str | None = None) -> LoadedModel:
    """Load ``spec``: None/"embedded", a .gguf file, a local mlx-lm folder, or a
    Hugging Face repo id already in the local cache. Raises ModelLoadError naming
    what was looked for."""
    warnings: list[str] = []
    slow = openblas.slow_path_warning() if not on_gpu() else None
    if slow:
        log.warning(slow)
        warnings.append(slow)
    spec = spec or EMBEDDED
    path = locate_model(spec)
    return_freed_buffers()
    if path.suffix == ".gguf":
        model, meta, ctx = load_gguf(path, quantized=on_gpu())
        tokenizer = gguf_tokenizer(meta, path)
        name = "SmolLM2-135M-Instruct" if spec == EMBEDDED else path.stem
        family = family_for(f"{name} {meta.get('general.basename', '')}", "llama", device_kind())
    else:
        model, tokenizer, ctx = _load_mlx_lm(path)
        name = spec
        family = family_for(spec, getattr(getattr(model, "args", None), "model_type", ""), device_kind())
    device = "gpu" if on_gpu() else "cpu"
    kinds = state_replay.prepare(model, layer_kinds(model, name))
    check_rounds(model, kinds, name)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        family=family,
        name=name,
        path=path,
        context_length=ctx,
        device=device,
        kinds=tuple(kinds),
        passes=choose(model, device, kinds),
        warnings=tuple(warnings),
    )


def _load_mlx_lm(path: Path) -> tuple[nn.Module, TokenizerWrapper, int]:
    import json

    from mlx_lm import load

    try:
        model, tokenizer = load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot load model at {path}: {exc}") from exc
    if not on_gpu():
        from mlx_lm.utils import dequantize_model

        model = dequantize_model(model)
        model.set_dtype(mx.float32)
    config = json.loads((path / "config.json").read_text())
    ctx = int(config.get("max_position_embeddings") or config.get("max_seq_len") or 4096)
    return model, tokenizer, ctx
