"""``python -m app.screenshots``: the main window as PNG files, for the README and the docs.

Seeds a temporary data folder with a few conversations through the real window and the real model
(greedy, so every run writes the same replies), shows the one where a function is written and then
edited (so copying from the conversation shows), and saves at 1200x800:

- ``main-window.png``: replies as Markdown, code coloured, the context meter in the header;
- ``main-window-origins.png``: the same with "Colour Tokens by Origin" on;
- ``reply-versions.png``: the last reply regenerated, its versions browsable (< 2/2 >);
- ``reading.png``: a long message being read before the reply starts (prefill progress);
- ``settings-models.png``: Settings with the models on this machine;
- ``compare-pane.png``: the comparison pane after an A/B of a copy-friendly request (2 repeats).

Offscreen by default (``QT_QPA_PLATFORM=offscreen`` unless set otherwise).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.model import openblas
from engine.model.machine import drop_mlx_streams, use_mlx_defaults

SIZE = (1200, 800)
MAX_TOKENS = 200
FILES = ("main-window.png", "main-window-origins.png", "reply-versions.png", "reading.png", "settings-models.png",
         "compare-pane.png")
# A long message (about 1,500 tokens) that takes the CPU a few seconds to read: the reading.png state.
LONG_MESSAGE = "Summarise these notes in one sentence.\n\n" + " ".join(
    f"Note {i}: the lighthouse keeper logged the wind, the tide and the passing ships at {i % 12 + 1} o'clock."
    for i in range(60))
COMPARE_PROMPT = ("Repeat this list exactly, then again in reverse order: apples, pears, plums, cherries, "
                  "grapes, melons.")

# Conversations to seed, oldest first; each is a list of user messages sent one after another.
# The last one is shown: a function, then an edit of it, which the model copies from the conversation.
CONVERSATIONS: tuple[tuple[str, ...], ...] = (
    ("What's the difference between a virus and a bacterium?",),
    ("Give me three tips for a job interview, as a numbered list.",),
    ("Write a Python function `average(numbers)` that returns the mean of a list of numbers. "
     "Put the code in a ```python block.",
     "Rename the parameter `numbers` to `values` and show the code again."),
)


def render_screenshots(out: Path, *, engine_factory: Callable[[str | None], Any] | None = None,
                       data_dir: Path | None = None, max_tokens: int = MAX_TOKENS,
                       conversations: Sequence[Sequence[str]] = CONVERSATIONS,
                       timeout_s: float = 600.0) -> list[Path]:
    """Seed the conversations, show the last one and save the PNGs (``FILES``) in ``out``; returns their paths.

    ``engine_factory`` defaults to ``engine.rounds.engine_thread.Engine``; ``data_dir`` (default a temporary folder,
    removed after) receives the database and the preferences file."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    out.mkdir(parents=True, exist_ok=True)
    if data_dir is not None:
        return _render(app, out, Path(data_dir), engine_factory, max_tokens, conversations, timeout_s)
    with tempfile.TemporaryDirectory(prefix="lanes-screenshots-") as tmp:
        return _render(app, out, Path(tmp), engine_factory, max_tokens, conversations, timeout_s)


def _render(app: Any, out: Path, folder: Path, engine_factory: Callable[[str | None], Any] | None,
            max_tokens: int, conversations: Sequence[Sequence[str]], timeout_s: float) -> list[Path]:
    from app.bench_ui import settle, wait_until
    from app.controller import ChatController
    from app.main_window import MainWindow
    from app.preferences import Preferences
    from engine.rounds.engine_thread import Engine

    controller = ChatController(folder / "lanes.db", None, engine_factory or Engine)
    window = MainWindow(controller, Preferences(max_tokens=max_tokens), folder / "preferences.json")
    window.resize(*SIZE)
    window.show()
    finished: list[int] = []
    controller.replyFinished.connect(lambda cid, _m: finished.append(cid))
    controller.replyFailed.connect(lambda cid, why: finished.append(cid))

    try:
        wait_until(lambda: controller.info is not None, timeout_s, "the model to load")
        shown: int | None = None
        for turns in conversations:
            window.new_conversation()
            for text in turns:
                before = len(finished)
                window.composer.setPlainText(text)
                window.send(window.composer.toPlainText())
                wait_until(lambda before=before: len(finished) > before and not controller.generating(),
                           timeout_s, "a reply")
            shown = window.current
        assert shown is not None, "no conversation was seeded"
        # Open it as a click in the sidebar would: a fresh load of the saved messages, row selected.
        window.new_conversation()
        settle(0.4)
        window.sidebar.select(shown)
        window.open_conversation(shown)
        wait_until(lambda: window.current == shown and bool(window.chat.widgets), 30, "the conversation to open")
        settle(0.4)
        paths = [out / name for name in FILES]
        _save(window, paths[0])
        window.toggle_origins(True)
        window.origins_action.setChecked(True)
        settle(0.4)
        _save(window, paths[1])
        window.origins_action.setChecked(False)
        window.toggle_origins(False)
        before = len(finished)
        window.regenerate()
        wait_until(lambda: len(finished) > before and not controller.generating(), timeout_s, "the regenerated reply")
        wait_until(lambda: window.chat.widgets[-1].version_label.isVisible(), 30, "the versions to show")
        settle(0.4)
        _save(window, paths[2])
        _reading(window, paths[3], finished, timeout_s)
        _settings(window, paths[4], folder / "models")
        _compare(window, paths[5], timeout_s)
        return paths
    finally:
        window.close()  # controller.close(): joins every thread
        app.processEvents()
        window.deleteLater()
        app.processEvents()


