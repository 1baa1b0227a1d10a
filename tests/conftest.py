"""Shared fixtures: the real embedded model, loaded once per session, and mlx-lm's
own greedy generation as the reference every Lanes stream must equal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from engine.model.machine import use_mlx_defaults

# MLX's settings as Lanes runs it (its CLI and engine thread set them before the first pass): with
# MLX's default cuDNN attention on CUDA, mlx-lm's own first generation of a prompt differed from its
# later ones for gpt_oss (token 0), so a test's reference would depend on which test ran first.
use_mlx_defaults()


@pytest.fixture(scope="session")
def loaded():  # -> engine.model.loading.LoadedModel
    from engine.model.loading import load_model

    return load_model(None)


@pytest.fixture(scope="session")
def reference(loaded) -> Callable[[list[int], int], list[int]]:
    """mlx-lm ``stream_generate`` tokens for (prompt tokens, max tokens), memoised."""
    from mlx_lm import stream_generate

    memo: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def ref(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in memo:
            memo[key] = [
                r.token
                for r in stream_generate(loaded.model, loaded.tokenizer, prompt, max_tokens=max_tokens)
                if r.finish_reason != "stop"
            ]
        return memo[key]

    return ref


@pytest.fixture(scope="session")
def chat_prompt(loaded) -> Callable[[str], list[int]]:
    def render(text: str) -> list[int]:
        return list(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))

    return render


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    """Fail any test that leaves a thread running."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in leaked:
        t.join(timeout=10)
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"threads leaked: {leaked}"


@pytest.fixture(autouse=True)
def isolated_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Every test (and every child process it starts) gets its own data and settings folders: never
    the user's."""
    d = tmp_path_factory.mktemp("lanes-data")
    monkeypatch.setenv("LANES_DATA_DIR", str(d))
    monkeypatch.setenv("XDG_DATA_HOME", str(d / "xdg"))
    monkeypatch.setenv("LANES_CONFIG_DIR", str(d / "config"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(d / "xdg-config"))
    return d


@pytest.fixture
def settings_dir(isolated_data_dir):  # -> Path
    """This test's settings folder (what LANES_CONFIG_DIR points at), for tests that look inside it."""
    return isolated_data_dir / "config"


@pytest.fixture
def hf_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """``add(repo, files)``: put a snapshot of ``repo`` ("owner/name") holding ``files`` (name ->
    bytes) in a Hugging Face cache of this test's own, in the layout huggingface_hub reads
    (models--OWNER--NAME/{refs/main, snapshots/REV/...}); returns the snapshot folder."""
    root = tmp_path_factory.mktemp("hf-cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))  # no LM Studio folder of the machine's
    monkeypatch.delenv("LANES_MODELS_DIR", raising=False)

    def add(repo: str, files: dict[str, bytes]):  # -> Path
        entry = root / ("models--" + repo.replace("/", "--"))
        snapshot = entry / "snapshots" / "0123abcd"
        snapshot.mkdir(parents=True)
        for name, data in files.items():
            (snapshot / name).write_bytes(data)
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text("0123abcd")
        return snapshot

    return add


@pytest.fixture
def make_window(qtbot, tmp_path):  # -> Iterator[Callable[..., app.main_window.MainWindow]]
    """The chat window on the scripted fake engine (tests/fake_engine.py) and a real store in tmp_path."""
    from app.controller import ChatController
    from app.main_window import MainWindow
    from app.preferences import Preferences
    from tests.fake_engine import FakeEngine

    windows = []

    def make(delay: float = 0.01, fail_models: tuple[str, ...] = (), **prefs):
        factory = lambda model: FakeEngine(model, delay, fail_load=f"no model at {model}"  # noqa: E731
                                           if model in fail_models else None)
        controller = ChatController(tmp_path / "lanes.db", prefs.get("model"), engine_factory=factory)
        w = MainWindow(controller, Preferences(**prefs), tmp_path / "prefs.json")
        qtbot.addWidget(w)
        w.show()
        windows.append(w)
        return w

    yield make
    for w in windows:
        w.close()  # joins the controller's threads (the thread-leak check runs after this)
