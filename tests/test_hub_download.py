"""Downloading a model from the Hub by name (engine/model/hub_download.py), against a Hub of our own
on loopback (tests/fake_hub.py): progress, cancel part way, resume to the byte with a range request
(also after a cut connection), a changed or corrupted file, errors."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from tqdm import tqdm

from engine.errors import LanesError
from engine.model import hub_resume
from engine.model.hub_download import DownloadCancelled, Progress, download
from engine.model.locate import locate_model
from tests.fake_hub import SHA, FakeHub

REPO = "someone/Tiny-Model"
FILES = {"config.json": b'{"model_type": "qwen3"}', "model.safetensors": os.urandom(24 * 2**20),
         "tokenizer.json": b"{}", "README.md": b"not needed", "original/consolidated.pth": b"not needed"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hf-cache"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(root))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    return root


def test_a_download_reports_progress_and_lands_where_lanes_finds_it(cache: Path) -> None:
    seen: list[Progress] = []
    with FakeHub({REPO: FILES}, chunk=2**20) as hub:
        folder = download(REPO, seen.append, lambda: False, endpoint=hub.url)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (folder / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    total = sum(len(FILES[n]) for n in ("config.json", "model.safetensors", "tokenizer.json"))
    assert seen[-1] == Progress(total, total, "tokenizer.json")
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert any(p.file == "model.safetensors" and 23 < p.done < 23 + 24 * 2**20 for p in seen)  # within the file
    assert locate_model(REPO) == folder  # the cache Lanes loads from


def test_a_cancelled_download_resumes_at_the_file_it_stopped_in(cache: Path) -> None:
    shards = {"config.json": b'{"model_type": "qwen3"}', "model-00001-of-00002.safetensors": os.urandom(200_000),
              "model-00002-of-00002.safetensors": os.urandom(200_000)}
    stop = threading.Event()

    def progress(p: Progress) -> None:
        if p.file.startswith("model-00002") and p.done > 300_000:
            stop.set()  # half way through the second shard

    with FakeHub({REPO: shards}, chunk=8192, delay=0.002) as hub:
        with pytest.raises(DownloadCancelled):
            download(REPO, progress, stop.is_set, endpoint=hub.url)
        hub.requests.clear()
        seen: list[Progress] = []
        folder = download(REPO, seen.append, lambda: False, endpoint=hub.url)
        fetched = [p.rsplit("/", 1)[-1] for m, p, _r in hub.requests if m == "GET" and "/resolve/" in p]
    assert fetched == ["model-00002-of-00002.safetensors"]  # the complete ones were kept
    assert [p.done for p in seen[:2]] == [23, 200_023]  # progress counts the kept files as done at once
    for name, data in shards.items():
        assert (folder / name).read_bytes() == data


def test_a_missing_or_unloadable_model_is_named(cache: Path) -> None:
    with FakeHub({"someone/Docs-Only": {"README.md": b"x", "config.json": b"{}"}}) as hub:
        with pytest.raises(LanesError, match="no model 'nobody/nothing' on the Hugging Face Hub"):
            download("nobody/nothing", lambda _p: None, lambda: False, endpoint=hub.url)
        with pytest.raises(LanesError, match=r"'someone/Docs-Only' has no \.safetensors weights"):
            download("someone/Docs-Only", lambda _p: None, lambda: False, endpoint=hub.url)


# Byte-level resume of a large file (engine/model/hub_resume.py): huggingface_hub itself would drop
# the partial file and start it over.

WEIGHTS = "model.safetensors"


def _cancel_inside_weights(hub: FakeHub) -> int:
    """Download until the first chunk of the weights is on disk, then cancel; returns the bytes kept."""
    stop = threading.Event()

    def progress(p: Progress) -> None:
        if p.file == WEIGHTS and p.done > len(FILES["config.json"]):
            stop.set()

    with pytest.raises(DownloadCancelled):
        download(REPO, progress, stop.is_set, endpoint=hub.url)
    [partial] = hub_resume.partials(REPO)
    return partial.stat().st_size


def _weights_ranges(hub: FakeHub, name: str = WEIGHTS) -> list[str | None]:
    return [r for m, p, r in hub.requests if m == "GET" and p.endswith(f"/{name}")]


def test_a_cancelled_large_file_resumes_at_the_byte_it_stopped_at(cache: Path) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

    with FakeHub({REPO: FILES}, chunk=2**20) as hub:
        kept = _cancel_inside_weights(hub)
        assert 0 < kept < len(FILES[WEIGHTS])
        [partial] = hub_resume.partials(REPO)
        assert partial.read_bytes() == FILES[WEIGHTS][:kept]  # every byte received is kept
        assert partial in {f.file_path for f in scan_cache_dir(cache).incomplete_files}  # `hf cache ls` shows it
        assert try_to_load_from_cache(REPO, WEIGHTS) is None
        hub.requests.clear()
        seen: list[Progress] = []
        folder = download(REPO, seen.append, lambda: False, endpoint=hub.url)  # a new call: all state is on disk
        ranges = _weights_ranges(hub)
    assert ranges == [f"bytes={kept}-"]  # only the rest was asked for
    assert next(p.done for p in seen if p.file == WEIGHTS) == len(FILES["config.json"]) + kept  # counted at once
    assert (folder / WEIGHTS).read_bytes() == FILES[WEIGHTS]
    assert hub_resume.partials(REPO) == []
    # The cache is as huggingface_hub leaves it: a relative symlink to the blob named by the etag, refs/main.
    sha256 = hashlib.sha256(FILES[WEIGHTS]).hexdigest()
    assert (folder / WEIGHTS).is_symlink() and not os.readlink(folder / WEIGHTS).startswith("/")
    assert (folder / WEIGHTS).resolve() == (hub_resume.storage_folder(REPO) / "blobs" / sha256).resolve()
    assert (hub_resume.storage_folder(REPO) / "refs" / "main").read_text() == SHA
    info = scan_cache_dir(cache)  # its module keeps the cache path it was imported with
    [repo] = [r for r in info.repos if r.repo_id == REPO]
    [revision] = repo.revisions
    assert revision.commit_hash == SHA and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} == {"config.json", WEIGHTS, "tokenizer.json"}
    assert not info.warnings and not info.incomplete_files
    assert try_to_load_from_cache(REPO, WEIGHTS) == str(folder / WEIGHTS)
    assert Path(snapshot_download(REPO, local_files_only=True)) == folder
    assert locate_model(REPO) == folder


def test_a_connection_cut_part_way_continues_from_the_bytes_on_disk(cache: Path) -> None:
    with FakeHub({REPO: FILES}, chunk=2**20, cut_after=15 * 2**20) as hub:
        folder = download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
        ranges = _weights_ranges(hub)
    assert ranges[0] is None and len(ranges) == 2
    assert ranges[1] is not None and 0 < int(ranges[1].removeprefix("bytes=").rstrip("-")) <= 15 * 2**20
    assert (folder / WEIGHTS).read_bytes() == FILES[WEIGHTS]


def test_a_server_that_ignores_the_range_sends_the_whole_file_again(cache: Path) -> None:
    with FakeHub({REPO: FILES}, chunk=2**20) as hub:
        kept = _cancel_inside_weights(hub)
    with FakeHub({REPO: FILES}, chunk=2**20, ranges=False) as hub:
        folder = download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
        ranges = _weights_ranges(hub)
    assert ranges == [f"bytes={kept}-"]  # answered 200 with the whole file: the partial starts over
    assert (folder / WEIGHTS).read_bytes() == FILES[WEIGHTS]


def test_a_partial_file_of_an_older_version_is_discarded(cache: Path) -> None:
    with FakeHub({REPO: FILES}, chunk=2**20) as hub:
        _cancel_inside_weights(hub)
    [old] = hub_resume.partials(REPO)
    changed = {**FILES, WEIGHTS: os.urandom(3 * 2**20)}  # the weights changed upstream: another etag
    with FakeHub({REPO: changed}, chunk=2**20) as hub:
        folder = download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
        ranges = _weights_ranges(hub)
    assert ranges == [None]  # fetched whole, not appended to the old bytes
    assert (folder / WEIGHTS).read_bytes() == changed[WEIGHTS]
    assert not old.exists() and hub_resume.partials(REPO) == []


def test_a_partial_file_the_repo_no_longer_lists_is_discarded(cache: Path) -> None:
    with FakeHub({REPO: FILES}, chunk=2**20) as hub:
        _cancel_inside_weights(hub)
    renamed = {n: d for n, d in FILES.items() if n != WEIGHTS} | {"weights.safetensors": os.urandom(2**20)}
    with FakeHub({REPO: renamed}) as hub:
        download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
    assert hub_resume.partials(REPO) == []


def test_a_corrupted_download_is_refused_named_and_removed(cache: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    claimed = "0" * 64  # the Hub says this sha256; the bytes that arrive have another
    got = hashlib.sha256(FILES[WEIGHTS]).hexdigest()
    refused = rf"'{WEIGHTS}' of '{REPO}' arrived corrupted: its sha256 is {got}, the Hub's is {claimed}; it was removed"
    with FakeHub({REPO: FILES}, chunk=2**20, etags={WEIGHTS: claimed}) as hub, pytest.raises(LanesError, match=refused):
        download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
    assert hub_resume.partials(REPO) == []
    assert not (hub_resume.storage_folder(REPO) / "blobs" / claimed).exists()
    assert try_to_load_from_cache(REPO, WEIGHTS) is None


class _Quiet(tqdm):  # type: ignore[type-arg]
    monitor_interval = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "disable": True})  # no bar, no monitor thread


def _layout(root: Path) -> dict[str, tuple[str, ...]]:
    """Each entry of a cache: a link's target, or a file's sha256 and mode (lock files aside)."""
    out: dict[str, tuple[str, ...]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".locks/"):
            continue
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), oct(p.stat().st_mode))
        else:
            out[rel] = ("dir",)
    return out


@pytest.mark.parametrize("symlinks", [True, False], ids=["symlinks", "no-symlinks"])
def test_a_resumed_download_leaves_the_cache_as_huggingface_hub_would(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, symlinks: bool) -> None:
    from huggingface_hub import hf_hub_download

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_SYMLINKS", not symlinks)
    theirs = tmp_path / "hf-own-cache"
    with FakeHub({REPO: FILES}, chunk=2**20) as hub:
        _cancel_inside_weights(hub)
        download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(theirs))
        for name in ("config.json", WEIGHTS, "tokenizer.json"):
            hf_hub_download(REPO, name, endpoint=hub.url, tqdm_class=_Quiet)
    assert _layout(cache) == _layout(theirs)
    assert (any(p.is_symlink() for p in cache.rglob("*"))) == symlinks


@pytest.mark.model
def test_a_resumed_download_loads_and_answers(cache: Path, loaded, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded model written as an mlx-lm folder, served by the fake Hub, downloaded with a
    cancel inside its weights, then loaded the way Lanes loads a Hub model (offline, from the cache)."""
    import dataclasses

    from mlx_lm.utils import save_config, save_model

    from engine.model.loading import load_model
    from tests.test_mlx_lm_folder import answer

    folder = tmp_path / "smollm2-mlx"
    save_model(folder, loaded.model)
    save_config({k: v for k, v in dataclasses.asdict(loaded.model.args).items() if v is not None},
                folder / "config.json")
    loaded.tokenizer._tokenizer.save_pretrained(folder)
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    [weights] = [n for n in files if n.endswith(".safetensors")]
    assert len(files[weights]) > 2 * 10 * 2**20  # more than two chunks of huggingface_hub's
    stop = threading.Event()

    def progress(p: Progress) -> None:
        if p.file == weights:
            stop.set()

    with FakeHub({REPO: files}, chunk=2**20) as hub:
        with pytest.raises(DownloadCancelled):
            download(REPO, progress, stop.is_set, endpoint=hub.url)
        [partial] = hub_resume.partials(REPO)
        kept = partial.stat().st_size
        download(REPO, lambda _p: None, lambda: False, endpoint=hub.url)
        assert _weights_ranges(hub, weights) == [None, f"bytes={kept}-"] and kept > 0
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    model = load_model(REPO)
    assert model.path == hub_resume.storage_folder(REPO) / "snapshots" / SHA
    assert "Paris" in answer(model).text

