"""The window's rough edges a new user hit (issue 30), each driven as a person would: the model's
loading state, the conversation's header, line breaks, keyboard use, scrolling, the statistics line.
On the scripted fake engine (tests/fake_engine.py) and the real store."""

from __future__ import annotations

import json
import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication

from app import questions
from app.compare_pane import ComparePane
from app.controller import ChatController
from app.main_window import LOADING, READY, MainWindow
from app.message_view import MessageView
from app.preferences import Preferences
from app.sidebar import SnippetRole, WhenRole
from engine.store.markdown_text import with_line_breaks
from engine.store.render import stats_explained, stats_summary
from engine.store.store import Store
from tests.fake_engine import INFO, FakeEngine
from tests.test_ui_window import LateEngine, last_reply, wait_reply_saved


def send_and_wait(qtbot, w: MainWindow, text: str) -> None:
    """Send ``text`` and wait for its reply to be saved (not an earlier one's)."""
    shown = len(w.chat.widgets)
    w.send(text)
    qtbot.waitUntil(lambda: len(w.chat.widgets) == shown + 2)
    wait_reply_saved(qtbot, w)


HAIKU = "An old silent pond\nA frog jumps into the pond\nSplash! Silence again"


def slow_window(qtbot, tmp_path: Path) -> tuple[MainWindow, list[FakeEngine]]:
    engines: list[FakeEngine] = []

    def factory(model: str | None) -> FakeEngine:
        engines.append(LateEngine(model))
        return engines[-1]

    w = MainWindow(ChatController(tmp_path / "lanes.db", None, engine_factory=factory), Preferences(),
                   tmp_path / "prefs.json")
    qtbot.addWidget(w)
    w.show()
    return w, engines


def test_while_the_model_loads_enter_keeps_the_message_and_sends_it_once_ready(qtbot, tmp_path: Path) -> None:
    w, engines = slow_window(qtbot, tmp_path)
    assert w.composer.placeholderText() == LOADING and not w.stop_button.isEnabled()
    assert QApplication.focusWidget() is w.composer or w.composer.hasFocus() or w.focusWidget() is w.composer
    qtbot.keyClicks(w.composer, "Hello there")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert w.composer.toPlainText() == "" and "sent as soon as it is ready" in w.statusBar().currentMessage()
    assert w.stop_button.isEnabled()  # Stop takes it back
    engines[0].finish_loading()
    qtbot.waitUntil(lambda: w.composer.placeholderText() == READY)
    wait_reply_saved(qtbot, w)
    assert [m.content for m in (wi.message for wi in w.chat.widgets)] == ["Hello there", "Echo: Hello there"]
    w.close()


def test_stop_while_loading_puts_the_unsent_message_back(qtbot, tmp_path: Path) -> None:
    w, engines = slow_window(qtbot, tmp_path)
    qtbot.keyClicks(w.composer, "Never mind")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    w.stop_action.trigger()  # Esc
    assert w.composer.toPlainText() == "Never mind" and not w.stop_button.isEnabled()
    engines[0].finish_loading()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    qtbot.wait(100)
    assert not w.chat.widgets  # nothing was sent
    w.close()


