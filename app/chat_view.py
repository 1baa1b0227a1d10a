"""The chat: one conversation's messages (Markdown, streamed), their statistics, and the composer."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from PySide6.QtCore import QMimeData, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeyEvent, QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.attachments import fenced, read_text_file
from app.conversation_delegate import when_label
from app.message_view import MessageView
from app.theme import FOCUS_RING
from app.thinking import Split, split_thinking
from engine.errors import LanesError
from engine.store.records import Message, pack_origins
from engine.store.render import stats_explained, stats_summary

ROLE_NAMES = {"user": "You", "assistant": "Lanes", "system": "System"}
STATUS_NOTES = {"partial": "stopped early", "cancelled": "stopped", "error": "error"}


class MessageWidget(QFrame):
    """One message: who, the text, and for replies the statistics, Copy and (on error) Retry."""

    retryRequested = Signal()
    continueRequested = Signal()
    editRequested = Signal(object)  # the Message
    deleteRequested = Signal(object)
    versionRequested = Signal(object, int)  # the Message, the version to show

    def __init__(self, message: Message, spans_for: Callable[[Message], list[tuple[str, str]]],
                 show_origins: bool) -> None:
        super().__init__()
        self.message = message
        self._spans_for = spans_for
        self.setObjectName(f"message-{message.role}")
        self.who = QLabel(ROLE_NAMES.get(message.role, message.role))
        self.who.setStyleSheet("font-weight: 600;")
        self.when = QLabel()  # when it was written: a time today, else a date and time
        self.when.setAccessibleName("Written at")
        self.when.setStyleSheet("color: palette(placeholder-text); font-size: 11px;")
        self.view = MessageView()
        self.view.setAccessibleName(f"{ROLE_NAMES.get(message.role, message.role)} message")
        self.thinking_button = QToolButton()  # a reasoning model's thinking, collapsed above the answer
        self.thinking_button.setCheckable(True)
        self.thinking_button.setAutoRaise(True)
        self.thinking_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.thinking_button.setAccessibleName("Show the model's thinking")
        self.thinking_button.toggled.connect(self._show_thinking)
        self.thinking = MessageView(muted=True)
        self.thinking.setAccessibleName("The model's thinking")
        self.thinking_button.hide()
        self.thinking.hide()
        self.stats = QLabel()
        self.stats.setAccessibleName("Reply statistics")
        self.stats.setStyleSheet("color: palette(placeholder-text); font-size: 11px;")
        self.stats.setWordWrap(True)
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setAccessibleName("Copy message")
        self.copy_button.setFlat(True)
        self.copy_button.clicked.connect(self.copy)
        self.retry_button = QPushButton("Retry")
        self.retry_button.setAccessibleName("Retry this reply")
        self.retry_button.clicked.connect(self.retryRequested)
        self.continue_button = QPushButton("Continue")
        self.continue_button.setAccessibleName("Continue this reply")
        self.continue_button.setToolTip("Carry on writing this reply where it stopped")
        self.continue_button.clicked.connect(self.continueRequested)
        self.is_last = False  # the conversation's last message: only that one can be continued
        self.more_button = QToolButton()
        self.more_button.setText("⋯")
        self.more_button.setAutoRaise(True)
        self.more_button.setAccessibleName("More actions for this message")
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        more = QMenu(self.more_button)
        more.addAction("Edit Message…", lambda: self.editRequested.emit(self.message))
        more.addAction("Delete Message…", lambda: self.deleteRequested.emit(self.message))
        self.more_button.setMenu(more)
        # A regenerated or edited reply's versions: < 2/3 >, the earlier ones kept in the store.
        self.older_button = QToolButton()
        self.older_button.setText("‹")
        self.older_button.setAccessibleName("Show the earlier version of this reply")
        self.older_button.clicked.connect(lambda: self.versionRequested.emit(self.message, self.message.version - 1))
        self.version_label = QLabel()
        self.version_label.setStyleSheet("color: palette(placeholder-text); font-size: 11px;")
        self.newer_button = QToolButton()
        self.newer_button.setText("›")
        self.newer_button.setAccessibleName("Show the later version of this reply")
        self.newer_button.clicked.connect(lambda: self.versionRequested.emit(self.message, self.message.version + 1))
        head = QHBoxLayout()
        head.addWidget(self.who)
        head.addWidget(self.when)
        head.addStretch(1)
        for w in (self.older_button, self.version_label, self.newer_button):
            head.addWidget(w)
        head.addWidget(self.continue_button)
        head.addWidget(self.retry_button)
        head.addWidget(self.copy_button)
        head.addWidget(self.more_button)
        # Styled buttons keep the application's font (a style sheet stops a font set on the chat from
        # reaching them): the chat's zoom grows the text, not the header's buttons.
        for b in (self.copy_button, self.more_button, self.thinking_button, self.older_button, self.newer_button,
                  self.continue_button, self.retry_button):
            b.setStyleSheet(FOCUS_RING)
        for b in (self.older_button, self.newer_button):
            b.setAutoRaise(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addLayout(head)
        layout.addWidget(self.thinking_button)
        layout.addWidget(self.thinking)
        layout.addWidget(self.view)
        layout.addWidget(self.stats)
        self.show_origins = show_origins
        self.update_message(message)

    def update_message(self, message: Message) -> None:
        self.message = message
        if message.created_at:
            t = time.localtime(message.created_at)
            today = t[:3] == time.localtime()[:3]
            self.when.setText(time.strftime("%H:%M", t) if today else f"{when_label(message.created_at)} "
                              + time.strftime("%H:%M", t))
            self.when.setToolTip(time.strftime("%A %d %B %Y, %H:%M", t))
        self._render(message.content)
        note = STATUS_NOTES.get(message.status)
        origins = pack_origins(message.origins)
        text = stats_summary(message.stats, origins) if message.role == "assistant" else ""
        self.stats.setToolTip(stats_explained(message.stats, origins) if message.role == "assistant" else "")
        if message.error:
            text = f"Error: {message.error}" + (f"\n{text}" if text else "")
        elif note and message.status != "partial":
            text = f"({note}) {text}"
        self.stats.setText(text)
        self.stats.setVisible(bool(text))
        self.retry_button.setVisible(message.status == "error")
        self.continue_button.setVisible(self.is_last and self.can_continue)
        several = message.versions > 1
        for w in (self.older_button, self.version_label, self.newer_button):
            w.setVisible(several)
        self.version_label.setText(f"{message.version}/{message.versions}")
        self.version_label.setAccessibleName(f"Version {message.version} of {message.versions}")
        self.older_button.setEnabled(message.version > 1)
        self.newer_button.setEnabled(message.version < message.versions)
        self.older_button.setToolTip(f"Version {message.version - 1} of {message.versions}")
        self.newer_button.setToolTip(f"Version {message.version + 1} of {message.versions}")

    def paintEvent(self, event: QPaintEvent) -> None:
        """The person's own turns sit on a soft tint, replies on the page. Painted, not a style
        sheet: one would stop the chat's zoom (a font set on the chat) from reaching the message."""
        if self.message.role == "user":
            painter = QPainter(self)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(self.palette().alternateBase())
            painter.drawRoundedRect(self.rect(), 10, 10)
            painter.end()
        super().paintEvent(event)

    @property
    def can_continue(self) -> bool:
        """A reply with text that stopped before its end: the length limit, Stop, or a quit."""
        m = self.message
        reason = m.stats.get("reason") if isinstance(m.stats, Mapping) else None
        return m.role == "assistant" and bool(m.content) and (
            m.status in ("partial", "cancelled") or (m.status == "complete" and reason == "length"))

    def set_last(self, last: bool) -> None:
        self.is_last = last
        self.continue_button.setVisible(last and self.can_continue)

    def set_live(self, text: str, spans: list[tuple[str, str]]) -> None:
        """The streamed text so far (the message is still partial)."""
        self._set_text(text, spans if self.show_origins else None)
        self.stats.setText("generating…")
        self.stats.setVisible(True)
        self.continue_button.setVisible(False)

    def set_reading(self, done: int, total: int) -> None:
        """The model is still reading the conversation (a long prompt): how far, before any text."""
        self.stats.setText(f"Reading the conversation: {done:,} of {total:,} tokens ({done / max(1, total):.0%})"
                           " · Esc stops")
        self.stats.setToolTip("Before it writes, the model reads the whole conversation once; "
                              "long ones take a while. The next message reuses what it read.")
        self.stats.setVisible(True)

    def set_show_origins(self, on: bool) -> None:
        self.show_origins = on
        self._render(self.message.content)

    def _render(self, text: str) -> None:
        origins = self.show_origins and self.message.role == "assistant"
        self._set_text(text, self._spans_for(self.message) if origins else None)

    def _set_text(self, text: str, spans: list[tuple[str, str]] | None = None) -> None:
        """The answer in the view (tinted by origin with ``spans``); a reply's thinking, if any,
        behind the button above it."""
        split = split_thinking(text) if self.message.role == "assistant" else Split(None, text, False)
        if spans is None:
            self.view.set_markdown(split.answer)
        else:  # the spans' own text split the same way: the answer's spans are its last characters
            whole = "".join(t for t, _ in spans)
            self.view.set_spans(spans_from(spans, len(whole) - len(split_thinking(whole).answer)))
        self.view.setVisible(bool(split.answer) or split.thinking is None)
        if split.thinking is None:
            self.thinking_button.hide()
            self.thinking.hide()
            return
        words = len(split.thinking.split())
        self.thinking_button.setText(("Thinking… " if split.still_thinking else "Thought ") + f"({words:,} words)")
        self.thinking_button.setArrowType(Qt.ArrowType.DownArrow if self.thinking_button.isChecked()
                                          else Qt.ArrowType.RightArrow)
        self.thinking_button.show()
        self.thinking.set_markdown(split.thinking)
        self.thinking.setVisible(self.thinking_button.isChecked())

    def _show_thinking(self, on: bool) -> None:
        self.thinking.setVisible(on)
        self.thinking_button.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.view.plain_text() or self.message.content)
        self.copy_button.setText("Copied ✓")  # the only sign a copy happened
        QTimer.singleShot(1500, self.copy_button, lambda: self.copy_button.setText("Copy"))  # dropped if deleted


