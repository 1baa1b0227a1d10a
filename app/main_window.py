"""The main window: sidebar, chat, composer, menus, and the model's load state."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from PySide6.QtCore import QByteArray, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app import questions
from app.appearance import ZOOM_STEP, apply_text_scale, apply_theme
from app.chat_view import ChatView, Composer
from app.controller import ChatController
from app.conversation_delegate import plain_title
from app.edit_dialog import EditDialog
from app.elided_label import ElidedLabel
from app.preferences import TEXT_SCALE_RANGE, Preferences, save_preferences
from app.server_menu import ServerMenu
from app.settings_dialog import SettingsDialog
from app.sidebar import Sidebar
from app.theme import OriginLegend
from app.window_files import WindowFiles
from engine.events import ModelInfo
from engine.store.records import Conversation, Message

READY = "Message Lanes (Enter sends, Shift+Enter adds a line)"
LOADING = "The model is loading: type now, Enter sends once it is ready"


class MainWindow(QMainWindow):
    def __init__(self, controller: ChatController, prefs: Preferences, prefs_path: Path | None = None) -> None:
        super().__init__()
        self.controller = controller
        self.prefs = prefs
        self.prefs_path = prefs_path
        self.conversation_actions: list[QAction] = []  # those that act on the shown conversation
        self._current: int | None = None
        self._queued: str | None = None  # a message sent while the model loaded: sent once it is ready
        self.edit_dialog: EditDialog | None = None
        self._drafts: dict[int | None, str] = {}  # unsent text of the conversations not shown (None: a new one)
        self._load_started = time.monotonic()
        self.setWindowTitle("Lanes")
        self.resize(1100, 760)

        self.sidebar = Sidebar(controller)
        self.title = ElidedLabel("New conversation")
        self.title.setStyleSheet("font-size: 15px; font-weight: 600;")
        self.title.setAccessibleName("Conversation title")
        self.context_label = QLabel()  # how much of the model's context the conversation fills
        self.context_label.setAccessibleName("Context used")
        self.context_label.setToolTip("How much of the model's context this conversation fills, in tokens. "
                                      "Past the limit its earliest messages are left out of what the model sees.")
        self.legend = OriginLegend()
        self.legend.setVisible(prefs.show_origins)
        self.chat = ChatView()
        self.chat.spans_for = controller.spans_for
        self.chat.show_origins = prefs.show_origins
        self.composer = Composer()
        self.send_button = QPushButton("Send")
        self.send_button.setAccessibleName("Send message")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop the reply")
        self.stop_button.setToolTip("Stop the reply (Esc)")

        right = QWidget()
        col = QVBoxLayout(right)
        col.setContentsMargins(8, 8, 8, 8)
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.context_label)
        col.addLayout(head)
        col.addWidget(self.legend)
        col.addWidget(self.chat, 1)
        row = QHBoxLayout()
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        col.addLayout(row)
        split = QSplitter()
        split.addWidget(self.sidebar)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([280, 820])
        split.setCollapsible(1, False)  # the chat never disappears; the sidebar may (drag or View menu)
        split.splitterMoved.connect(lambda _pos, _i: self._sidebar_dragged())
        self.split = split
        self.setCentralWidget(split)
        self.sidebar.setVisible(prefs.show_sidebar)

        self.model_label = QLabel("Loading model…")
        self.model_label.setAccessibleName("Model status")
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy: loading has no measurable steps
        self.progress.setMaximumWidth(160)
        self.progress.setAccessibleName("Model loading")
        self.generating_label = QLabel()
        self.generating_label.setAccessibleName("Generating")
        self.statusBar().addWidget(self.model_label)
        self.statusBar().addWidget(self.progress)
        self.statusBar().addPermanentWidget(self.generating_label)
        self._load_timer = QTimer(self, interval=250)
        self._load_timer.timeout.connect(self._tick_loading)
        self._load_timer.start()

        self._render_after = 0.0
        self._render_timer = QTimer(self, singleShot=True)
        self._render_timer.timeout.connect(self._render_live)
        self._build_menus()
        self._connect()
        self._set_model_ready(False)
        self._update_stop()
        if controller.info is not None:  # loaded (or failed) before this window was listening
            self._model_loaded(controller.info)
        elif controller.load_error is not None:
            QTimer.singleShot(0, lambda: self._model_failed(controller.load_error or ""))
        if controller.fell_back is not None:  # the saved model failed before this window was listening
            QTimer.singleShot(0, lambda: self._model_fell_back(controller.fell_back or ""))
        # The store holds the Recall setting (`lanes recall` changes it too): show what it says.
        controller.store_call(lambda store: store.recall_other_conversations,
                              lambda on: setattr(self.prefs, "recall_other_conversations", on))
        if prefs.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(prefs.window_geometry.encode()))
        self.composer.setFocus()  # typing goes to the message, not to Search
        if prefs.text_scale != 1.0:
            apply_text_scale([self.chat, self.composer], prefs.text_scale)

    @property
    def current(self) -> int | None:
        """The shown conversation's id (None: a new one, not saved until its first message)."""
        return self._current

    @current.setter
    def current(self, conversation_id: int | None) -> None:
        self._current = conversation_id
        for action in self.conversation_actions:  # greyed, as a Mac menu shows what cannot apply
            action.setEnabled(conversation_id is not None)

    # -- menus and shortcuts ---------------------------------------------------------------------
    def _action(self, menu_name: str, text: str, slot: Callable[[], object],
                shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None) -> QAction:
        menu = self._menus.get(menu_name) or self.menuBar().addMenu(menu_name)
        self._menus[menu_name] = menu
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _build_menus(self) -> None:
        self._menus: dict[str, QMenu] = {}
        sk = QKeySequence.StandardKey
        self.new_action = self._action("&File", "New Conversation", self.new_conversation, sk.New)
        self.files = WindowFiles(self)
        self._action("&File", "Attach File…", self.files.attach, sk.Open)
        export = self._action("&File", "Export Conversation…", self.files.export_current, "Ctrl+E")
        self._action("&File", "Export All Conversations…", self.files.export_all, "Ctrl+Shift+E")
        self._action("&File", "Import Conversations…", self.files.import_conversations, "Ctrl+Shift+I")
        self.settings_action = self._action("&File", "Settings…", self.open_settings, sk.Preferences)
        if self.settings_action.shortcut().isEmpty():  # Linux/Windows have no standard one
            self.settings_action.setShortcut(QKeySequence("Ctrl+,"))
        self.settings_action.setMenuRole(QAction.MenuRole.PreferencesRole)
        quit_action = self._action("&File", "Quit", self.request_quit, sk.Quit)
        quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        for text, key, slot in (("Cut", sk.Cut, "cut"), ("Copy", sk.Copy, "copy"), ("Paste", sk.Paste, "paste"),
                                ("Select All", sk.SelectAll, "selectAll")):
            self._action("&Edit", text, lambda _checked=False, slot=slot: self._edit(slot), key)
        self._menus["&Edit"].addSeparator()
        copy_reply = self._action("&Edit", "Copy Last Reply", self.copy_last_reply, "Ctrl+Shift+Y")
        self._action("&Edit", "Search Conversations", self.search_conversations, sk.Find)
        self.stop_action = self._action("&Conversation", "Stop Reply", self.stop, "Esc")
        self.regenerate_action = self._action("&Conversation", "Regenerate Last Reply", self.regenerate, "Ctrl+R")
        edit = self._action("&Conversation", "Edit Last Message…", self.edit_last, "Ctrl+Shift+R")
        self.continue_action = self._action("&Conversation", "Continue Reply", self.continue_reply, "Ctrl+Shift+Return")
        rename = self._action("&Conversation", "Rename…", lambda: self.current and self.sidebar.rename(self.current), "F2")
        delete = self._action("&Conversation", "Delete…", self.sidebar.delete_current)
        self.conversation_actions = [export, copy_reply, edit, rename, delete]
        self.current = self._current  # greys them while no conversation is shown
        self.compare_action = self._action("&Conversation", "Compare Own Copy Rates…", self.open_compare,
                                           "Ctrl+Shift+C")
        self.origins_action = self._action("&View", "Colour Tokens by Origin", self.toggle_origins, "Ctrl+Shift+O")
        self.origins_action.setCheckable(True)
        self.origins_action.setChecked(self.prefs.show_origins)
        self.sidebar_action = self._action("&View", "Show Sidebar", self.show_sidebar, "Ctrl+Alt+S")
        self.sidebar_action.setCheckable(True)
        self.sidebar_action.setChecked(self.prefs.show_sidebar)
        self._menus["&View"].addSeparator()
        zoom_in = self._action("&View", "Zoom In", lambda: self.zoom(ZOOM_STEP), sk.ZoomIn)
        zoom_in.setShortcuts([QKeySequence(sk.ZoomIn), QKeySequence("Ctrl+=")])  # = is + unshifted
        self._action("&View", "Zoom Out", lambda: self.zoom(1 / ZOOM_STEP), sk.ZoomOut)
        self._action("&View", "Actual Size", lambda: self.zoom(0), "Ctrl+0")
        self.server_menu = ServerMenu(self, self.controller)

    def _connect(self) -> None:
        c = self.controller
        c.modelLoaded.connect(self._model_loaded)
        c.modelFailed.connect(self._model_failed)
        c.modelRefused.connect(self._model_refused)
        c.modelFellBack.connect(self._model_fell_back)
        c.replyStarted.connect(self._reply_started)
        c.replyWaiting.connect(lambda _cid, why: self.statusBar().showMessage(f"A reply waits to start: {why}.", 15000))
        c.replyNotice.connect(lambda _cid, what: self.statusBar().showMessage(f"Note: {what}.", 15000))
        c.replyReading.connect(self._reading)
        c.liveUpdated.connect(self._live_updated)
        c.replyFinished.connect(self._reply_finished)
        c.replyFailed.connect(self._reply_failed)
        c.generatingChanged.connect(self._generating_changed)
        c.storeError.connect(lambda msg: self.statusBar().showMessage(msg, 8000))
        c.conversationsChanged.connect(self._refresh_title)
        self.sidebar.conversationSelected.connect(self.open_conversation)
        self.sidebar.newRequested.connect(self.new_conversation)
        self.sidebar.conversationDeleted.connect(self._deleted)
        self.composer.submitted.connect(self.send)
        self.composer.attachFailed.connect(lambda why: self.statusBar().showMessage(f"Not attached: {why}", 10000))
        self.send_button.clicked.connect(lambda: self.send(self.composer.toPlainText()))
        self.stop_button.clicked.connect(self.stop)
        self.chat.retryRequested.connect(self.regenerate)
        self.chat.continueRequested.connect(self.continue_reply)
        self.chat.editRequested.connect(self.edit_message)
        self.chat.deleteRequested.connect(self.delete_message)
        self.chat.versionRequested.connect(self.show_version)

    # -- model -----------------------------------------------------------------------------------
    def _tick_loading(self) -> None:
        self.model_label.setText(f"Loading model… {time.monotonic() - self._load_started:.0f} s")

    def _set_model_ready(self, ready: bool) -> None:
        self.send_button.setEnabled(ready)
        self.regenerate_action.setEnabled(ready)
        self.composer.setPlaceholderText(READY if ready else LOADING)
        self.composer.viewport().update()
        if ready and self._queued is not None:  # sent while the model loaded: send it now
            text, self._queued = self._queued, None
            self.send(text)

    def _model_loaded(self, info: ModelInfo) -> None:
        self._load_timer.stop()
        self.progress.hide()
        self.model_label.setText(f"{info.name} · {info.device}")
        self._set_model_ready(True)
        self._update_stop()
        self._show_context([w.message for w in self.chat.widgets])  # opened while it loaded, or another model's

    def _model_failed(self, reason: str) -> None:
        self._load_timer.stop()
        self.progress.hide()
        self.model_label.setText("No model loaded")
        self._set_model_ready(False)
        self._unqueue("Not sent: the model could not be loaded")
        QMessageBox.warning(self, "The model could not be loaded",
                            f"{reason}\n\nChoose another model in Settings.")

    def _model_refused(self, reason: str, kept: str | None) -> None:
        """A model chosen in Settings cannot work: nothing was unloaded, and the setting goes back."""
        self.prefs.model = kept
        self.save_prefs()
        if self.controller.info is not None:
            self._model_loaded(self.controller.info)
        QMessageBox.warning(self, "That model cannot be used",
                            f"{reason}\n\nLanes kept the model it had; Settings is back to it.")

    def _model_fell_back(self, message: str) -> None:
        self.statusBar().showMessage(message, 30000)
        QMessageBox.warning(self, "The saved model could not be loaded", message)

    # -- conversations ---------------------------------------------------------------------------
    def _switch_draft(self, to: int | None) -> None:
        """Keep the composer's unsent text with the conversation it was written in; show ``to``'s."""
        text = self.composer.toPlainText()
        if text.strip():
            self._drafts[self.current] = text
        else:
            self._drafts.pop(self.current, None)
        self.composer.setPlainText(self._drafts.pop(to, ""))
        self.composer.moveCursor(QTextCursor.MoveOperation.End)

    def new_conversation(self) -> None:
        if self.current is not None:
            self._switch_draft(None)
        self.current = None
        self._show_title(None)
        self.context_label.setText("")
        self.chat.set_messages([])
        self.sidebar.mark_shown(None)
        self.composer.setFocus()
        self._update_stop()

    def open_conversation(self, conversation_id: int) -> None:
        if conversation_id == self.current:
            return
        self._switch_draft(conversation_id)
        self.current = conversation_id
        self.controller.load_conversation(conversation_id, self._show)

    def _show(self, loaded: tuple[Conversation, list[Message]]) -> None:
        conv, messages = loaded
        if conv.id != self.current:
            return  # another conversation was chosen meanwhile
        self._show_title(conv.title)
        self.chat.set_messages(messages)
        self._show_context(messages)
        live = self.controller.live.get(conv.id)
        if live is not None and live.message_id is not None:
            w = self.chat.widget_for(live.message_id)
            if w is not None:
                w.set_live(live.text, live.spans)
        self._update_stop()

    def _refresh_title(self) -> None:
        """The shown conversation's title as the store has it now (named after its first message,
        or renamed)."""
        cid = self.current
        if cid is None:
            return

        def show(conv: Conversation) -> None:
            if conv.id == self.current:
                self._show_title(conv.title)

        self.controller.store_call(lambda s: s.conversation(cid), show, lambda _exc: None)

    def _show_title(self, title: str | None) -> None:
        words = plain_title(title) if title else ""  # as the sidebar shows it: no Markdown marks
        self.title.setText(words or "New conversation")
        self.setWindowTitle(f"{words} — Lanes" if words else "Lanes")

    def _deleted(self, conversation_id: int) -> None:
        self._drafts.pop(conversation_id, None)
        if conversation_id == self.current:
            self.new_conversation()

    # -- replies ---------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        if not text.strip():
            return
        if self.controller.info is None:
            if self.controller.load_error is not None:
                self.statusBar().showMessage("No model is loaded: choose one in Settings", 8000)
                return
            self._queued = text
            self.composer.clear()
            self._update_stop()
            self.statusBar().showMessage("The model is still loading: your message is sent as soon as it is ready",
                                         15000)
            return
        if self.current is not None and self.current in self.controller.generating():
            self.statusBar().showMessage("This conversation is still replying: stop it first (Esc)", 5000)
            return
        self.composer.clear()
        settings = self.prefs.reply_settings()
        if self.current is None:
            def created(conv: Conversation) -> None:
                self.current = conv.id
                self.sidebar.mark_shown(conv.id)
                self.controller.send(conv.id, text, settings)

            self.controller.new_conversation(self.prefs.system_prompt, settings, created)
        else:
            self.controller.send(self.current, text, settings)

    def _edit(self, slot: str) -> None:
        """Cut, Copy, Paste or Select All in the focused text (the widgets take their own shortcuts first)."""
        target = self.focusWidget()  # this window's focused widget, even while a menu holds the keyboard
        if target is not None and hasattr(target, slot):
            getattr(target, slot)()

    def copy_last_reply(self) -> None:
        w = next((w for w in reversed(self.chat.widgets) if w.message.role == "assistant"), None)
        if w is not None:
            w.copy()
            self.statusBar().showMessage("Copied the last reply", 3000)

    def stop(self) -> None:
        if self._queued is not None:  # not sent yet: back into the composer
            self._unqueue("Not sent: your message is back in the composer")
        elif self.current is not None:
            self.controller.stop(self.current)

    def _unqueue(self, why: str) -> None:
        if self._queued is not None:
            if not self.composer.toPlainText().strip():
                self.composer.setPlainText(self._queued)
            self._queued = None
            self.statusBar().showMessage(why, 8000)
            self._update_stop()

    def regenerate(self) -> None:
        if self.current is not None and self.controller.info is not None:
            self.controller.regenerate(self.current, self.prefs.reply_settings())

    def continue_reply(self) -> None:
        last = self.chat.widgets[-1] if self.chat.widgets else None
        if self.current is None or self.controller.info is None or last is None or not last.can_continue:
            return
        self.controller.continue_reply(self.current, self.prefs.reply_settings())

    def _idle(self, what: str) -> bool:
        """Whether the shown conversation can be changed now (not while it replies)."""
        if self.current is not None and self.current in self.controller.generating():
            self.statusBar().showMessage(f"This conversation is still replying: stop it first (Esc) to {what}", 5000)
            return False
        return self.current is not None

    def _reload(self) -> None:
        if self.current is not None:
            self.controller.load_conversation(self.current, self._show)

    def edit_message(self, message: Message) -> None:
        """Change any message's text in place; the next replies read it as it is now."""
        if not self._idle("edit it"):
            return
        dialog = EditDialog(message.content, self, "Edit Message", "Save", "saves it; the next replies read it as it is")
        self.edit_dialog = dialog
        try:
            if dialog.exec() and dialog.text().strip() and dialog.text() != message.content:
                self.controller.edit_message(message, dialog.text(), self._reload)
        finally:
            self.edit_dialog = None

    def show_version(self, message: Message, number: int) -> None:
        """Show another version of a reply (and the message it answered, as it was then)."""
        if self._idle("show another version"):
            self.controller.show_version(message, number, self._update_messages)

    def _update_messages(self, messages: list[Message]) -> None:
        """Changed messages redrawn in place: the chat stays where it was scrolled."""
        if not messages or messages[0].conversation_id != self.current:
            return
        by_id = {m.id: m for m in messages}
        for w in self.chat.widgets:
            m = by_id.get(w.message.id)
            if m is not None and m != w.message:
                w.update_message(m)
        self._show_context(messages)

    def delete_message(self, message: Message) -> None:
        if not self._idle("delete it"):
            return
        who = "your message" if message.role == "user" else "this reply"
        if questions.confirm(self, "Delete Message", f"Delete {who}? This cannot be undone.", "Delete"):
            self.controller.delete_message(message, self._reload)

    def edit_last(self) -> None:
        if self.current is None or self.controller.info is None:
            return
        last = next((w.message for w in reversed(self.chat.widgets) if w.message.role == "user"), None)
        if last is None:
            return
        dialog = EditDialog(last.content, self)
        self.edit_dialog = dialog  # the open one, for tests and accessibility tools
        try:
            if dialog.exec() and dialog.text().strip():
                self.controller.edit_last(self.current, dialog.text(), self.prefs.reply_settings())
        finally:
            self.edit_dialog = None

    def _reply_started(self, conversation_id: int) -> None:
        if conversation_id != self.current:
            return
        live = self.controller.live.get(conversation_id)
        shown = [w.message.id for w in self.chat.widgets]
        user = live.user_message if live is not None else None
        if live is None or user is None or live.message_id is None or (shown and shown[-1] >= user.id):
            # A regenerate or an edit changed earlier messages: load the conversation again.
            self.controller.load_conversation(conversation_id, self._show)
            return
        # A new message: add it and the empty reply, without re-rendering the whole conversation.
        self.chat.add(user)
        self.chat.add(Message(live.message_id, conversation_id, "assistant", "", status="partial"))
        self.chat.jump_to_latest()  # one's own new message is shown, wherever one had scrolled
        self._update_stop()

    def _reading(self, conversation_id: int, done: int, total: int) -> None:
        live = self.controller.live.get(conversation_id)
        if conversation_id == self.current and live is not None and live.message_id is not None and not live.text:
            w = self.chat.widget_for(live.message_id)
            if w is not None:
                w.set_reading(done, total)

    def _show_context(self, messages: list[Message]) -> None:
        """Tokens the conversation fills after its last reply (its prompt and what it wrote), of the context."""
        info = self.controller.info
        last = next((m for m in reversed(messages) if m.role == "assistant" and isinstance(m.stats, Mapping)), None)
        counts = [last.stats.get(k) for k in ("prompt_tokens", "generated")] if last and last.stats else []
        used = int(sum(v for v in counts if isinstance(v, int | float) and not isinstance(v, bool)))
        if info is None or not used:
            self.context_label.setText("")
            return
        share = used / info.context_length
        self.context_label.setText(f"{used:,} of {info.context_length:,} tokens")
        self.context_label.setStyleSheet("color: #b35c00;" if share > 0.8 else "color: palette(placeholder-text);")

    def _live_updated(self, ids: set[int]) -> None:
        if self.current in ids:
            self._render_live()

    def _render_live(self) -> None:
        """Show the streamed text of the shown conversation. A long reply re-renders slowly (its whole
        Markdown each time), so the next render waits 3x as long as this one took: one message never
        takes more than about a quarter of the GUI thread, however long it grows."""
        wait = self._render_after - time.monotonic()
        if wait > 0:
            if not self._render_timer.isActive():
                self._render_timer.start(int(wait * 1000) + 1)
            return
        live = self.controller.live.get(self.current) if self.current is not None else None
        if live is None or live.message_id is None:
            return
        w = self.chat.widget_for(live.message_id)
        if w is not None:
            start = time.monotonic()
            w.set_live(live.text, live.spans)
            self._render_after = time.monotonic() + 3 * (time.monotonic() - start)

    def _reply_finished(self, conversation_id: int, message: Message) -> None:
        if conversation_id == self.current:
            w = self.chat.widget_for(message.id)
            if w is not None:
                w.update_message(message)
                self._show_context([message])
            else:
                self.controller.load_conversation(conversation_id, self._show)
        self._update_stop()

    def _reply_failed(self, conversation_id: int, reason: str) -> None:
        self.statusBar().showMessage(f"The reply could not run: {reason}", 10000)
        if conversation_id == self.current:
            self.controller.load_conversation(conversation_id, self._show)

    def _generating_changed(self, ids: set[int]) -> None:
        n = len(ids)
        self.generating_label.setText(f"Generating in {n} conversation{'s' if n != 1 else ''}" if n else "")
        self._update_stop()

    def _update_stop(self) -> None:
        busy = self._queued is not None or (self.current is not None and self.current in self.controller.generating())
        self.stop_button.setEnabled(busy)
        self.stop_action.setEnabled(busy)

    def open_compare(self) -> None:
        """The comparison pane (its own window), offering the shown conversation."""
        from app.compare_pane import open_compare_pane

        open_compare_pane(self.controller, self.current, self.prefs.max_tokens, self, self.title.text())

    # -- view, export, settings ------------------------------------------------------------------
    def zoom(self, factor: float) -> None:
        """The chat's text larger (factor > 1), smaller, or back to its normal size (0)."""
        lo, hi = TEXT_SCALE_RANGE
        scale = 1.0 if factor == 0 else min(hi, max(lo, round(self.prefs.text_scale * factor, 3)))
        self.prefs.text_scale = scale
        apply_text_scale([self.chat, self.composer], scale)
        self.statusBar().showMessage(f"Text size {scale:.0%}", 2000)
        self.save_prefs()

    def show_sidebar(self, on: bool) -> None:
        """Show or hide the conversation list (the chat takes the room); Search brings it back."""
        self.prefs.show_sidebar = on
        self.sidebar.setVisible(on)
        if on and self.split.sizes()[0] == 0:  # dragged shut earlier: open it at its usual width
            self.split.setSizes([280, max(1, self.split.width() - 280)])
        if self.sidebar_action.isChecked() != on:
            self.sidebar_action.setChecked(on)
        self.save_prefs()

    def search_conversations(self) -> None:
        if not self.sidebar.isVisible():
            self.show_sidebar(True)
        self.sidebar.focus_search()

    def _sidebar_dragged(self) -> None:
        shown = self.split.sizes()[0] > 0
        if shown != self.prefs.show_sidebar:
            self.show_sidebar(shown)

    def toggle_origins(self, on: bool) -> None:
        self.prefs.show_origins = on
        self.legend.setVisible(on)
        self.chat.set_show_origins(on)
        self.save_prefs()

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.prefs, self)
        if not dialog.exec():
            return
        new = dialog.preferences()
        old_model, old_recall, old_theme = self.prefs.model, self.prefs.recall_other_conversations, self.prefs.theme
        new.show_origins, new.window_geometry = self.prefs.show_origins, self.prefs.window_geometry
        self.prefs = new
        self.save_prefs()
        app = QApplication.instance()
        if new.theme != old_theme and isinstance(app, QApplication):
            apply_theme(app, new.theme)
        if new.recall_other_conversations != old_recall:
            self.controller.set_recall_other_conversations(new.recall_other_conversations)
        if new.model != old_model:
            self._load_started = time.monotonic()
            self.progress.show()
            self._load_timer.start()
            self._set_model_ready(False)
            self.controller.switch_model(new.model)

    def save_prefs(self) -> None:
        try:
            save_preferences(self.prefs, self.prefs_path)
        except OSError as exc:
            self.statusBar().showMessage(f"Settings could not be saved: {exc}", 8000)

    def request_quit(self) -> None:
        """File > Quit: asks first while replies are being written, then closes."""
        if self._may_quit():
            self.close()

    def _may_quit(self) -> bool:
        n = len(self.controller.generating())
        if not n:
            return True
        return questions.confirm(
            self, "Quit Lanes?",
            f"{'A reply is' if n == 1 else f'{n} replies are'} still being written. Quit anyway? What "
            f"{'it has' if n == 1 else 'they have'} written so far is kept, and Continue finishes it later.",
            "Quit", moot=self.controller.generatingChanged)  # replies that finish meanwhile: quit goes on

    def closeEvent(self, event: QCloseEvent) -> None:
        # The window's close button asks as Quit does; a close from the program (a signal, a test) does not.
        if event.spontaneous() and not self._may_quit():
            event.ignore()
            return
        self.prefs.window_geometry = bytes(self.saveGeometry().toBase64().data()).decode()
        self.save_prefs()
        self.hide()
        self.controller.close()  # stops and saves every reply as partial, joins every thread
        event.accept()
