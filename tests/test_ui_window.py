"""The chat window driven with pytest-qt, on a scripted fake engine (tests/fake_engine.py) and the
real store; tests/test_ui_e2e.py drives it on the real model."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QAbstractButton, QLineEdit, QListView, QMessageBox, QPlainTextEdit

from app import questions
from app.chat_view import MessageWidget
from app.controller import ChatController
from app.main_window import MainWindow
from app.preferences import Preferences, load_preferences
from engine.store.records import Message
from engine.store.store import Store
from tests.fake_engine import INFO, FakeEngine


def messages(tmp_path: Path, conversation_id: int):
    with Store(tmp_path / "lanes.db") as store:
        return store.messages(conversation_id)


def last_reply(w: MainWindow):
    return w.chat.widgets[-1].message if w.chat.widgets else None


def wait_reply_saved(qtbot, w: MainWindow, status: str = "complete") -> None:
    qtbot.waitUntil(lambda: (m := last_reply(w)) is not None and m.role == "assistant" and m.status == status,
                    timeout=15000)


def test_enter_sends_shift_enter_adds_a_line_and_the_reply_streams_into_the_store(qtbot, make_window,
                                                                                 tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    qtbot.keyClicks(w.composer, "first line")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(w.composer, "second line")
    assert w.composer.toPlainText() == "first line\nsecond line"  # not sent
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert w.composer.toPlainText() == ""
    wait_reply_saved(qtbot, w)
    reply = last_reply(w)
    assert reply.content == "Echo: first line\nsecond line"
    assert "tok/s" in w.chat.widgets[-1].stats.text()
    assert "Copy drafts from this conversation" in w.chat.widgets[-1].stats.toolTip()
    saved = messages(tmp_path, w.current)
    assert [(m.role, m.status) for m in saved] == [("user", "complete"), ("assistant", "complete")]
    assert w.sidebar.model.rows[0].title == "first line"


def test_two_conversations_generate_at_once_and_switching_loses_nothing(qtbot, make_window,
                                                                       tmp_path: Path) -> None:
    w = make_window(delay=0.02)  # each reply takes ~8 s: long enough to switch while both stream
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("A SLOW")
    qtbot.waitUntil(lambda: w.current is not None and bool(w.controller.generating()))
    a = w.current
    w.new_conversation()
    w.send("B SLOW")
    qtbot.waitUntil(lambda: len(w.controller.generating()) == 2)
    b = w.current
    assert "Generating in 2 conversations" in w.generating_label.text()
    qtbot.waitUntil(lambda: sum(1 for r in w.sidebar.model.rows if r.id in w.sidebar.model.generating) == 2)
    w.sidebar.select(a)  # back to A while both stream
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2 and w.chat.widgets[0].message.conversation_id == a)
    shown = w.chat.widgets[-1]
    assert a in w.controller.generating()  # still streaming when shown again
    qtbot.waitUntil(lambda: len(shown.view.plain_text()) > 30)  # A's stream continues in view
    qtbot.waitUntil(lambda: not w.controller.generating(), timeout=30000)
    for cid, text in ((a, "A SLOW"), (b, "B SLOW")):
        _user, reply = messages(tmp_path, cid)
        assert reply.status == "complete" and reply.content == "Echo: " + text * 200
    assert last_reply(w).content == "Echo: " + "A SLOW" * 200  # the view followed to the end


def test_esc_stops_the_reply_and_keeps_its_text(qtbot, make_window, tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("SLOW story")
    qtbot.waitUntil(lambda: w.stop_button.isEnabled() and len(w.chat.widgets) == 2
                    and bool(w.chat.widgets[-1].view.plain_text()))
    assert w.stop_action.shortcut() == QKeySequence("Esc")
    w.stop_action.trigger()
    wait_reply_saved(qtbot, w, status="cancelled")
    reply = messages(tmp_path, w.current)[-1]
    assert reply.status == "cancelled" and len(reply.content) >= 3 and ("Echo: " + "SLOW story" * 200).startswith(reply.content)
    assert "(stopped)" in w.chat.widgets[-1].stats.text()
    assert not w.stop_button.isEnabled()


def test_an_error_shows_in_its_message_with_retry_and_the_others_continue(qtbot, make_window,
                                                                          tmp_path: Path) -> None:
    w = make_window(delay=0.005)
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("ok SLOW")
    qtbot.waitUntil(lambda: bool(w.controller.generating()))
    ok = w.current
    w.new_conversation()
    w.send("please FAIL")
    wait_reply_saved(qtbot, w, status="error")
    widget = w.chat.widgets[-1]
    assert widget.retry_button.isVisible() and "told to fail" in widget.stats.text()
    assert ok in w.controller.generating()  # the other reply is still running
    n = len(w.controller.service.engine.requests)
    qtbot.mouseClick(widget.retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.controller.service.engine.requests) == n + 1)
    qtbot.waitUntil(lambda: not w.controller.generating(), timeout=30000)
    assert messages(tmp_path, ok)[-1].status == "complete"
    failed = messages(tmp_path, w.current)
    assert [(m.role, m.status, m.versions) for m in failed] == [("user", "complete", 1), ("assistant", "error", 1)]
    assert failed[-1].id == widget.message.id  # the failure was written over, not kept as a version


def test_regenerate_replaces_the_last_reply_and_edit_resends(qtbot, make_window, tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("one")
    wait_reply_saved(qtbot, w)
    w.regenerate_action.trigger()
    qtbot.waitUntil(lambda: len(w.controller.service.engine.requests) == 2)
    qtbot.waitUntil(lambda: not w.controller.generating())
    wait_reply_saved(qtbot, w)
    assert [m.content for m in messages(tmp_path, w.current)] == ["one", "Echo: one"]
    w.controller.edit_last(w.current, "two", w.prefs.reply_settings())
    qtbot.waitUntil(lambda: (m := last_reply(w)) is not None and m.content == "Echo: two" and m.status == "complete")
    assert [m.content for m in messages(tmp_path, w.current)] == ["two", "Echo: two"]
    # Neither overwrote anything: the reply shows < 3/3 >, and the earlier ones come back with their question.
    reply = w.chat.widgets[-1]
    assert reply.version_label.isVisible() and reply.version_label.text() == "3/3"
    assert reply.older_button.isEnabled() and not reply.newer_button.isEnabled()
    qtbot.mouseClick(reply.older_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.chat.widgets[-1].version_label.text() == "2/3")
    qtbot.mouseClick(w.chat.widgets[-1].older_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.chat.widgets[-1].version_label.text() == "1/3")
    assert [x.message.content for x in w.chat.widgets] == ["one", "Echo: one"]
    assert [m.content for m in messages(tmp_path, w.current)] == ["one", "Echo: one"]
    assert not w.chat.widgets[-1].older_button.isEnabled()
    assert not w.chat.widgets[0].version_label.isVisible()  # the switcher sits on the reply alone
    assert reply is w.chat.widgets[-1]  # redrawn in place, not reloaded: the chat keeps its scroll position


def test_retrying_a_failed_version_keeps_the_earlier_ones(qtbot, make_window, tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("one")
    wait_reply_saved(qtbot, w)
    w.controller.edit_last(w.current, "please FAIL", w.prefs.reply_settings())
    qtbot.waitUntil(lambda: (m := last_reply(w)) is not None and m.status == "error" and m.version == 2)
    qtbot.mouseClick(w.chat.widgets[-1].retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.controller.service.engine.requests) == 3)
    qtbot.waitUntil(lambda: not w.controller.generating())
    reply = messages(tmp_path, w.current)[-1]
    assert (reply.status, reply.version, reply.versions) == ("error", 2, 2)  # written over, not a third
    with Store(tmp_path / "lanes.db") as store:
        assert [(v.number, v.prompt, v.content) for v in store.versions(reply.id)] == [(1, "one", "Echo: one")]


def test_delete_asks_first(qtbot, make_window, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("keep me?")
    wait_reply_saved(qtbot, w)
    cid = w.current
    qtbot.waitUntil(lambda: w.sidebar.model.row_of(cid) >= 0)
    monkeypatch.setattr(questions, "confirm", lambda *a, **k: False)
    w.sidebar.delete(cid)
    qtbot.wait(100)
    assert w.sidebar.model.row_of(cid) >= 0
    monkeypatch.setattr(questions, "confirm", lambda *a, **k: True)
    w.sidebar.delete(cid)
    qtbot.waitUntil(lambda: w.sidebar.model.row_of(cid) < 0)
    assert w.current is None and w.chat.widgets == []
    with Store(tmp_path / "lanes.db") as store:
        assert store.count_conversations() == 0
    assert w.controller.service.engine.forgotten == [f"c{cid}"]  # its KV cache, in memory and on disk


def test_a_conversation_deleted_before_the_model_loads_takes_its_kv_files_along(qtbot, tmp_path: Path,
                                                                               monkeypatch) -> None:
    from engine.model import kv_files

    with Store(tmp_path / "lanes.db") as store:
        conv = store.create_conversation(title="Long chat")
    kept = kv_files.folder(tmp_path) / "some-model" / kv_files.file_name(conv.key)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"a saved KV cache")
    w = MainWindow(ChatController(tmp_path / "lanes.db", None, engine_factory=LateEngine), Preferences(),
                   tmp_path / "prefs.json")
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.sidebar.model.row_of(conv.id) >= 0)
    assert w.controller.info is None  # still loading
    monkeypatch.setattr(questions, "confirm", lambda *a, **k: True)
    w.sidebar.delete(conv.id)
    qtbot.waitUntil(lambda: w.sidebar.model.row_of(conv.id) < 0)
    assert not kept.exists()
    w.close()


def test_search_filters_the_sidebar(qtbot, make_window, tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store:
        for title, text in (("Boats", "lighthouse keeper"), ("Cakes", "sponge recipe"), ("Birds", "albatross")):
            c = store.create_conversation(title=title)
            store.add_message(c.id, "user", text)
    w = make_window()
    qtbot.waitUntil(lambda: len(w.sidebar.model.rows) == 3)
    w.sidebar.focus_search()
    qtbot.keyClicks(w.sidebar.search, "sponge")
    qtbot.waitUntil(lambda: [r.title for r in w.sidebar.model.rows] == ["Cakes"])
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: len(w.sidebar.model.rows) == 3)


def test_ten_thousand_conversations_load_a_page_at_a_time(qtbot, make_window, tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store, store.write():
        store.db.conn.executemany(
            "INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
            [(f"Conversation {i}", float(i), float(i)) for i in range(10_000)])
    w = make_window()
    qtbot.waitUntil(lambda: len(w.sidebar.model.rows) > 0)
    assert len(w.sidebar.model.rows) == 200  # only a page: the rest comes as the list scrolls
    assert w.sidebar.model.rows[0].title == "Conversation 9999"
    w.sidebar.list.scrollToBottom()
    qtbot.waitUntil(lambda: len(w.sidebar.model.rows) >= 400)


def test_a_saved_model_that_fails_at_launch_falls_back_to_the_embedded_one_and_stays_in_settings(
        qtbot, make_window, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _parent, _title, text, *a: shown.append(text))
    w = make_window(fail_models=("/models/missing",), model="/models/missing")
    qtbot.waitUntil(lambda: bool(shown) and w.send_button.isEnabled())
    assert "/models/missing" in shown[0] and "embedded" in shown[0] and "Settings" in shown[0]
    assert w.controller.service.engine.model is None  # the embedded model answers
    assert w.prefs.model == "/models/missing"  # the bad value is kept for the user to see
    w.close()
    saved, _warnings = load_preferences(tmp_path / "prefs.json")
    assert saved.model == "/models/missing"


def test_a_model_that_cannot_work_is_refused_before_the_working_one_is_unloaded(
        qtbot, make_window, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _parent, _title, text, *a: shown.append(text))
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    engine = w.controller.service.engine
    w.prefs.model = "nobody/does-not-exist"  # as the settings dialog leaves it before the switch
    w.controller.switch_model("nobody/does-not-exist")
    qtbot.waitUntil(lambda: bool(shown))
    assert "nobody/does-not-exist" in shown[0] and "Hugging Face cache" in shown[0]
    assert w.controller.service.engine is engine and not engine.closed  # nothing was unloaded
    assert w.send_button.isEnabled() and w.prefs.model is None  # the setting went back, and was saved
    assert load_preferences(tmp_path / "prefs.json")[0].model is None
    w.send("still here")
    wait_reply_saved(qtbot, w)
    assert last_reply(w).content == "Echo: still here"


def test_a_reply_held_back_by_the_memory_limits_says_so_then_runs(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("WAIT for me")
    qtbot.waitUntil(lambda: "waits to start" in w.statusBar().currentMessage())
    assert "the most Fake-Echo runs at once" in w.statusBar().currentMessage()
    wait_reply_saved(qtbot, w)
    assert last_reply(w).content == "Echo: WAIT for me"


def test_a_notice_about_the_chat_template_shows_in_the_status_bar(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("NOTE this")
    qtbot.waitUntil(lambda: "takes no system prompt" in w.statusBar().currentMessage())
    wait_reply_saved(qtbot, w)
    assert last_reply(w).content == "Echo: NOTE this"


def test_closing_mid_reply_saves_it_partial(qtbot, make_window, tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("SLOW goodbye")
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2 and bool(w.chat.widgets[-1].view.plain_text()))
    cid = w.current
    w.close()
    reply = messages(tmp_path, cid)[-1]
    assert reply.status == "partial" and len(reply.content) >= 3 and ("Echo: " + "SLOW goodbye" * 200).startswith(reply.content)
    with Store(tmp_path / "lanes.db") as store:
        assert store.copy_history(cid) == {"context": {"accepted": 3.0, "tested": 4.0}}
    assert not w.controller.service.tasks


def test_streamed_text_is_coalesced_not_repainted_per_event(qtbot, make_window) -> None:
    w = make_window(delay=0.0005)  # a token event every half millisecond
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    updates: list[object] = []
    w.controller.liveUpdated.connect(updates.append)
    w.send("SLOW " * 5)
    qtbot.waitUntil(lambda: not w.controller.generating() and bool(updates), timeout=30000)
    events = len("Echo: " + "SLOW " * 5 * 200) // 3
    assert len(updates) < events / 5  # one update per 33 ms tick gathers many events


def test_colouring_by_origin_shows_a_legend_and_tints_copied_text(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("copy me")
    wait_reply_saved(qtbot, w)
    assert not w.legend.isVisible()
    w.origins_action.trigger()
    assert w.legend.isVisible() and w.prefs.show_origins
    view = w.chat.widgets[-1].view
    assert view.plain_text() == "Echo: copy me"
    doc = view.document()
    backgrounds = set()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            backgrounds.add((frag.text(), frag.charFormat().background().style() != Qt.BrushStyle.NoBrush))
            it += 1
        block = block.next()
    assert ("copy me", True) in backgrounds and ("Echo: ", False) in backgrounds


def test_every_control_has_an_accessible_name_and_the_shortcuts_exist(make_window) -> None:
    w = make_window()
    for cls in (QAbstractButton, QLineEdit, QPlainTextEdit, QListView):
        for child in w.findChildren(cls):
            if child.isVisibleTo(w) and not child.objectName().startswith("qt_"):
                assert child.accessibleName(), f"{cls.__name__} {child.text() if hasattr(child, 'text') else ''}"
    shortcuts = {a.text(): a.shortcut() for a in w.findChildren(type(w.new_action))}
    assert shortcuts["New Conversation"] == QKeySequence(QKeySequence.StandardKey.New)
    assert shortcuts["Search Conversations"] == QKeySequence(QKeySequence.StandardKey.Find)
    assert not shortcuts["Settings…"].isEmpty() and not shortcuts["Export Conversation…"].isEmpty()
    assert shortcuts["Stop Reply"] == QKeySequence("Esc")


def test_copy_puts_the_message_on_the_clipboard(qtbot, make_window) -> None:
    from PySide6.QtGui import QGuiApplication

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("clip this")
    wait_reply_saved(qtbot, w)
    qtbot.mouseClick(w.chat.widgets[-1].copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "Echo: clip this"


def test_settings_are_applied_saved_and_switch_the_model(qtbot, make_window, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from app import main_window
    from app.preferences import load_preferences

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF\x03\x00\x00\x00")  # a switch checks the file before unloading anything
    chosen = Preferences(model=str(other), max_tokens=7, temperature=0.5, recall_other_conversations=False,
                         system_prompt="Be brief.")
    monkeypatch.setattr(main_window.SettingsDialog, "exec", lambda self: True)
    monkeypatch.setattr(main_window.SettingsDialog, "preferences", lambda self: chosen)
    w.open_settings()
    saved, _warnings = load_preferences(tmp_path / "prefs.json")
    assert (saved.model, saved.max_tokens, saved.temperature, saved.system_prompt) == (
        str(other), 7, 0.5, "Be brief.")
    qtbot.waitUntil(lambda: w.send_button.isEnabled() and w.controller.service.engine.model == str(other))
    with Store(tmp_path / "lanes.db") as store:
        qtbot.waitUntil(lambda: store.recall_other_conversations is False)
    w.send("hello")
    wait_reply_saved(qtbot, w)
    request = w.controller.service.engine.requests[-1]
    assert (request.max_tokens, request.temperature, request.recall) == (7, 0.5, False)
    assert request.messages[0] == {"role": "system", "content": "Be brief."}


def test_export_from_the_menu_writes_escaped_html_and_all_as_json(qtbot, make_window, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("<script>alert(1)</script>")
    wait_reply_saved(qtbot, w)
    page = tmp_path / "out" / "chat.html"
    page.parent.mkdir()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(page), "HTML (*.html)"))
    w.files.export_current()
    qtbot.waitUntil(page.exists)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.read_text() and "<script>" not in page.read_text()
    folder = tmp_path / "all"
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    w.files.export_all()
    qtbot.waitUntil(lambda: (folder / f"conversation-{w.current}.json").exists())


def test_deleting_a_conversation_while_it_replies_stops_it_first(qtbot, make_window, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    failures: list[str] = []
    w.controller.replyFailed.connect(lambda _cid, why: failures.append(why))
    w.send("SLOW and then gone")
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2 and bool(w.chat.widgets[-1].view.plain_text()))
    cid = w.current
    monkeypatch.setattr(questions, "confirm", lambda *a, **k: True)
    w.sidebar.delete(cid)
    qtbot.waitUntil(lambda: w.sidebar.model.row_of(cid) < 0 and not w.controller.generating())
    qtbot.wait(100)
    assert failures == []
    assert f"c{cid}" not in w.controller.service.engine.recall  # nothing of it went back into Recall
    with Store(tmp_path / "lanes.db") as store:
        assert store.count_conversations() == 0


def test_statistics_of_any_shape_never_break_a_message(qtbot) -> None:
    from engine.store.render import stats_line

    assert stats_line({"tokens_per_s": None, "first_token_s": "soon", "rows": [1, 2]}, None) == ""
    assert stats_line({"rows": {"context": {"tested": "x"}}}, None) == "no copied rows"
    assert stats_line(["not", "a", "mapping"], None) == ""  # type: ignore[arg-type]
    w = MessageWidget(Message(1, 1, "assistant", "hi", stats={"generated": "lots", "rows": 3}), lambda m: [], False)
    assert "Error" not in w.stats.text()


def test_turning_recall_on_mid_session_feeds_the_stored_conversations(qtbot, make_window,
                                                                      tmp_path: Path) -> None:
    from engine.store.store import RECALL_SETTING

    with Store(tmp_path / "lanes.db") as store:
        old = store.create_conversation(title="old")
        store.add_message(old.id, "assistant", "earlier text", tokens=[1, 2, 3], tokens_model="Fake-Echo")
        store.set_setting(RECALL_SETTING, False)
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    qtbot.wait(200)
    assert w.controller.service.engine.recall == {}  # off at start: nothing fed
    w.controller.set_recall_other_conversations(True)
    qtbot.waitUntil(lambda: w.controller.service.engine.recall.get(old.key) == [1, 2, 3])


class LateEngine(FakeEngine):
    """A model whose load finishes only when told (to race a model switch against it)."""

    def __init__(self, model: str | None = None, *args: object, **kw: object) -> None:
        super().__init__(model)
        self.loaded = Future()

    def finish_loading(self) -> None:
        self.loaded.set_result(INFO)


def test_a_replaced_model_that_finishes_loading_late_is_not_shown(qtbot, tmp_path: Path) -> None:
    engines: list[FakeEngine] = []

    def factory(model: str | None) -> FakeEngine:
        engines.append(LateEngine(model) if model == "/slow" else FakeEngine(model))
        return engines[-1]

    controller = ChatController(tmp_path / "lanes.db", "/slow", engine_factory=factory)
    w = MainWindow(controller, Preferences(), tmp_path / "prefs.json")
    qtbot.addWidget(w)
    loaded: list[str] = []
    controller.modelLoaded.connect(lambda info: loaded.append(controller.service.engine.model or "embedded"))
    controller.switch_model(None)  # replace it while it is still loading
    engines[0].finish_loading()  # the old one's load ends late
    qtbot.waitUntil(lambda: len(engines) == 2 and w.send_button.isEnabled())
    qtbot.wait(200)
    assert loaded == ["embedded"]  # only the new model was announced
    w.close()