def spans_from(spans: list[tuple[str, str]], start: int) -> list[tuple[str, str]]:
    """``spans`` without their first ``start`` characters (a reply's thinking, shown apart)."""
    out = []
    for text, origin in spans:
        cut = min(start, len(text))
        start -= cut
        if text[cut:]:
            out.append((text[cut:], origin))
    return out


class ChatView(QScrollArea):
    """The messages of one conversation, newest at the bottom; follows the stream when at the bottom."""

    retryRequested = Signal()
    continueRequested = Signal()
    editRequested = Signal(object)  # a Message
    deleteRequested = Signal(object)
    versionRequested = Signal(object, int)

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setAccessibleName("Messages")
        self.inner = QWidget()
        self.column = QVBoxLayout(self.inner)
        self.column.setContentsMargins(0, 8, 0, 8)
        self.column.addStretch(1)
        self.setWidget(self.inner)
        self.widgets: list[MessageWidget] = []
        self.show_origins = False
        self.spans_for: Callable[[Message], list[tuple[str, str]]] = lambda m: [(m.content, "model")]
        self._follow = True
        self.latest_button = QPushButton("↓ Latest", self.viewport())  # shown while scrolled up
        self.latest_button.setAccessibleName("Jump to the latest message")
        self.latest_button.setToolTip("Jump to the latest message (Ctrl+End)")
        self.latest_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.latest_button.clicked.connect(self.jump_to_latest)
        self.latest_button.hide()
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)

    def jump_to_latest(self) -> None:
        """Scroll to the newest message and follow the stream again (also once the layout settles)."""
        self._follow = True
        self._to_bottom()
        QTimer.singleShot(0, self._to_bottom)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        ctrl = bool(event.modifiers() & Qt.KeyboardModifier.ControlModifier)
        if ctrl and event.key() == Qt.Key.Key_End:
            self.jump_to_latest()
        elif ctrl and event.key() == Qt.Key.Key_Home:
            self.verticalScrollBar().setValue(0)
        else:
            super().keyPressEvent(event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_latest()

    def _place_latest(self) -> None:
        b, v = self.latest_button, self.viewport()
        b.adjustSize()
        b.move(v.width() - b.width() - 16, v.height() - b.height() - 12)
        b.raise_()

    def set_messages(self, messages: list[Message]) -> None:
        for w in self.widgets:
            w.setParent(None)
            w.deleteLater()
        self.widgets = []
        for m in messages:
            self.add(m)
        self._follow = True
        QTimer.singleShot(0, self._to_bottom)

    def add(self, message: Message) -> MessageWidget:
        w = MessageWidget(message, self.spans_for, self.show_origins)
        w.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        w.retryRequested.connect(self.retryRequested)
        w.continueRequested.connect(self.continueRequested)
        w.editRequested.connect(self.editRequested)
        w.deleteRequested.connect(self.deleteRequested)
        w.versionRequested.connect(self.versionRequested)
        self.column.insertWidget(self.column.count() - 1, w)
        if self.widgets:
            self.widgets[-1].set_last(False)
        self.widgets.append(w)
        w.set_last(True)
        return w

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in reversed(self.widgets) if w.message.id == message_id), None)

    def set_show_origins(self, on: bool) -> None:
        self.show_origins = on
        for w in self.widgets:
            w.set_show_origins(on)

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 24
        self.latest_button.setVisible(not self._follow)
        if not self._follow:
            self._place_latest()

    def _range_changed(self, _lo: int, _hi: int) -> None:
        if self._follow:
            self._to_bottom()

    def _to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())