def _reading(window: Any, path: Path, finished: list[int], timeout_s: float) -> None:
    """Send a long message, save the window while its reply reads it, then stop the reply."""
    from app.bench_ui import settle, wait_until

    window.new_conversation()
    before = len(finished)
    window.send(LONG_MESSAGE)

    def read_share() -> int | None:  # the bubble's "(NN%)" while it reads; None before and after
        text = window.chat.widgets[-1].stats.text() if window.chat.widgets else ""
        found = re.search(r"\((\d+)%\)", text) if text.startswith("Reading") else None
        return int(found.group(1)) if found else None

    wait_until(lambda: read_share() is not None, timeout_s, "the long message to be read")
    wait_until(lambda: (read_share() or 100) >= 10, timeout_s, "a tenth of it read")  # progress, not 0%
    _save(window, path)
    window.stop()
    wait_until(lambda: len(finished) > before and not window.controller.generating(), timeout_s, "the stop")
    settle(0.2)


def _settings(window: Any, path: Path, shelf: Path) -> None:
    """Settings as it opens, the models on this machine listed under the model fields: besides the
    embedded one (and the machine's own), a models folder (``$LANES_MODELS_DIR``) holding the embedded
    model written as an mlx-lm llama folder (``lanes make-model``, a process of its own: MLX belongs
    to the engine's thread here) and its GGUF file."""
    import subprocess

    from app.bench_ui import settle
    from app.settings_dialog import SettingsDialog
    from engine.model.local_models import MODELS_DIR_ENV
    from engine.model.locate import embedded_model_path

    subprocess.run([sys.executable, "-m", "engine.cli", "make-model", "embedded-as-llama",
                    str(shelf / "SmolLM2-135M-Instruct-llama")], check=True, capture_output=True)
    gguf = embedded_model_path()
    (shelf / gguf.name).symlink_to(gguf)
    os.environ[MODELS_DIR_ENV] = str(shelf)
    try:
        dialog = SettingsDialog(window.prefs, window)
        dialog.show()
        settle(0.4)
        _save(dialog, path, None)
        dialog.reject()
    finally:
        del os.environ[MODELS_DIR_ENV]


def _compare(window: Any, path: Path, timeout_s: float) -> Path:
    """Run the comparison pane on a new prompt and save it."""
    from app.bench_ui import settle, wait_until
    from app.compare_pane import open_compare_pane

    pane = open_compare_pane(window.controller, None, 64, window)
    pane.resize(*SIZE)
    pane.prompt.setPlainText(COMPARE_PROMPT)
    pane.repeats.setValue(2)
    pane.run()
    if not pane.running:  # run() starts at once, or says why not
        raise RuntimeError(f"the comparison did not start: {pane.status.text()}")
    wait_until(lambda: not pane.running, timeout_s, "the comparison")
    settle(0.5)
    _save(pane, path)
    pane.close()
    return path


def _save(window: Any, path: Path, size: tuple[int, int] | None = SIZE) -> None:
    """Save ``window`` as a PNG, scaled to ``size`` where a high-DPI screen grabbed more pixels."""
    image = window.grab().toImage()
    if size is not None and (image.width(), image.height()) != size:
        from PySide6.QtCore import Qt

        image = image.scaled(*size, Qt.AspectRatioMode.IgnoreAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
    if not image.save(str(path)):
        raise OSError(f"could not write {path}")


def main(argv: list[str] | None = None) -> int:
    openblas.ensure_fast_blas()  # Linux: re-executes with OpenBLAS preloaded, before MLX loads
    use_mlx_defaults()
    parser = argparse.ArgumentParser(prog="python -m app.screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/screenshots", help="folder for the PNGs (default docs/screenshots)")
    args = parser.parse_args(argv)
    try:
        for path in render_screenshots(Path(args.out)):
            print(path)
    finally:
        drop_mlx_streams()
    return 0


if __name__ == "__main__":
    sys.exit(main())