def test_the_header_follows_the_first_message_and_a_rename(qtbot, make_window, tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    assert w.title.text() == "New conversation"
    qtbot.keyClicks(w.composer, "Plan a picnic")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_reply_saved(qtbot, w)
    qtbot.waitUntil(lambda: w.title.text() == "Plan a picnic")
    assert w.windowTitle() == "Plan a picnic — Lanes"

    def answer_rename() -> None:
        dialog = w.sidebar.rename_dialog
        assert dialog is not None and dialog.width() >= 480  # a long title is not cut
        dialog.setTextValue("Picnic, Saturday")
        dialog.accept()

    qtbot.waitUntil(lambda: w.sidebar.model.rows and w.sidebar.model.rows[0].title == "Plan a picnic")

    QTimer.singleShot(200, answer_rename)
    qtbot.keyClick(w, Qt.Key.Key_F2)  # F2 renames the shown conversation
    qtbot.waitUntil(lambda: w.title.text() == "Picnic, Saturday")
    with Store(tmp_path / "lanes.db") as store:
        assert store.conversation(w.current).title == "Picnic, Saturday"


def test_a_long_title_is_cut_in_the_header_and_never_squeezes_the_sidebar(qtbot, make_window) -> None:
    w = make_window()
    w.resize(1100, 600)
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    sidebar = w.split.sizes()[0]
    title = "Write a markdown table of six programming languages with columns for the year, the creator and notes"
    w._show_title(title)
    qtbot.wait(50)  # the layout takes in the new title's size
    w.resize(760, 600)  # narrower than the whole title needs beside the sidebar
    qtbot.wait(50)
    assert w.width() == 760 and w.split.sizes()[0] == sidebar  # the chat gave up the width, not the list
    assert w.title.text() == title and w.title.toolTip() == title
    assert w.title.elided().endswith("…") and title.startswith(w.title.elided()[:-1])
    w.resize(1400, 600)
    qtbot.waitUntil(lambda: w.title.elided() == title)
    assert w.title.toolTip() == ""


def test_single_line_breaks_stay_line_breaks_outside_code() -> None:
    assert with_line_breaks("Roses\nViolets\n\nNew paragraph") == "Roses  \nViolets\n\nNew paragraph"
    code = "```py\na = 1\nb = 2\n```\nafter"
    assert with_line_breaks(code) == code  # code keeps its own lines; nothing follows the fence's last line
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    assert with_line_breaks(table) == table
    assert with_line_breaks("ends\\\nhard  \nalready") == "ends\\\nhard  \nalready"


def test_a_haiku_shows_as_three_lines(qtbot) -> None:
    view = MessageView()
    qtbot.addWidget(view)
    view.set_markdown(HAIKU)
    shown = view.document().toPlainText().replace("\u2028", "\n")
    assert shown.splitlines() == HAIKU.splitlines()
    assert view.plain_text() == HAIKU  # Copy gives the text as written


def test_escape_clears_the_search_before_it_stops_anything(qtbot, make_window) -> None:
    w = make_window()
    w.sidebar.focus_search()
    qtbot.keyClicks(w.sidebar.search, "picnic")
    qtbot.keyClick(w.sidebar.search, Qt.Key.Key_Escape)
    assert w.sidebar.search.text() == ""


def test_escape_closes_the_comparison_window_and_it_fits_the_screen(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.compare_action.trigger()
    pane = w.findChild(ComparePane)
    assert pane is not None and pane.isVisible()
    room = pane.screen().availableGeometry()
    assert pane.height() <= room.height() and pane.width() <= room.width()
    qtbot.keyClick(pane, Qt.Key.Key_Escape)
    assert not pane.isVisible()


def test_sending_while_scrolled_up_jumps_to_the_new_message(qtbot, make_window) -> None:
    w = make_window()
    w.resize(700, 420)
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    for i in range(4):
        send_and_wait(qtbot, w, f"Message {i}\n" + "line\n" * 12)
    bar = w.chat.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    bar.setValue(0)
    qtbot.waitUntil(lambda: w.chat.latest_button.isVisible())  # a way back down
    qtbot.keyClicks(w.composer, "And one more")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() and bar.maximum() > 0)
    wait_reply_saved(qtbot, w)
    qtbot.waitUntil(lambda: not w.chat.latest_button.isVisible())
    bar.setValue(0)
    qtbot.waitUntil(lambda: w.chat.latest_button.isVisible())
    qtbot.mouseClick(w.chat.latest_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())


def test_page_keys_in_a_message_scroll_the_chat(qtbot, make_window) -> None:
    w = make_window()
    w.resize(700, 420)
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.composer.setPlainText("Long\n" + "line\n" * 40)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_reply_saved(qtbot, w)
    bar = w.chat.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    view = w.chat.widgets[0].view
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_Home, Qt.KeyboardModifier.ControlModifier)
    assert bar.value() == 0
    qtbot.keyClick(view, Qt.Key.Key_PageDown)
    assert bar.value() > 0
    qtbot.keyClick(view, Qt.Key.Key_End, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())


def test_the_statistics_line_is_plain_words_with_a_tooltip_for_each_figure(qtbot, make_window) -> None:
    stats = {"generated": 120, "seconds": 3.0, "first_token_s": 0.21, "reason": "length",
             "rows": {"context": {"accepted": 30, "tested": 40, "granted": 40}}}
    line = stats_summary(stats, "m" * 65 + "c" * 30 + "r" * 5)
    assert line == "120 tokens · 40.0 tok/s · first token 0.21 s · 35% copied · hit the length limit"
    assert "eos" not in stats_summary({**stats, "reason": "eos"}, None)  # the model's own end goes unsaid
    tip = stats_explained(stats, "m" * 65 + "c" * 30 + "r" * 5)
    assert "30% from this conversation, 5% from other conversations" in tip
    assert "Copy drafts from this conversation: 30 of 40 proposed tokens accepted." in tip
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    qtbot.keyClicks(w.composer, "Say it twice: the cat, the cat")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    wait_reply_saved(qtbot, w)
    label = w.chat.widgets[-1].stats
    assert "tok/s" in label.text() and "rows" not in label.text() and "eos" not in label.text()
    assert "tokens written per second" in label.toolTip()
    assert last_reply(w) is not None


