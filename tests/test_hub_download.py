"""Downloading a model from the Hub by name (engine/model/hub_download.py), against a Hub of our own
on loopback (tests/fake_hub.py): progress, cancel part way, resume with a range request, errors."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from engine.errors import LanesError
from engine.model.hub_download import DownloadCancelled, Progress, download
from engine.model.locate import locate_model
from tests.fake_hub import FakeHub

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
