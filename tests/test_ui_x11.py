"""The real app (``lanes-app``) on a real X server: Xvfb, Qt's xcb platform (not offscreen), keys typed
with xdotool as a person types them, the embedded model answering. `make test` installs Xvfb and
xdotool on Debian/Ubuntu (as `make setup` installs the X11 libraries the window needs)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.store.store import Store

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(sys.platform != "linux", reason="X11 runs the window on Linux only"),
    pytest.mark.skipif(not (shutil.which("Xvfb") and shutil.which("xdotool")),
                       reason="Xvfb and xdotool are not installed (`make test` installs them with apt)"),
]


@pytest.fixture
def display() -> Iterator[str]:
    """A fresh X server without a screen; its display name."""
    read, write = os.pipe()
    server = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", "1280x900x24", "-nolisten", "tcp"],
                              pass_fds=(write,), stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as f:
        number = f.readline().strip()
    try:
        yield f":{number}"
    finally:
        server.terminate()
        server.wait(10)


def xdotool(env: dict[str, str], *args: str) -> str:
    return subprocess.run(["xdotool", *args], env=env, capture_output=True, text=True, timeout=30).stdout.strip()


def wait_for(check, seconds: float, what: str):  # -> the check's first true value
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if value := check():
            return value
        time.sleep(0.25)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


def test_the_app_opens_on_x11_and_answers_what_is_typed(display: str, tmp_path: Path, reference,
                                                       chat_prompt, loaded) -> None:
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}  # the default platform: xcb
    env.update(DISPLAY=display, XDG_CONFIG_HOME=str(tmp_path / "config"), QT_DEBUG_PLUGINS="0")
    app = subprocess.Popen([sys.executable, "-m", "app.main", "--data-dir", str(tmp_path)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        window = wait_for(lambda: xdotool(env, "search", "--onlyvisible", "--name", "^Lanes$"), 60,
                          f"the window on {display} ({(app.poll() is None and 'running') or 'exited'})")
        window = window.splitlines()[0]
        xdotool(env, "windowfocus", "--sync", window)
        question = "What is the capital of France?"
        xdotool(env, "type", "--delay", "20", question)  # typing starts in the composer
        xdotool(env, "key", "Return")  # sent now, or as soon as the model is ready

        def answered():
            db = tmp_path / "lanes.db"
            if not db.exists():
                return None
            with Store(db) as store:
                rows = store.list_conversations()
                msgs = store.messages(rows[0].id) if rows else []
            return msgs if len(msgs) == 2 and msgs[1].status == "complete" else None

        user, reply = wait_for(answered, 240, "the reply in the store")
        assert user.content == question
        assert list(reply.tokens) == reference(chat_prompt(question), len(reply.tokens))  # mlx-lm's own reply
        title = wait_for(lambda: xdotool(env, "getwindowname", window).removesuffix(" — Lanes") != "Lanes"
                         and xdotool(env, "getwindowname", window), 30, "the window titled by the question")
        assert title == f"{question} — Lanes"
        xdotool(env, "key", "ctrl+comma")  # Settings, a modal dialog
        wait_for(lambda: xdotool(env, "search", "--onlyvisible", "--name", "^Settings$"), 30, "the Settings dialog")
        app.send_signal(signal.SIGTERM)  # as a logout or `kill` would: quits the normal way, dialog and all
        assert app.wait(60) == 0
    finally:
        if app.poll() is None:
            app.kill()
        output = app.communicate()[0]
    assert "Could not load the Qt platform plugin" not in output, output
