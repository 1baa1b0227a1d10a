"""The window's Server menu: the local API over the window's own engine, started, used by the
official client, counted, copied, saved when asked, and stopped."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
import pytest
from PySide6.QtGui import QGuiApplication

from engine.store.store import Store
from tests import prompts
from tests.test_ui_e2e import open_window

pytestmark = pytest.mark.model


def test_server_menu_serves_the_windows_engine(qtbot, loaded, chat_prompt, reference, tmp_path: Path) -> None:
    w = open_window(qtbot, loaded, tmp_path)
    menu = w.server_menu
    assert menu.state_action.text() == "Not running" and not menu.copy_action.isEnabled()
    menu.toggle_action.trigger()
    qtbot.waitUntil(lambda: menu.url is not None, timeout=60000)
    assert menu.toggle_action.text() == "Stop API Server" and menu.label.isVisible()
    menu.copy_action.trigger()
    assert QGuiApplication.clipboard().text() == menu.url
    client = openai.OpenAI(base_url=menu.url, api_key="unused", max_retries=0, timeout=120)

    answers: list[str] = []
    ask = threading.Thread(target=lambda: answers.append(client.chat.completions.create(
        model=loaded.name, messages=[{"role": "user", "content": prompts.OPEN}], max_tokens=64,
        temperature=0).choices[0].message.content))
    ask.start()
    qtbot.waitUntil(lambda: menu.state_action.text().endswith("· 1 request running"), timeout=60000)
    qtbot.waitUntil(lambda: not ask.is_alive(), timeout=120000)
    ask.join()
    assert answers == [loaded.tokenizer.decode(reference(chat_prompt(prompts.OPEN), 64))]
    qtbot.waitUntil(lambda: menu.label.text() == "API: 0 requests running")
    with Store(tmp_path / "lanes.db") as store:
        assert store.count_conversations() == 0  # not saved unless asked

    menu.save_action.trigger()  # saved from now on (the store's setting), without a restart
    def saving() -> bool:
        with Store(tmp_path / "lanes.db") as store:
            return store.setting("api_saves_conversations") is True

    qtbot.waitUntil(saving)
    shown = w.sidebar.model.rowCount()
    client.chat.completions.create(model=loaded.name, messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    with Store(tmp_path / "lanes.db") as store:
        [saved] = store.list_conversations()
        assert saved.title == "Hi"
    # the sidebar shows it without being asked
    qtbot.waitUntil(lambda: w.sidebar.model.rowCount() == shown + 1, timeout=10000)
    assert w.sidebar.model.index(0, 0).data() == "Hi"
    menu.toggle_action.trigger()  # stop
    qtbot.waitUntil(lambda: menu.url is None, timeout=30000)
    assert not menu.label.isVisible() and menu.state_action.text() == "Not running"
    menu.toggle_action.trigger()
    qtbot.waitUntil(lambda: menu.url is not None, timeout=60000)
    w.close()
    with pytest.raises(openai.APIConnectionError):  # closing the window stops the server
        openai.OpenAI(base_url=menu.url, api_key="unused", max_retries=0, timeout=5).models.list()