def test_the_sidebar_shows_plain_titles_with_when_and_a_search_says_what_it_found(qtbot, make_window,
                                                                                tmp_path: Path) -> None:
    with Store(tmp_path / "lanes.db") as store:
        c = store.create_conversation(title="What does `ls -l` *print*?", updated_at=time.time() - 60)
        store.add_message(c.id, "user", "What does ls -l print in a lighthouse?")
        store.create_conversation(title="Old one", updated_at=time.mktime((2025, 3, 9, 12, 0, 0, 0, 0, -1)))
    w = make_window()
    model = w.sidebar.model
    qtbot.waitUntil(lambda: model.rowCount() == 2)
    assert model.index(0, 0).data() == "What does ls -l print?"
    assert model.index(0, 0).data(WhenRole) == time.strftime("%H:%M", time.localtime(model.rows[0].updated_at))
    assert model.index(1, 0).data(WhenRole) == "9 Mar 2025"
    assert model.index(0, 0).data(SnippetRole) == ""  # no search, no snippet
    w.sidebar.list.grab()  # the delegate paints both rows without error
    qtbot.keyClicks(w.sidebar.search, "lighthouse")
    qtbot.waitUntil(lambda: model.rowCount() == 1)
    assert "[lighthouse]" in model.index(0, 0).data(SnippetRole)
    assert not w.sidebar.no_results.isVisible()
    w.sidebar.search.clear()
    qtbot.keyClicks(w.sidebar.search, "zeppelin")
    qtbot.waitUntil(lambda: w.sidebar.no_results.isVisible())
    assert w.sidebar.no_results.text() == "No conversation mentions “zeppelin”."


def test_an_empty_list_says_there_is_no_conversation_yet_until_one_starts(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.sidebar.no_results.isVisible())  # a first run: the list is empty, and says why
    assert w.sidebar.no_results.text() == "No conversations yet: your first message starts one."
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    send_and_wait(qtbot, w, "hello")
    qtbot.waitUntil(lambda: w.sidebar.model.rowCount() == 1)
    assert not w.sidebar.no_results.isVisible()


