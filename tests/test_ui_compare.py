"""The comparison pane (app/compare_pane.py) driven with pytest-qt: on the scripted fake engine for
the differing token, stopping, an error in one column, past comparisons and export; on the real
embedded model for a short copy-friendly request."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCharts import QChartView
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QKeySequence, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QWidget,
)

from app.compare_pane import ComparePane
from app.compare_parts import DIFF_TINTS, SideColumn, json_report, markdown_report, past_label
from app.controller import ChatController
from app.main_window import MainWindow
from app.preferences import Preferences
from app.theme import is_dark
from engine.events import Failed
from engine.service.comparisons import comparison_document, report_of
from engine.store.records import ComparisonRun
from engine.store.render import conversation_to_html, conversation_to_markdown
from engine.store.store import Store
from tests.fake_engine import FakeEngine, FakeHandle

COPY = "Repeat this list exactly, then again in reverse order: apples, pears, plums, cherries, grapes, melons."


class OnSideFails(FakeEngine):
    """The fake engine, except that every "on" run fails at once."""

    def _generate(self, h: FakeHandle) -> None:
        if h.request.own_copy_rates:
            h.events.put(Failed(h.id, "the on side broke", "RuntimeError", "", None))
            return None
        return super()._generate(h)


@pytest.fixture
def make_pane(qtbot, tmp_path: Path) -> Iterator[Callable[..., ComparePane]]:
    controllers: list[ChatController] = []

    def make(engine: type[FakeEngine] = FakeEngine, delay: float = 0.002, controller: ChatController | None = None,
             conversation_id: int | None = None) -> ComparePane:
        if controller is None:
            controller = ChatController(tmp_path / "lanes.db", engine_factory=lambda m: engine(m, delay))
            controllers.append(controller)
            qtbot.waitUntil(lambda: controller.decode([65]) == "A", timeout=15000)  # the tokenizer is known
        pane = ComparePane(controller, conversation_id, 64)
        qtbot.addWidget(pane)
        pane.show()
        return pane

    yield make
    for c in controllers:
        c.close()  # joins every thread before the thread-leak check


def start(qtbot, pane: ComparePane, prompt: str, repeats: int = 2) -> None:
    pane.prompt.setPlainText(prompt)
    pane.repeats.setValue(repeats)
    qtbot.mouseClick(pane.run_button, Qt.MouseButton.LeftButton)
    assert pane.running and pane.stop_button.isEnabled() and not pane.run_button.isEnabled()


def wait_saved(qtbot, pane: ComparePane, timeout: int = 30000) -> None:
    qtbot.waitUntil(lambda: not pane.running and pane.shown is not None, timeout=timeout)


def saved(tmp_path: Path):
    with Store(tmp_path / "lanes.db") as store:
        return store.comparisons(None, 50)


def table(t: QTableWidget) -> dict[str, dict[str, str]]:
    heads = [t.horizontalHeaderItem(j).text() for j in range(t.columnCount())]
    return {t.verticalHeaderItem(i).text(): {h: t.item(i, j).text() for j, h in enumerate(heads)}
            for i in range(t.rowCount())}


def test_a_differing_token_is_highlighted_in_both_columns(qtbot, make_pane, tmp_path: Path) -> None:
    pane = make_pane()
    start(qtbot, pane, "Please DIFFER here")
    wait_saved(qtbot, pane)
    assert "Tokens differ" in pane.badge.text()
    assert "first difference at token 9" in pane.difference.text()
    assert "'#'" in pane.difference.text() and "'a'" in pane.difference.text()
    off, on = pane.columns["off"].view, pane.columns["on"].view
    assert off.plain_text() == "Echo: Please DIFFER here" and on.plain_text() == "Echo: Ple#se DIFFER here"
    assert off.highlight == on.highlight == (9, 1)
    assert (off.highlighted_text(), on.highlighted_text()) == ("a", "#")
    cursor = QTextCursor(on.document())
    cursor.setPosition(10)  # the format of the character before position 10: the token at 9
    assert cursor.charFormat().background().color() == QColor(DIFF_TINTS[is_dark(on)])
    assert "first difference at token 9" in pane.columns["on"].showing.text()
    assert pane.verdict.text().startswith("The texts differ; own copy rates on was ")
    assert not pane.details.isVisible()  # the lab detail waits behind its disclosure
    pane.details_button.click()
    assert pane.details.isVisible() and pane.speed_table.isVisible()
    speeds = table(pane.speed_table)
    assert list(speeds) == ["off", "on"] and list(speeds["on"]) == ["round 1", "round 2", "median", "spread", "vs off"]
    assert all(speeds[s][c] != "–" for s in speeds for c in ("round 1", "round 2", "median"))
    [comparison] = saved(tmp_path)
    assert comparison.status == "complete" and len(comparison.runs) == 4
    assert pane.past_ids() == [comparison.id] and pane.export_md.isEnabled()


def test_columns_stream_live_and_stop_saves_what_ran(qtbot, make_pane, tmp_path: Path) -> None:
    pane = make_pane(delay=0.005)
    start(qtbot, pane, "SLOW story", repeats=3)
    qtbot.waitUntil(lambda: pane.spec is not None and len(pane.columns[pane.spec.order(0)[0]].view.plain_text()) > 30,
                    timeout=15000)
    first = pane.spec.order(0)[0]
    shown = len(pane.columns[first].view.plain_text())
    qtbot.waitUntil(lambda: len(pane.columns[first].view.plain_text()) > shown)  # it keeps growing
    assert pane.running and "tok/s" in pane.columns[first].speed.text()
    qtbot.mouseClick(pane.stop_button, Qt.MouseButton.LeftButton)
    wait_saved(qtbot, pane)
    assert pane.run_button.isEnabled() and not pane.stop_button.isEnabled()
    [comparison] = saved(tmp_path)
    assert comparison.status == "cancelled" and comparison.runs[0].status == "cancelled"
    assert "stopped" in pane.columns[first].stats.text()
    assert "Saved as comparison" in pane.status.text()


def test_an_error_shows_in_its_column_and_the_other_runs_on(qtbot, make_pane, tmp_path: Path) -> None:
    pane = make_pane(engine=OnSideFails)
    start(qtbot, pane, "hello there")
    wait_saved(qtbot, pane)
    on, off = pane.columns["on"], pane.columns["off"]
    assert on.stats.text().count("error: the on side broke") == 2
    assert off.view.plain_text() == "Echo: hello there"
    assert off.stats.text().count("tok/s") == 2 and "error" not in off.stats.text()
    assert "Token-equal" in pane.badge.text()  # the two off runs agree
    assert table(pane.speed_table)["on"]["median"] == "–"
    [comparison] = saved(tmp_path)
    assert comparison.status == "error"


def test_past_comparisons_are_listed_newest_first_and_export(qtbot, make_pane, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pane = make_pane()
    for prompt in ("first prompt", "second prompt"):
        start(qtbot, pane, prompt, repeats=1)
        wait_saved(qtbot, pane)
    one, two = sorted(c.id for c in saved(tmp_path))
    assert pane.past_ids() == [two, one] and pane.shown.id == two
    other = make_pane(controller=pane.controller)  # a fresh pane lists them from the store
    qtbot.waitUntil(lambda: other.past_ids() == [two, one])
    pane.past.setCurrentRow(1)
    assert pane.shown.id == one and pane.columns["on"].view.plain_text() == "Echo: first prompt"
    assert "second prompt" in pane.past.item(0).text()

    md, js = tmp_path / "ab.md", tmp_path / "ab.json"
    answers = iter([(str(md), "Markdown (*.md)"), (str(js), "JSON (*.json)")])
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: next(answers))
    pane.export_md.click()
    qtbot.waitUntil(md.exists)
    text = md.read_text()
    assert "| side | round 1 | median | spread |" in text and "| on |" in text
    assert "all 2 complete runs token-equal" in text and pane.verdict.text() in text
    pane.export_json.click()
    qtbot.waitUntil(lambda: js.exists() and js.read_text().endswith("\n"))
    doc = json.loads(js.read_text())
    assert doc["comparison"] == one and doc["token_equal"] is True and len(doc["runs"]) == 2
    assert doc["messages"][-1]["content"] == "first prompt"


def test_the_pane_its_exports_and_transcripts_give_the_same_numbers(qtbot, make_pane, tmp_path: Path) -> None:
    runs = [ComparisonRun("off", 0, 0, "ab", "complete", stats={"tokens_per_s": 40.0}, tokens=(1, 2)),
            # no tokens_per_s (an older or imported run): 23 tokens in 0.5 s is 46.0 everywhere
            ComparisonRun("on", 0, 1, "ab", "complete", stats={"generated": 23, "seconds": 0.5}, tokens=(1, 2)),
            ComparisonRun("on", 1, 0, "ab", "complete", stats={"tokens_per_s": 47.0}, tokens=(1, 2)),
            ComparisonRun("off", 1, 1, "a", "cancelled", stats={"tokens_per_s": 5.0}, tokens=(1,))]
    with Store(tmp_path / "lanes.db") as store:
        cid = store.create_conversation(title="same numbers").id
        c = store.add_comparison([{"role": "user", "content": "q"}], runs, conversation_id=cid, model="m",
                                 settings={"max_tokens": 8, "repeats": 2, "sides": ["off", "on"]}, status="cancelled")
        transcript, page = conversation_to_markdown(store, cid), conversation_to_html(store, cid)
    ab = ("| side | round 1 | round 2 | median | spread |\n|---|---|---|---|---|\n"
          "| off | 40.0 | cancelled | 40.0 | 0.0% |\n| on | 46.0 | 47.0 | 46.5 | 2.2% |\n\n"
          "- on / off: 1.16x (median tok/s)\n- all 3 complete runs token-equal\n")
    assert ab in transcript and ab in markdown_report(c)  # lanes compare prints this same report
    assert "<tr><th>on</th><td>46.0</td><td>47.0</td><td>46.5</td><td>2.2%</td></tr>" in page

    pane = make_pane()
    pane.show_comparison(c)
    speeds = table(pane.speed_table)
    assert speeds["on"] == {"round 1": "46.0", "round 2": "47.0", "median": "46.5", "spread": "2.2%", "vs off": "1.16×"}
    assert speeds["off"]["round 2"] == "cancelled" and speeds["off"]["vs off"] == "1.00×"
    assert pane.ratio.text() == "on / off: 1.16× (median tok/s)" and "Token-equal: all 3" in pane.badge.text()
    assert pane.verdict.text() == report_of(c).verdict() and pane.verdict.text() in markdown_report(c)
    assert "on/off 1.16× · token-equal" in past_label(c)

    doc = json.loads(json_report(c))  # the pane's export is lanes compare --json's document
    assert doc == json.loads(json.dumps(comparison_document(c, None), default=dict))
    assert list(doc) == ["comparison", "model", "device", "status", "created_at", "conversation_id", "settings",
                         "messages", "copy_history", "runs", "summary", "verdict", "token_equal", "first_difference"]
    assert [s["median"] for s in doc["summary"]] == [40.0, 46.5] and doc["token_equal"] is True


def test_the_window_opens_the_pane_on_its_conversation(qtbot, tmp_path: Path) -> None:
    controller = ChatController(tmp_path / "lanes.db", engine_factory=lambda m: FakeEngine(m, 0.002))
    w = MainWindow(controller, Preferences(max_tokens=100), tmp_path / "prefs.json")
    qtbot.addWidget(w)
    w.show()
    try:
        qtbot.waitUntil(lambda: w.send_button.isEnabled())
        w.send("the question")
        qtbot.waitUntil(lambda: w.current is not None and not controller.generating()
                        and len(w.chat.widgets) == 2 and w.chat.widgets[-1].message.status == "complete",
                        timeout=15000)
        assert w.compare_action.shortcut() == QKeySequence("Ctrl+Shift+C")
        w.compare_action.trigger()
        pane = w.findChild(ComparePane)
        assert pane is not None and pane.isVisible() and pane.isWindow()
        # Named as the window's title names it (a first message titles its conversation), not by its id.
        assert pane.use_conversation.isChecked() and pane.use_conversation.text() == "Use “the question”"
        long = "A title made of a first message far longer than the options beside it leave room for"
        pane.set_conversation(w.current, long)
        shown = pane.use_conversation.text()
        assert shown.startswith("Use “A title") and shown.endswith("…”") and len(shown) < len(long)
        assert long in pane.use_conversation.toolTip()
        pane.set_conversation(w.current, "the question")
        assert pane.max_tokens.value() == 100
        controls = pane.findChildren(QWidget)
        kinds = (QPushButton, QCheckBox, QSpinBox, QPlainTextEdit, QListWidget, QTableWidget, QChartView, SideColumn)
        assert all(c.accessibleName() for c in controls if isinstance(c, kinds))
        pane.plain.setChecked(True)
        pane.repeats.setValue(1)
        pane.run()  # no message: the conversation's last one is answered again
        wait_saved(qtbot, pane)
        assert list(pane.columns) == ["off", "on", "plain"]
        assert pane.columns["plain"].view.plain_text() == "Echo: the question"
        [comparison] = saved(tmp_path)
        assert comparison.conversation_id == w.current and comparison.messages[-1]["content"] == "the question"
        w.compare_action.trigger()
        assert w.findChildren(ComparePane) == [pane]  # one pane per window, shown again
    finally:
        w.close()


@pytest.mark.model
def test_the_pane_on_the_real_model(qtbot, loaded, tmp_path: Path) -> None:
    from engine.rounds.engine_thread import Engine

    controller = ChatController(tmp_path / "lanes.db",
                                engine_factory=lambda _m: Engine(loader=lambda _s: loaded, calibrate=False))
    try:
        qtbot.waitUntil(lambda: controller.info is not None and controller.decode([1]) != "", timeout=120000)
        pane = ComparePane(controller, None, 256)
        qtbot.addWidget(pane)
        pane.show()
        pane.max_tokens.setValue(32)
        start(qtbot, pane, COPY, repeats=2)
        wait_saved(qtbot, pane, timeout=300000)
        assert "Token-equal: all 4 finished runs" in pane.badge.text(), pane.difference.text()
        speeds = table(pane.speed_table)
        assert list(speeds) == ["off", "on"]
        for side in speeds:
            assert all(float(speeds[side][c]) > 0 for c in ("round 1", "round 2", "median"))
        assert speeds["off"]["vs off"] == "1.00×" and "on / off:" in pane.ratio.text()
        [comparison] = saved(tmp_path)
        assert comparison.status == "complete" and sorted(r.side for r in comparison.runs) == ["off", "off", "on", "on"]
        assert len({r.content for r in comparison.runs}) == 1
        assert pane.columns["on"].view.plain_text() == comparison.runs[-1].content
        on_rates = [r.rates for r in comparison.runs if r.side == "on" and r.rates]
        if on_rates:  # the copy-friendly prompt copies: its "on" rates are drawn, one line per source
            assert pane.chart.series_names() == list(dict.fromkeys(p["source"] for p in on_rates[-1]))
        assert pane.past_ids() == [comparison.id]
        rows = table(pane.rows_table)
        assert rows and all(int(v["tested"]) >= int(v["accepted"]) for v in rows.values())
    finally:
        controller.close()


def test_the_rate_chart_follows_the_on_side_while_it_streams(qtbot, make_pane) -> None:
    pane = make_pane(delay=0.01)
    start(qtbot, pane, "SLOW copy", repeats=1)
    qtbot.waitUntil(lambda: "live" in pane.chart.chart().title() and bool(pane.chart.points("context")),
                    timeout=30000)
    assert pane.running  # drawn before the run ended
    pane.stop()
    wait_saved(qtbot, pane)