class Composer(QPlainTextEdit):
    """Enter sends, Shift+Enter adds a line. Three lines high, growing with its text up to ten. Text
    files dropped on it go in as fenced blocks under their names (``app.attachments``)."""

    submitted = Signal(str)
    attachFailed = Signal(str)  # why a file could not be attached, naming it

    def __init__(self) -> None:
        super().__init__()
        self.setPlaceholderText("Message Lanes (Enter sends, Shift+Enter adds a line)")
        self.setAccessibleName("Message")
        self.setTabChangesFocus(True)
        self.document().documentLayout().documentSizeChanged.connect(lambda _s: self._fit())
        self._fit()

    def _fit(self) -> None:
        line = self.fontMetrics().lineSpacing()
        lines = min(max(self.document().size().height(), 3), 10)
        margins = self.contentsMargins().top() + self.contentsMargins().bottom() + 2 * self.document().documentMargin()
        self.setFixedHeight(int(lines * line + margins))

    def attach(self, paths: list[Path]) -> None:
        """Insert each text file at the cursor as a fenced block; a file that cannot be is named."""
        for path in paths:
            try:
                block = fenced(path.name, read_text_file(path))
            except (LanesError, OSError) as exc:
                self.attachFailed.emit(str(exc))
                continue
            cursor = self.textCursor()
            if cursor.positionInBlock():  # a block starts on a line of its own
                cursor.insertText("\n")
            cursor.insertText(block)
            self.setTextCursor(cursor)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return any(u.isLocalFile() for u in source.urls()) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = [Path(u.toLocalFile()) for u in source.urls() if u.isLocalFile()]
        if files:
            self.attach(files)
        else:
            super().insertFromMimeData(source)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not (event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            text = self.toPlainText()
            if text.strip():
                self.submitted.emit(text)
            return
        super().keyPressEvent(event)