def test_each_conversation_keeps_its_own_unsent_draft(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    for text in ("first", "second"):
        w.new_action.trigger()
        w.send(text)
        wait_reply_saved(qtbot, w)
    second = w.current
    qtbot.waitUntil(lambda: w.sidebar.model.rowCount() == 2)
    first = w.sidebar.model.rows[1].id
    qtbot.keyClicks(w.composer, "half a thought")
    w.sidebar.select(first)
    qtbot.waitUntil(lambda: w.current == first)
    assert w.composer.toPlainText() == ""  # the draft does not follow into another chat
    qtbot.keyClicks(w.composer, "another draft")
    w.sidebar.select(second)
    qtbot.waitUntil(lambda: w.current == second)
    assert w.composer.toPlainText() == "half a thought"
    w.sidebar.select(first)
    qtbot.waitUntil(lambda: w.current == first)
    assert w.composer.toPlainText() == "another draft"


def test_copy_says_it_copied_and_the_edit_menu_copies_the_last_reply(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("clip this")
    wait_reply_saved(qtbot, w)
    button = w.chat.widgets[-1].copy_button
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert button.text() == "Copied ✓"
    qtbot.waitUntil(lambda: button.text() == "Copy", timeout=3000)
    QApplication.clipboard().clear()
    edit = w._menus["&Edit"]
    actions = {a.text(): a for a in edit.actions()}
    assert {"Cut", "Copy", "Paste", "Select All", "Copy Last Reply", "Search Conversations"} <= set(actions)
    actions["Copy Last Reply"].trigger()
    assert QApplication.clipboard().text() == "Echo: clip this"
    w.composer.setFocus()
    QApplication.clipboard().setText("pasted")
    actions["Paste"].trigger()
    assert w.composer.toPlainText() == "pasted"


def test_a_long_prompt_shows_how_far_it_was_read_then_the_context_it_fills(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    assert w.context_label.text() == ""
    seen: list[str] = []
    w.controller.replyReading.connect(lambda *_a: seen.append(w.chat.widgets[-1].stats.text()))
    w.send("READ this long file")
    qtbot.waitUntil(lambda: len(seen) == 3)
    assert seen[-1] == "Reading the conversation: 384 of 512 tokens (75%) · Esc stops"
    wait_reply_saved(qtbot, w)
    reply = last_reply(w)
    used = reply.stats["prompt_tokens"] + reply.stats["generated"]
    assert w.context_label.text() == f"{used:,} of {INFO.context_length:,} tokens"
    w.new_action.trigger()
    assert w.context_label.text() == ""
    w.sidebar.select(reply.conversation_id)
    qtbot.waitUntil(lambda: w.context_label.text() == f"{used:,} of {INFO.context_length:,} tokens")  # also when reopened


def test_a_conversation_opened_while_the_model_loads_shows_its_context_once_it_has(qtbot, tmp_path: Path) -> None:
    """The share of the context needs the model's context length: a conversation opened before the
    model has loaded shows it as the model arrives (it used to stay blank until reopened)."""
    with Store(tmp_path / "lanes.db") as store:
        conv = store.create_conversation(title="Earlier chat")
        store.add_message(conv.id, "user", "a question")
        store.add_message(conv.id, "assistant", "an answer", stats={"prompt_tokens": 40, "generated": 12})
    w, engines = slow_window(qtbot, tmp_path)
    qtbot.waitUntil(lambda: w.sidebar.model.row_of(conv.id) >= 0)
    w.sidebar.select(conv.id)
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2)
    assert w.controller.info is None and w.context_label.text() == ""
    engines[0].finish_loading()
    qtbot.waitUntil(lambda: w.context_label.text() == f"52 of {INFO.context_length:,} tokens")


def test_a_reply_that_left_out_earliest_messages_says_so_under_it() -> None:
    stats = {"generated": 10, "seconds": 1.0, "reason": "eos", "left_out": 12}
    assert stats_summary(stats, None) == "10 tokens · 10.0 tok/s · 12 earliest messages left out"
    assert "saw the system prompt and the newest messages only" in stats_explained(stats, None)


def test_export_is_named_after_the_title_starts_in_the_last_folder_and_renders_markdown(
        qtbot, make_window, tmp_path: Path, monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("Plan: `ls` | a\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('<b>')\n```\nRoses\nViolets")
    wait_reply_saved(qtbot, w)
    qtbot.waitUntil(lambda: w.title.text().startswith("Plan"))
    asked: list[str] = []
    out = tmp_path / "exports"
    out.mkdir()

    def save_as(_parent, _caption, suggested, _filters):
        asked.append(suggested)
        return str(out / "chat.html"), "HTML (*.html)"

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_as)
    w.files.export_current()
    qtbot.waitUntil((out / "chat.html").exists)
    assert Path(asked[0]).name == "Plan - ls - a.md"  # the title, as a file name
    qtbot.waitUntil(lambda: w.prefs.export_dir == str(out))
    w.files.export_current()
    assert Path(asked[1]).parent == out  # the folder is remembered
    page = (out / "chat.html").read_text()
    assert "<table>" in page and "<td>1</td>" in page  # Markdown rendered, as in the window
    assert "&lt;b&gt;" in page and "<b>" not in page  # code escaped (and coloured)
    assert "Roses<br />" in page  # a single line break stays one
    assert "own_copy_rates=model default" in page and "null" not in page


def test_edit_last_message_is_confirmed_from_the_keyboard(qtbot, make_window) -> None:
    from PySide6.QtCore import QTimer

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("one")
    wait_reply_saved(qtbot, w)

    def type_and_send() -> None:
        dialog = w.edit_dialog
        assert dialog is not None and dialog.text() == "one"
        qtbot.keyClick(dialog.editor, Qt.Key.Key_Return)  # a new line, as in the composer with Shift
        qtbot.keyClicks(dialog.editor, "two")
        qtbot.keyClick(dialog.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)

    QTimer.singleShot(100, type_and_send)
    qtbot.keyClick(w, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: (m := last_reply(w)) is not None and m.content == "Echo: one\ntwo"
                    and m.status == "complete", timeout=15000)


def test_code_blocks_get_a_language_label_and_a_copy_link(qtbot) -> None:
    from PySide6.QtCore import QUrl

    view = MessageView()
    qtbot.addWidget(view)
    view.set_markdown("Run this:\n\n```python\nprint('hi')\nx = 2\n```\n\nthen\n\n```\nls -l\n```")
    lines = view.document().toPlainText().split("\n")
    assert lines[:4] == ["Run this:", "python   Copy", "print('hi')", "x = 2"]
    assert "code   Copy" in lines and view.code_blocks == ["print('hi')\nx = 2", "ls -l"]
    assert view.plain_text().startswith("Run this:")  # Copy of the whole message gives the source
    view.anchorClicked.emit(QUrl("lanes-copy:0"))
    assert QApplication.clipboard().text() == "print('hi')\nx = 2"
    view.anchorClicked.emit(QUrl("lanes-copy:1"))
    assert QApplication.clipboard().text() == "ls -l"


def test_a_stopped_reply_offers_continue_which_grows_the_same_message(qtbot, make_window, tmp_path: Path) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("SLOW story")
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2 and bool(w.chat.widgets[-1].view.plain_text()))
    w.stop_action.trigger()
    wait_reply_saved(qtbot, w, status="cancelled")
    reply = w.chat.widgets[-1]
    assert reply.continue_button.isVisible() and not w.chat.widgets[0].continue_button.isVisible()
    before = reply.message
    qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    wait_reply_saved(qtbot, w)
    with Store(tmp_path / "lanes.db") as store:
        stored = store.messages(w.current)
    assert [m.id for m in stored] == [stored[0].id, before.id]  # the same reply, grown
    assert stored[1].content.startswith(before.content) and len(stored[1].content) > len(before.content)
    assert stored[1].status == "complete" and not w.chat.widgets[-1].continue_button.isVisible()
    send_and_wait(qtbot, w, "next question")  # now the earlier reply is not the one to continue
    assert not any(x.continue_button.isVisible() for x in w.chat.widgets)


def test_quitting_mid_reply_asks_and_the_kept_reply_can_be_continued(qtbot, make_window, tmp_path: Path,
                                                                     monkeypatch) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("SLOW goodbye")
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2 and bool(w.chat.widgets[-1].view.plain_text()))
    asked: list[tuple[str, str]] = []
    answer = False
    monkeypatch.setattr(questions, "confirm", lambda _p, _t, text, action, **_k: asked.append((text, action)) or answer)
    quit_action = next(a for a in w._menus["&File"].actions() if a.text() == "Quit")
    quit_action.trigger()
    assert asked == [("A reply is still being written. Quit anyway? What it has written so far is kept, and "
                      "Continue finishes it later.", "Quit")]
    assert w.isVisible() and w.controller.generating()  # Cancel: nothing stopped
    answer = True
    cid = w.current
    quit_action.trigger()
    assert not w.isVisible()
    with Store(tmp_path / "lanes.db") as store:
        assert store.messages(cid)[-1].status == "partial"
    again = make_window()
    qtbot.waitUntil(lambda: again.sidebar.model.rowCount() == 1)
    again.sidebar.select(cid)
    qtbot.waitUntil(lambda: len(again.chat.widgets) == 2)
    assert again.chat.widgets[-1].continue_button.isVisible()


