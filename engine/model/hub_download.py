"""A model downloaded from the Hugging Face Hub by name, only when the person asks (Settings):
the files an mlx-lm model needs, with progress, cancel and resume.

``huggingface_hub`` does the transfer into its own cache (where Lanes finds the model afterwards),
file by file: the files already complete are kept. A large file (a weights shard, up to 5 GB) resumes
to the byte: huggingface_hub 2.4 drops a partly transferred file (its temporary name is unique to
one attempt), so ``engine.model.hub_resume`` fetches it into a partial file of its own that outlives
a cancel, a cut connection or a restart, and hands the finished blob to ``hf_hub_download``, which
links it into the snapshot as its own. Progress comes through the ``tqdm_class`` hook, which is also
where a cancel lands (after each chunk written).
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
from engine.model import hub_resume

# What an mlx-lm model folder needs: weights, config, tokenizer and chat template files.
WANTED = ("*.safetensors", "*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt", "*.py")


class DownloadCancelled(LanesError):
    """The person stopped the download; what arrived is kept for the next one (a large file's bytes,
    a small file once whole)."""


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
    cannot be found or reached, or naming the file that arrived corrupted (then removed)."""
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
    hub_resume.discard_unlisted(repo, [name for name, _ in files])

    def stop() -> None:
        if cancelled():
            raise DownloadCancelled(f"stopped downloading '{repo}'")

    folder = None
    for name, size in files:
        stop()

        def report(done: int, name: str = name, base: int = before) -> None:
            on_progress(Progress(base + done, total, name))

        blob = None
        if size >= hub_resume.RESUMABLE_MIN:  # cancel is seen by the partial file, after a chunk is kept
            blob = hub_resume.fetch(repo, name, endpoint=endpoint, tqdm_class=_bar(report, lambda: False), check=stop)
        pointer = Path(hf_hub_download(repo, name, endpoint=endpoint, tqdm_class=_bar(report, cancelled)))
        hub_resume.settle(blob, pointer)
        folder = pointer.parent  # main, as Lanes looks it up
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
            if self.bytes:
                report(self.bytes)  # the bytes already on disk count at once

        def update(self, n: float | None = 1) -> bool | None:
            self.bytes += int(n or 0)
            report(self.bytes)
            if cancelled():
                raise DownloadCancelled("stopped")
            return super().update(n)

    return Bar
