"""The models already on this machine, for Settings' list: the embedded one, every model in the
Hugging Face cache (``huggingface_hub.scan_cache_dir``), and the mlx-lm folders and ``.gguf`` files in
local model folders (``$LANES_MODELS_DIR``, LM Studio's, the one chosen before), each with its size,
its family (``model_type``, or a GGUF's architecture) and whether Lanes can run it, checked from its
files without loading anything (no MLX here).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.model import gguf_header
from engine.model.locate import EMBEDDED, embedded_model_path

MODELS_DIR_ENV = "LANES_MODELS_DIR"  # folders of models, os.pathsep-separated
# Where LM Studio keeps the models it downloads (publisher/model/...), new and old locations.
LM_STUDIO_DIRS = (Path("~/.lmstudio/models"), Path("~/.cache/lm-studio/models"))
SEARCH_DEPTH = 3  # folder levels searched below a models folder (LM Studio: publisher/model)


@dataclass(frozen=True)
class LocalModel:
    spec: str  # what Settings saves: "embedded", the repo id, or a local folder's or file's path
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


def gguf_support(path: Path) -> tuple[str, bool, str]:
    """(architecture, supported, why not) of a ``.gguf`` file, from its header."""
    arch = gguf_header.architecture(path)
    if arch is None:
        return "", False, "not a GGUF file Lanes can read"
    if arch not in gguf_header.SUPPORTED_ARCHITECTURES:
        return arch, False, f"Lanes loads GGUF files of {', '.join(gguf_header.SUPPORTED_ARCHITECTURES)} only"
    return arch, True, ""


def model_folders() -> list[Path]:
    """Folders searched for local models: ``$LANES_MODELS_DIR``'s, then LM Studio's, those that exist."""
    named = [Path(p) for p in os.environ.get(MODELS_DIR_ENV, "").split(os.pathsep) if p]
    return [p for p in (*named, *(d.expanduser() for d in LM_STUDIO_DIRS)) if p.is_dir()]


def _models_in(path: Path, depth: int = SEARCH_DEPTH) -> Iterator[Path]:
    """Model folders (a config.json) and ``.gguf`` files at or below ``path``, by name."""
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            yield path
        return
    if (path / "config.json").is_file():
        yield path
        return
    if depth > 0:
        try:
            children = sorted(path.iterdir(), key=lambda p: p.name.lower())
        except OSError:
            return
        for child in children:
            if not child.name.startswith("."):
                yield from _models_in(child, depth - 1)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _hub_models() -> list[LocalModel]:
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except (CacheNotFound, OSError):
        return []
    out = []
    for repo in sorted(cache.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        family, ok, why = support(Path(newest.snapshot_path))
        out.append(LocalModel(repo.repo_id, repo.size_on_disk, family, ok, why))
    return out


def local_models(extra: Sequence[Path] = ()) -> list[LocalModel]:
    """The embedded model first, then the cache's models by name (the newest revision of each), then
    the models in ``extra`` (a folder or file chosen before) and in ``model_folders()``, by path."""
    embedded = embedded_model_path()
    out = [LocalModel(EMBEDDED, embedded.stat().st_size, "llama", True), *_hub_models()]
    seen: set[Path] = set()
    for root in (*extra, *model_folders()):
        for path in _models_in(Path(root).expanduser()):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            family, ok, why = gguf_support(path) if path.is_file() else support(path)
            out.append(LocalModel(str(path), _size(path), family, ok, why))
    return out