def test_a_quit_asked_while_the_reply_ends_goes_on_once_nothing_is_being_written(qtbot, make_window,
                                                                                tmp_path: Path) -> None:
    """The question was why the quit waited; once the reply is saved whole, the box closes itself and
    the window quits (it used to keep asking about a reply that no longer ran)."""
    from PySide6.QtWidgets import QMessageBox

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    w.send("long enough to be still streaming when Quit asks, and short enough to end soon after. " * 3)
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 2 and bool(w.chat.widgets[-1].view.plain_text()))
    cid, asked = w.current, []
    guard = QTimer(singleShot=True, interval=15000)  # should the box stay up, the test fails, not hangs
    guard.timeout.connect(lambda: QApplication.activeModalWidget() and QApplication.activeModalWidget().reject())

    def look() -> None:
        box = QApplication.activeModalWidget()
        asked.append(box.text() if isinstance(box, QMessageBox) else None)
        guard.start()

    QTimer.singleShot(20, look)
    quit_action = next(a for a in w._menus["&File"].actions() if a.text() == "Quit")
    quit_action.trigger()  # returns once the box has closed
    guard.stop()  # not left to fire in a later test
    assert asked and asked[0] is not None and asked[0].startswith("A reply is still being written.")
    assert not w.isVisible()
    with Store(tmp_path / "lanes.db") as store:
        assert store.messages(cid)[-1].status == "complete"


def test_dropped_text_files_go_into_the_message_as_fenced_blocks_under_their_names(qtbot, make_window,
                                                                                   tmp_path: Path) -> None:
    from PySide6.QtCore import QMimeData, QUrl

    from app.attachments import MAX_BYTES, fenced

    assert fenced("a.py", "print(1)\n") == "`a.py`:\n```python\nprint(1)\n```\n"
    assert fenced("notes.md", "x\n```\ny") == "`notes.md`:\n````markdown\nx\n```\ny\n````\n"  # the fence outlasts
    code, binary, big = tmp_path / "util.py", tmp_path / "logo.png", tmp_path / "dump.txt"
    code.write_text("def add(a, b):\n    return a + b\n")
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    big.write_text("x" * (MAX_BYTES + 1))
    w = make_window()
    failures: list[str] = []
    w.composer.attachFailed.connect(failures.append)
    qtbot.keyClicks(w.composer, "Add a docstring:")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in (code, binary, big)])
    assert w.composer.canInsertFromMimeData(mime)
    w.composer.insertFromMimeData(mime)  # what a drop does
    assert w.composer.toPlainText() == "Add a docstring:\n`util.py`:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    assert failures == ["logo.png is not a text file",
                        f"dump.txt is {(MAX_BYTES + 1) / 2**20:.1f} MiB; Lanes attaches text files up to 256 KiB"]
    assert "Not attached: dump.txt" in w.statusBar().currentMessage()


def test_file_attach_file_puts_the_chosen_files_in(qtbot, make_window, tmp_path: Path, monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    note = tmp_path / "todo.txt"
    note.write_text("milk\neggs\n")
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(note)], ""))
    w = make_window()
    next(a for a in w._menus["&File"].actions() if a.text() == "Attach File…").trigger()
    assert w.composer.toPlainText().startswith("`todo.txt`:\n```") and "milk\neggs\n```" in w.composer.toPlainText()


def test_a_reasoning_models_thinking_is_shown_collapsed_apart_from_the_answer(qtbot) -> None:
    from app.chat_view import MessageWidget
    from app.thinking import Split, split_thinking
    from engine.store.records import Message

    assert split_thinking("<think>Add 2 and 2.</think>It is 4.") == Split("Add 2 and 2.", "It is 4.", False)
    assert split_thinking("<think>Add 2") == Split("Add 2", "", True)
    assert split_thinking("No thinking here <think>x</think>") == Split(None, "No thinking here <think>x</think>", False)
    text = "<think>The user greets me. I should greet back briefly.</think>\n\nHello!"
    w = MessageWidget(Message(1, 1, "assistant", text), lambda m: [(m.content, "model")], False)
    qtbot.addWidget(w)
    w.show()
    assert w.view.plain_text() == "Hello!" and w.thinking_button.text() == "Thought (9 words)"
    assert w.thinking_button.isVisible() and not w.thinking.isVisible()
    qtbot.mouseClick(w.thinking_button, Qt.MouseButton.LeftButton)
    assert w.thinking.isVisible() and w.thinking.plain_text().startswith("The user greets me.")
    w.set_live("<think>Still working it", [])
    assert w.thinking_button.text() == "Thinking… (3 words)" and not w.view.isVisible()
    user = MessageWidget(Message(2, 1, "user", "<think>not a reply</think>"), lambda m: [], False)
    qtbot.addWidget(user)
    assert user.view.plain_text() == "<think>not a reply</think>" and not user.thinking_button.isVisibleTo(user)
    # Coloured by origin, the thinking stays apart too and the answer keeps its tints.
    spans = [("<think>The user greets me.", "model"), (" I should greet back briefly.</think>\n\nHel", "recall"),
             ("lo!", "model")]
    tinted = MessageWidget(Message(3, 1, "assistant", text), lambda m: spans, True)
    qtbot.addWidget(tinted)
    tinted.show()
    assert tinted.view.plain_text() == "Hello!" and tinted.thinking_button.text() == "Thought (9 words)"
    tinted.set_live("<think>Still working it", [("<think>Still working it", "model")])
    assert not tinted.view.isVisible() and tinted.thinking_button.text() == "Thinking… (3 words)"


