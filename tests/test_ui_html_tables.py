"""An exported HTML page's Markdown tables, laid out by a real browser engine (Qt WebEngine,
offscreen): words kept whole in their cells, a table wider than the page scrolling sideways alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QEventLoop
from PySide6.QtWebEngineWidgets import QWebEngineView  # before the QApplication exists, as WebEngine needs

from engine.store.render import conversation_to_html
from engine.store.store import Store

HEADS = ["Language", "Quantization", "Parameters", "Context", "Memory", "License", "Notes"]
ROW = ["Python", "4-bit", "135 million", "8192", "small", "Apache-2.0", "readable syntax with significant indentation"]
TABLE = "| " + " | ".join(HEADS) + " |\n|" + "---|" * len(HEADS) + "\n| " + " | ".join(ROW) + " |\n"
MEASURE = """JSON.stringify((() => {
  const t = document.querySelector('.text table');
  const line = parseFloat(getComputedStyle(t.querySelector('th')).lineHeight);
  return {heads: [...t.querySelectorAll('th')].map(e => e.getBoundingClientRect().height), line,
          cells: [...t.querySelectorAll('td')].map(e => e.getBoundingClientRect().height),
          table: [t.scrollWidth, t.clientWidth], page: [document.documentElement.scrollWidth, innerWidth]};
})())"""


def laid_out(qtbot, page: str, width: int) -> dict:
    view = QWebEngineView()
    qtbot.addWidget(view)
    view.resize(width, 700)
    view.show()
    loop = QEventLoop()
    view.loadFinished.connect(lambda _ok: loop.quit())
    view.setHtml(page)
    loop.exec()
    found: list[str] = []
    view.page().runJavaScript(MEASURE, 0, lambda r: (found.append(r), loop.quit()))
    loop.exec()
    return json.loads(found[0])


def exported(folder: Path, table: str) -> str:
    with Store.open(folder / "data") as store:
        conv = store.create_conversation(title="Languages", model="SmolLM2-135M-Instruct")
        store.add_message(conv.id, "user", "Compare them.")
        store.add_message(conv.id, "assistant", "Here:\n\n" + table)
        return conversation_to_html(store, conv.id)


@pytest.fixture(autouse=True)
def _no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QTWEBENGINE_DISABLE_SANDBOX", "1")  # CI runs tests as root, where Chromium's sandbox cannot


def test_a_wide_table_keeps_its_words_and_scrolls_alone(qtbot, tmp_path: Path) -> None:
    narrow = laid_out(qtbot, exported(tmp_path, TABLE), 420)
    assert all(h < 1.5 * narrow["line"] for h in narrow["heads"])  # every header on one line
    scroll, client = narrow["table"]
    assert scroll > client  # the table scrolls sideways...
    assert narrow["page"][0] <= narrow["page"][1]  # ...and the page does not


def test_a_table_that_fits_wraps_its_long_cells_at_words(qtbot, tmp_path: Path) -> None:
    table = "| Name | Notes |\n|---|---|\n| Python | " + "readable syntax with significant indentation " * 4 + "|\n"
    wide = laid_out(qtbot, exported(tmp_path, table), 1400)
    assert wide["table"][0] <= wide["table"][1]  # as wide as the page's column, no wider: nothing to scroll
    assert wide["heads"][0] < 1.5 * wide["line"]
    assert wide["cells"][1] > 2 * wide["line"]  # the long cell wrapped inside the column
