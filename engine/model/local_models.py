"""The models already on this machine, for Settings' list: the embedded one and every model in the
Hugging Face cache (``huggingface_hub.scan_cache_dir``), with its size, its family (``model_type``)
and whether Lanes can run it, checked from its files without loading anything (no MLX here).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from engine.model.locate import EMBEDDED, embedded_model_path


@dataclass(frozen=True)
class LocalModel:
    spec: str  # what Settings saves: "embedded" or the repo id
    size: int  # bytes on disk
    family: str  # the config's model_type ("llama" for the embedded GGUF); "" when unknown
    supported: bool
    why: str = ""  # why not, when it is not


def _mlx_lm_modules() -> Path | None:
    spec = importlib.util.find_spec("mlx_lm")  # found, not imported
    return Path(next(iter(spec.submodule_search_locations))) / "models" if spec and spec.submodule_search_locations else None


def support(folder: Path) -> tuple[str, bool, str]:
    """(family, supported, why not) of an mlx-lm model folder, from its files."""
    config = folder / "config.json"
    if not config.is_file():
        return "", False, "no config.json: not an mlx-lm model"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return "", False, "its config.json cannot be read"
    if not isinstance(model_type, str) or not model_type:
        return "", False, "its config.json names no model_type"
    if not any(p.suffix == ".safetensors" for p in folder.iterdir()):
        return model_type, False, "no .safetensors weights (not converted for MLX)"
    modules = _mlx_lm_modules()
    if modules is not None and not (modules / f"{model_type}.py").is_file():
        return model_type, False, f"mlx-lm has no '{model_type}' architecture"
    return model_type, True, ""


def local_models() -> list[LocalModel]:
    """The embedded model first, then the cache's models by name (the newest revision of each)."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    embedded = embedded_model_path()
    out = [LocalModel(EMBEDDED, embedded.stat().st_size, "llama", True)]
    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except (CacheNotFound, OSError):
        return out
    for repo in sorted(cache.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        family, ok, why = support(Path(newest.snapshot_path))
        out.append(LocalModel(repo.repo_id, repo.size_on_disk, family, ok, why))
    return out