def test_messages_show_when_they_were_written(qtbot) -> None:
    from app.chat_view import MessageWidget
    from engine.store.records import Message

    now = time.time()
    w = MessageWidget(Message(1, 1, "user", "hi", created_at=now), lambda m: [], False)
    qtbot.addWidget(w)
    assert w.when.text() == time.strftime("%H:%M", time.localtime(now))
    old = time.mktime((2025, 3, 9, 8, 30, 0, 0, 0, -1))
    w.update_message(Message(1, 1, "user", "hi", created_at=old))
    assert w.when.text() == "9 Mar 2025 08:30" and "2025" in w.when.toolTip()


def test_your_turns_sit_on_a_tint_and_thinking_is_muted_in_light_and_dark(qtbot) -> None:
    from PySide6.QtGui import QPalette

    from app.chat_view import MessageWidget
    from engine.store.records import Message
    from tests.test_ui_message_view import dark_palette

    user = MessageWidget(Message(1, 1, "user", "hi"), lambda m: [], False)
    reply = MessageWidget(Message(2, 1, "assistant", "<think>Hmm.</think>Hello"), lambda m: [], False)
    for w in (user, reply):
        qtbot.addWidget(w)
        w.resize(300, 80)
        w.show()
    for palette in (QPalette(), dark_palette()):
        for w in (user, reply):
            w.setPalette(palette)
        tint, page = user.palette().color(QPalette.ColorRole.AlternateBase), reply.palette().color(QPalette.ColorRole.Window)
        assert user.grab().toImage().pixelColor(20, 4) == tint  # inside the rounded corner's reach
        assert reply.grab().toImage().pixelColor(20, 4) != tint
        thinking = reply.thinking.palette()
        assert thinking.color(QPalette.ColorRole.Text) == thinking.color(QPalette.ColorRole.PlaceholderText)
        assert reply.view.palette().color(QPalette.ColorRole.Text) != thinking.color(QPalette.ColorRole.Text)
        assert tint != page


def test_zoom_changes_the_chats_text_size_and_is_remembered(qtbot, make_window, tmp_path: Path) -> None:
    from app.preferences import load_preferences

    w = make_window()
    base = w.composer.font().pointSizeF()
    view = next(a for a in w._menus["&View"].actions() if a.text() == "Zoom In")
    assert QKeySequence("Ctrl+=") in view.shortcuts()
    view.trigger()
    view.trigger()
    assert w.prefs.text_scale == 1.21 and abs(w.composer.font().pointSizeF() - base * 1.21) < 0.01
    w.send("hello")
    wait_reply_saved(qtbot, w)
    views = [v for m in w.chat.widgets for v in (m.view, m.thinking)]
    assert [m.message.role for m in w.chat.widgets] == ["user", "assistant"]
    assert all(abs(v.font().pointSizeF() - base * 1.21) < 0.01 for v in views)  # new messages too, yours too
    reply = w.chat.widgets[-1]
    assert {b.font().pointSizeF() for b in (reply.copy_button, reply.continue_button, reply.retry_button)} == {
        QApplication.font().pointSizeF()}  # the text grows, the buttons beside it do not
    assert load_preferences(tmp_path / "prefs.json")[0].text_scale == 1.21
    next(a for a in w._menus["&View"].actions() if a.text() == "Zoom Out").trigger()
    assert all(abs(v.font().pointSizeF() - base * 1.1) < 0.01 for v in views)  # and those already shown
    next(a for a in w._menus["&View"].actions() if a.text() == "Actual Size").trigger()
    assert w.prefs.text_scale == 1.0 and abs(w.composer.font().pointSizeF() - base) < 0.01


def test_the_theme_setting_turns_the_window_dark_and_back(qtbot, make_window, monkeypatch) -> None:
    from PySide6.QtGui import QPalette

    from app.appearance import apply_theme
    from app.settings_dialog import SettingsDialog

    w = make_window()
    app = QApplication.instance()

    def chosen(self):  # the dialog accepted with Dark chosen in it
        self.theme.setCurrentIndex(self.theme.findData("dark"))
        return True

    monkeypatch.setattr(SettingsDialog, "exec", chosen)
    try:
        w.open_settings()
        assert w.prefs.theme == "dark"
        assert app.palette().color(QPalette.ColorRole.Window).lightness() < 128
        qtbot.waitUntil(lambda: w.palette().color(QPalette.ColorRole.Base).lightness() < 128)  # every window
    finally:
        apply_theme(app, "system")
    assert app.palette().color(QPalette.ColorRole.Window).lightness() > 128


