"""A model downloaded from the Hugging Face Hub by name, only when the person asks (Settings):
the files an mlx-lm model needs, with progress, cancel and resume.

``huggingface_hub`` does the transfer into its own cache (where Lanes finds the model afterwards),
file by file, so a download that was stopped resumes at the file it was in: the files already
complete are kept (a large model's weights come in shards of up to 5 GB). huggingface_hub 2.4 drops
a partly transferred file (its temporary name is unique to one attempt), so that one file starts
over. Progress comes through its ``tqdm_class`` hook, which is also where a cancel lands (between
chunks of a file).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from engine.errors import LanesError

# What an mlx-lm model folder needs: weights, config, tokenizer and chat template files.
WANTED = ("*.safetensors", "*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt", "*.py")


class DownloadCancelled(LanesError):
    """The person stopped the download; the files that arrived whole are kept for the next one."""


@dataclass(frozen=True)
class Progress:
    done: int  # bytes of all wanted files on disk so far
    total: int
    file: str  # the file arriving now


def wanted(name: str) -> bool:
    return "/" not in name and any(fnmatch.fnmatch(name, p) for p in WANTED)


def download(repo: str, on_progress: Callable[[Progress], None], cancelled: Callable[[], bool],
             endpoint: str | None = None) -> Path:
    """Download ``repo``'s model files into the Hugging Face cache (from ``endpoint``, else
    ``$HF_ENDPOINT``, else the Hub); returns its snapshot folder.
    Raises DownloadCancelled when ``cancelled()`` turns true, a LanesError naming the repo when it
    cannot be found or reached."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # a mirror, read now (huggingface_hub reads it once)

    try:
        info = HfApi(endpoint=endpoint).model_info(repo, files_metadata=True)
    except RepositoryNotFoundError:
        raise LanesError(f"no model '{repo}' on the Hugging Face Hub (or it is private)") from None
    except (HfHubHTTPError, OSError) as exc:
        raise LanesError(f"could not reach the Hugging Face Hub for '{repo}': {exc}") from None
    files = [(s.rfilename, s.size or 0) for s in info.siblings or () if wanted(s.rfilename)]
    if not any(name.endswith(".safetensors") for name, _ in files):
        raise LanesError(f"'{repo}' has no .safetensors weights: it is not a model MLX can load")
    total, before = sum(size for _, size in files), 0
    folder = None
    for name, size in files:
        if cancelled():
            raise DownloadCancelled(f"stopped downloading '{repo}'")
        bar = _bar(lambda done, name=name, base=before: on_progress(Progress(base + done, total, name)), cancelled)
        folder = Path(hf_hub_download(repo, name, endpoint=endpoint, tqdm_class=bar)).parent  # main, as Lanes looks it up
        before += size
        on_progress(Progress(before, total, name))
    assert folder is not None
    return folder


def _bar(report: Callable[[int], None], cancelled: Callable[[], bool]) -> type[tqdm]:
    """A progress bar class that shows nothing, reports the bytes of its file so far, and stops the
    transfer (raising between chunks) once ``cancelled()``."""

    class Bar(tqdm):  # type: ignore[type-arg]
        monitor_interval = 0  # no monitor thread: nothing is drawn

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.bytes = int(kwargs.get("initial") or 0)  # a resumed file starts where it stopped
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            self.bytes += int(n or 0)
            report(self.bytes)
            if cancelled():
                raise DownloadCancelled("stopped")
            return super().update(n)

    return Bar
