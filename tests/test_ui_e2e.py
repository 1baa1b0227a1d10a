"""End to end: the real window on the real embedded model. Type, send, watch the reply stream in,
find it in the database, and see it again in a new window on the same data folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.controller import ChatController
from app.main_window import MainWindow
from app.preferences import Preferences
from engine.rounds.engine_thread import Engine
from engine.store.store import Store

pytestmark = pytest.mark.model
QUESTION = "What is the capital of France?"


def open_window(qtbot, loaded, data: Path) -> MainWindow:
    controller = ChatController(data / "lanes.db",
                                engine_factory=lambda _m: Engine(loader=lambda _s: loaded, calibrate=False))
    window = MainWindow(controller, Preferences(max_tokens=48), data / "prefs.json")
    qtbot.addWidget(window)
    window.show()
    return window


def test_type_send_stream_save_and_reopen(qtbot, loaded, chat_prompt, reference, tmp_path: Path) -> None:
    w = open_window(qtbot, loaded, tmp_path)
    qtbot.waitUntil(lambda: w.send_button.isEnabled(), timeout=60000)
    streamed: list[str] = []
    w.controller.liveUpdated.connect(
        lambda ids: streamed.append(w.controller.live[w.current].text) if w.current in ids else None)
    qtbot.keyClicks(w.composer, QUESTION)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: bool(w.chat.widgets) and w.chat.widgets[-1].message.role == "assistant"
                    and w.chat.widgets[-1].message.status == "complete", timeout=120000)
    reply = w.chat.widgets[-1].message
    assert list(reply.tokens) == reference(chat_prompt(QUESTION), 48)  # exactly mlx-lm's own reply
    assert "Paris" in w.chat.widgets[-1].view.plain_text()
    assert "tok/s" in w.chat.widgets[-1].stats.text()
    assert streamed and all(reply.content.startswith(s) for s in streamed)  # it arrived in pieces
    cid = w.current
    with Store(tmp_path / "lanes.db") as store:
        assert [(m.role, m.content) for m in store.messages(cid)] == [("user", QUESTION),
                                                                     ("assistant", reply.content)]
    w.close()

    again = open_window(qtbot, loaded, tmp_path)
    qtbot.waitUntil(lambda: [r.title for r in again.sidebar.model.rows] == [QUESTION])
    again.sidebar.select(cid)
    qtbot.waitUntil(lambda: len(again.chat.widgets) == 2)
    assert again.chat.widgets[-1].view.plain_text() == reply.content
    again.close()


def test_lanes_app_starts_and_ctrl_c_closes_it_cleanly(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.Popen([sys.executable, "-m", "app.main", "--data-dir", str(tmp_path)],
                            cwd=Path(__file__).resolve().parent.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "lanes.db").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        time.sleep(2)  # the window is up; the model is loading or loaded
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    prefs = Path(os.environ["LANES_CONFIG_DIR"]) / "preferences.json"
    assert prefs.is_file()  # closed through the window's own close: settings saved, threads joined