def test_unknown_theme_or_text_size_in_the_file_fall_back_with_a_warning(tmp_path: Path) -> None:
    import json

    from app.preferences import load_preferences

    path = tmp_path / "prefs.json"
    path.write_text(json.dumps({"theme": "purple", "text_scale": 9, "export_dir": "/tmp"}))
    prefs, warnings = load_preferences(path)
    assert (prefs.theme, prefs.text_scale, prefs.export_dir) == ("system", 1.0, "/tmp")
    assert any("Theme must be one of system, light, dark" in x for x in warnings)
    assert any("Text size must be between 0.6x and 2.5x" in x for x in warnings)


def test_file_import_adds_exported_conversations_or_none_naming_the_bad_file(qtbot, make_window, tmp_path: Path,
                                                                            monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog, QMessageBox

    from engine.store.transcript import conversation_to_json

    with Store(tmp_path / "elsewhere.db") as other:
        c = other.create_conversation(title="Trip notes")
        other.add_message(c.id, "user", "Pack the tent")
        other.add_message(c.id, "assistant", "And the stove.")
        good = tmp_path / "trip.json"
        good.write_text(json.dumps(conversation_to_json(other, c.id)))
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    warned: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text, *a: warned.append(text))
    w = make_window()
    chosen = [str(good), str(bad)]
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (chosen, ""))
    importer = next(a for a in w._menus["&File"].actions() if a.text() == "Import Conversations…")
    importer.trigger()
    qtbot.waitUntil(lambda: bool(warned))
    assert "broken.json is not valid JSON" in warned[0]
    with Store(tmp_path / "lanes.db") as store:
        assert store.count_conversations() == 0  # all or none
    chosen[:] = [str(good)]
    importer.trigger()
    qtbot.waitUntil(lambda: w.title.text() == "Trip notes" and len(w.chat.widgets) == 2)
    assert w.chat.widgets[1].view.plain_text() == "And the stove."


def test_any_message_can_be_edited_or_deleted_and_the_next_reply_reads_it(qtbot, make_window, tmp_path: Path,
                                                                          monkeypatch) -> None:
    from PySide6.QtCore import QTimer

    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    for n, text in enumerate(("first", "second")):
        w.send(text)
        qtbot.waitUntil(lambda n=n: len(w.chat.widgets) == 2 * n + 2)
        wait_reply_saved(qtbot, w)
    first_reply = w.chat.widgets[1]
    assert [a.text() for a in first_reply.more_button.menu().actions()] == ["Edit Message…", "Delete Message…"]

    def rewrite() -> None:
        dialog = w.edit_dialog
        assert dialog is not None and dialog.text() == "Echo: first"
        dialog.editor.setPlainText("A corrected answer")
        qtbot.keyClick(dialog.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)

    QTimer.singleShot(100, rewrite)
    first_reply.more_button.menu().actions()[0].trigger()
    qtbot.waitUntil(lambda: w.chat.widgets[1].view.plain_text() == "A corrected answer")
    with Store(tmp_path / "lanes.db") as store:
        edited = store.messages(w.current)[1]
    assert edited.content == "A corrected answer" and edited.tokens is None and edited.origins is None
    monkeypatch.setattr(questions, "confirm", lambda *a, **k: True)
    w.chat.widgets[2].more_button.menu().actions()[1].trigger()  # delete "second"
    qtbot.waitUntil(lambda: [x.message.content for x in w.chat.widgets] == ["first", "A corrected answer",
                                                                           "Echo: second"])
    w.send("third")
    qtbot.waitUntil(lambda: len(w.chat.widgets) == 5)
    wait_reply_saved(qtbot, w)
    sent = w.controller.service.engine.requests[-1].messages
    assert [m["content"] for m in sent] == ["first", "A corrected answer", "Echo: second", "third"]


def test_keyboard_focus_shows_on_flat_buttons_and_messages(qtbot, make_window) -> None:
    w = make_window()
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    send_and_wait(qtbot, w, "hello")
    reply = w.chat.widgets[-1]
    w.activateWindow()
    for widget in (reply.copy_button, reply.more_button):
        widget.clearFocus()
        qtbot.wait(20)
        before = widget.grab().toImage()
        widget.setFocus(Qt.FocusReason.TabFocusReason)
        qtbot.waitUntil(widget.hasFocus)
        assert widget.grab().toImage() != before, widget.accessibleName()  # a ring shows where the keyboard is
    view = reply.view
    view.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(view.hasFocus)
    assert view.frameShape() == view.Shape.Box
    w.composer.setFocus()
    qtbot.waitUntil(lambda: not view.hasFocus())
    assert view.frameShape() == view.Shape.NoFrame


