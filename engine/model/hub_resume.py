"""Byte-level resume for the large files of a Hub download (``engine.model.hub_download``).

huggingface_hub 2.4 writes each file to a temporary name unique to one attempt and deletes it when
that attempt fails or is cancelled, so a 4 GB shard stopped at 3.9 GB would start over from 0. A
large file is therefore fetched here, into ``blobs/<etag>.lanes-<key>.incomplete`` in the repo's
cache folder (``key`` from the file's name), appending from ``Range: bytes=<kept>-`` with
huggingface_hub's own ``http_get`` (its headers, token, redirects and retries), under the lock
huggingface_hub takes for that blob. Once whole and verified (its size, and its sha256 where the etag
is one, as for LFS files) it is renamed to ``blobs/<etag>``, where ``hf_hub_download`` finds it and
makes the snapshot entry and ``refs/main`` exactly as after a download of its own.

A partial for another etag of the same file (changed upstream), or for a file the repo no longer
lists, is discarded. The ``.incomplete`` suffix keeps partials visible to ``scan_cache_dir`` / ``hf
cache ls`` as incomplete downloads and removable with ``hf cache prune``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from engine.errors import LanesError

RESUMABLE_MIN = 2**20  # a file at least this large resumes to the byte; smaller ones come whole
SHA256 = re.compile(r"[0-9a-f]{64}")  # an LFS file's etag is its sha256 (a git file's is a sha1)
LOCK_WAIT_S = 1.0  # while another process holds the blob's lock, a cancel is still seen this often


def storage_folder(repo: str) -> Path:
    """The repo's folder in the Hugging Face cache (``models--owner--name``)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")


def _key(name: str) -> str:
    return "lanes-" + hashlib.sha256(name.encode()).hexdigest()[:12]


def partial_path(repo: str, etag: str, name: str) -> Path:
    return storage_folder(repo) / "blobs" / f"{etag}.{_key(name)}.incomplete"


def partials(repo: str) -> list[Path]:
    """Lanes' partly downloaded files of ``repo`` (huggingface_hub's own never outlive an attempt)."""
    return sorted((storage_folder(repo) / "blobs").glob("*.lanes-*.incomplete"))


def discard_unlisted(repo: str, names: Iterable[str]) -> None:
    """Drop the partials of files ``repo`` no longer lists (removed or renamed upstream)."""
    keep = {_key(n) for n in names}
    for p in partials(repo):
        if p.name.split(".")[1] not in keep:
            p.unlink(missing_ok=True)


def fetch(repo: str, name: str, *, endpoint: str | None, tqdm_class: type[tqdm],
          check: Callable[[], None]) -> Path | None:
    """Bring ``name`` of ``repo`` (main) into the cache's blobs, continuing a partial left by an
    earlier attempt. Returns the blob when this call placed it; None when it was there already or
    when the Hub gives no etag, commit or size (``hf_hub_download`` then says what is wrong, or
    fetches the file whole). ``check()`` raises to cancel: it is called after each chunk is written,
    so the bytes that arrived are kept. Raises LanesError naming the file when it arrives corrupted
    (it is removed)."""
    from filelock import Timeout
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import WeakFileLock

    meta = get_hf_file_metadata(hf_hub_url(repo, name, endpoint=endpoint), endpoint=endpoint)
    if not (meta.etag and meta.commit_hash and meta.size):
        return None
    storage = storage_folder(repo)
    blob = storage / "blobs" / meta.etag
    pointer = storage / "snapshots" / meta.commit_hash / name
    partial = partial_path(repo, meta.etag, name)
    for stale in (storage / "blobs").glob(f"*.{_key(name)}.incomplete"):
        if stale != partial:  # kept for an etag the Hub no longer serves: the file changed
            stale.unlink(missing_ok=True)
    if pointer.exists() or blob.exists():
        return None
    # As huggingface_hub does before a transfer: the snapshot folder and the ref exist already, so
    # scan_cache_dir sees a revision with files to come rather than a repo folder without snapshots.
    blob.parent.mkdir(parents=True, exist_ok=True)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    _write_ref(storage, constants.DEFAULT_REVISION, meta.commit_hash)
    lock = Path(constants.HF_HUB_CACHE) / ".locks" / storage.name / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(repo, name, revision=meta.commit_hash, endpoint=endpoint)  # this commit's bytes
    while True:
        check()
        try:
            with WeakFileLock(lock, timeout=LOCK_WAIT_S):
                if blob.exists():  # another process finished it meanwhile
                    partial.unlink(missing_ok=True)
                    return None
                _transfer(url, partial, meta.size, tqdm_class, check, name)
                _verify(partial, meta.size, meta.etag, repo, name, check)
                os.replace(partial, blob)
                return blob
        except Timeout:
            continue


def settle(blob: Path | None, pointer: Path) -> None:
    """After ``hf_hub_download`` made the snapshot entry of a blob placed by ``fetch``: where the
    cache cannot hold symlinks it copied the blob, whereas its own download moves it; do the same."""
    if blob is not None and not pointer.is_symlink() and pointer.is_file():
        blob.unlink(missing_ok=True)


def _transfer(url: str, partial: Path, size: int, tqdm_class: type[tqdm], check: Callable[[], None],
              name: str) -> None:
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    kept = partial.stat().st_size if partial.exists() else 0
    if kept > size:  # not a prefix of this file
        partial.unlink()
        kept = 0
    if kept == size:
        return
    headers = build_hf_headers()  # the stored token, if any, as hf_hub_download sends it
    headers["Accept-Encoding"] = "identity"  # ranges of the file's own bytes
    with partial.open("ab") as f:
        http_get(url, _Sink(f, check), resume_size=kept, headers=headers, expected_size=size,
                 displayed_filename=name, tqdm_class=tqdm_class)


def _verify(partial: Path, size: int, etag: str, repo: str, name: str, check: Callable[[], None]) -> None:
    got = partial.stat().st_size
    if got != size:
        partial.unlink(missing_ok=True)
        raise LanesError(f"'{name}' of '{repo}' arrived with {got} bytes instead of {size}; "
                         "it was removed: Download again to fetch it anew")
    if not SHA256.fullmatch(etag):
        return
    digest = hashlib.sha256()
    with partial.open("rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
            check()
    if digest.hexdigest() != etag:
        partial.unlink(missing_ok=True)
        raise LanesError(f"'{name}' of '{repo}' arrived corrupted: its sha256 is {digest.hexdigest()}, "
                         f"the Hub's is {etag}; it was removed: Download again to fetch it anew")


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    ref = storage / "refs" / revision
    if ref.is_file() and ref.read_text() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f"{ref.name}.lanes.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)  # readers never see half a ref


class _Sink:
    """The partial file as ``http_get`` writes to it: each chunk is flushed to disk before a cancel
    is looked at, so a cancel keeps every byte received."""

    def __init__(self, f: BinaryIO, check: Callable[[], None]) -> None:
        self._f, self._check = f, check

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        self._f.flush()
        self._check()
        return n

    def __getattr__(self, attr: str) -> Any:  # seek / tell / truncate, when a server ignores the range
        return getattr(self._f, attr)
