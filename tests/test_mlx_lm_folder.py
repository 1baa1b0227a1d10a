"""Loading a model the mlx-lm way: a local folder, and a Hugging Face cache entry, offline.

The folder is made from the embedded model (weights, config and tokenizer written the way mlx-lm
writes them), so this runs without any download."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.events import Finished, Request
from engine.model.loading import load_model
from engine.rounds.scheduler import Scheduler
from tests import prompts

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def mlx_lm_folder(loaded, tmp_path_factory) -> Path:
    from mlx_lm.utils import save_config, save_model

    folder = tmp_path_factory.mktemp("smollm2-mlx")
    save_model(folder, loaded.model)
    config = {k: v for k, v in dataclasses.asdict(loaded.model.args).items() if v is not None}
    save_config(config, folder / "config.json")
    loaded.tokenizer._tokenizer.save_pretrained(folder)
    return folder


def answer(model_loaded) -> Finished:
    events: list = []
    sched = Scheduler(model_loaded, events.append)
    sched.submit(Request(messages=({"role": "user", "content": prompts.FRANCE},), max_tokens=20))
    while sched.busy:
        sched.step()
    return next(e for e in events if isinstance(e, Finished))


def test_local_mlx_lm_folder_loads_and_answers(mlx_lm_folder: Path, loaded) -> None:
    folder_model = load_model(str(mlx_lm_folder))
    assert folder_model.family.name == "smollm2"  # matched from the folder name
    assert folder_model.device == "cpu" and folder_model.context_length == 8192
    done = answer(folder_model)
    assert "Paris" in done.text
    assert done.tokens == answer(loaded).tokens


def test_hugging_face_cache_entry_loads_offline(mlx_lm_folder: Path, monkeypatch, tmp_path: Path) -> None:
    # The cache layout huggingface_hub reads: models--ORG--NAME/{refs/main, snapshots/REV/...}.
    repo = tmp_path / "models--lanes-test--smollm2-mlx"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for f in mlx_lm_folder.iterdir():
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    cached = load_model("lanes-test/smollm2-mlx")
    assert cached.path == snapshot
    assert "Paris" in answer(cached).text