def test_the_sidebar_hides_and_comes_back_and_search_brings_it_back(qtbot, make_window, tmp_path: Path) -> None:
    from app.preferences import load_preferences

    w = make_window()
    show = w.sidebar_action
    assert show.isChecked() and w.sidebar.isVisible() and show.shortcut() == QKeySequence("Ctrl+Alt+S")
    chat_width = w.chat.width()
    show.trigger()
    assert not w.sidebar.isVisible()
    qtbot.waitUntil(lambda: w.chat.width() > chat_width)  # the chat takes the room
    assert load_preferences(tmp_path / "prefs.json")[0].show_sidebar is False
    w.search_conversations()  # Ctrl+F with the sidebar hidden
    assert w.sidebar.isVisible() and show.isChecked() and w.sidebar.search.hasFocus()
    w.split.setSizes([0, w.split.width()])  # dragged shut
    w.split.splitterMoved.emit(0, 1)
    assert not w.sidebar.isVisible() and not show.isChecked()
    show.trigger()
    assert w.sidebar.isVisible() and w.split.sizes()[0] > 0


def test_at_a_small_size_the_statistics_line_sits_below_the_last_code_line(qtbot) -> None:
    from app.chat_view import MessageWidget
    from engine.store.records import Message

    text = "Here:\n\n```python\n" + "\n".join(f"value_{i} = compute_something_long({i}, {i * 2})" for i in range(6)) + "\n```"
    m = Message(1, 1, "assistant", text, stats={"reason": "eos", "generated": 40, "seconds": 1.0,
                                                 "tokens_per_s": 40.0}, origins=("model",) * 40)
    w = MessageWidget(m, lambda msg: [(msg.content, "model")], False)
    qtbot.addWidget(w)
    for width in (260, 420, 900):
        w.resize(width, 10)
        w.show()
        w.adjustSize()
        qtbot.wait(20)
        assert w.stats.isVisible() and w.stats.text()
        assert w.stats.geometry().top() >= w.view.geometry().bottom(), width
        assert w.view.geometry().height() >= w.view.document().size().height() - 2, width  # nothing clipped


def test_menu_items_for_the_shown_conversation_are_greyed_while_none_is(qtbot, make_window) -> None:
    """Export, Rename, Delete, Edit Last Message and Copy Last Reply act on the shown conversation: with
    none shown (a new one, unsaved) they are greyed, as a Mac menu shows what cannot apply, instead of
    doing nothing when chosen."""
    w = make_window()
    names = {"Export Conversation…", "Copy Last Reply", "Edit Last Message…", "Rename…", "Delete…"}
    actions = [a for menu in w._menus.values() for a in menu.actions() if a.text() in names]
    assert {a.text() for a in actions} == names

    def enabled() -> set[bool]:
        return {a.isEnabled() for a in actions}

    assert enabled() == {False}
    qtbot.waitUntil(lambda: w.send_button.isEnabled())
    send_and_wait(qtbot, w, "a first message")
    cid = w.current
    assert cid is not None and enabled() == {True}
    w.new_action.trigger()
    assert w.current is None and enabled() == {False}
    w.sidebar.select(cid)
    qtbot.waitUntil(lambda: w.current == cid)
    assert enabled() == {True}


def test_a_question_before_an_undoable_step_names_its_action_and_defaults_to_cancel(qtbot) -> None:
    """The box names what it will do ("Delete"), not Yes; Cancel is the default and Esc's answer, so a
    stray Enter deletes nothing; ``moot`` answers for the user once the reason to ask has gone."""
    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget

    parent = QWidget()
    qtbot.addWidget(parent)
    seen: list[tuple[list[str], str]] = []

    def answer_with(key: Qt.Key | None, click: str | None = None) -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        buttons = {b.text().replace("&", ""): b for b in box.findChildren(QPushButton)}
        seen.append((sorted(buttons), box.defaultButton().text().replace("&", "")))
        if click is not None:
            buttons[click].click()
        elif key is not None:
            qtbot.keyClick(box, key)

    def asked(key: Qt.Key | None, click: str | None = None, moot=None) -> bool:
        QTimer.singleShot(50, lambda: answer_with(key, click))
        return questions.confirm(parent, "Delete Conversation", "Delete it?", "Delete", moot=moot)

    assert asked(Qt.Key.Key_Return) is False  # Enter takes the default: Cancel
    assert asked(Qt.Key.Key_Escape) is False
    assert asked(None, click="Delete") is True
    assert seen[0] == (["Cancel", "Delete"], "Cancel")

    class Source(QObject):
        changed = Signal(object)

    source = Source()
    QTimer.singleShot(100, lambda: source.changed.emit({3}))  # still running: the box stays
    QTimer.singleShot(150, lambda: source.changed.emit(set()))  # nothing left: it answers Delete
    guard = QTimer(singleShot=True, interval=5000)  # should the box stay up, Esc fails the test, not a hang
    guard.timeout.connect(lambda: QApplication.activeModalWidget() and answer_with(Qt.Key.Key_Escape))
    guard.start()
    assert questions.confirm(parent, "Quit Lanes?", "Quit anyway?", "Quit", moot=source.changed) is True
    guard.stop()  # not left to fire in a later test
