"""One chat message: a read-only text view that grows to fit its text, so many can be stacked in a
scroll area. It shows Markdown (Qt's importer, raw HTML off, fenced code coloured by pygments),
optionally with each run of the source tinted by where it came from (``set_spans``: the tints of
``app.theme.origin_background`` laid over the rendered text, placed by ``app.origin_overlay``). Text
wraps to the view; a table wider than it (``app.markdown_tables``) scrolls sideways, alone."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import QEvent, QSize, Qt, QUrl
from PySide6.QtGui import (
    QCursor,
    QDesktopServices,
    QFocusEvent,
    QGuiApplication,
    QImage,
    QKeyEvent,
    QPalette,
    QResizeEvent,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextOption,
    QWheelEvent,
)
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QToolTip, QWidget

from app.code_blocks import COPY_SCHEME, CodeHighlighter, label_code_blocks, style_code_blocks
from app.markdown_tables import size_table_columns
from app.origin_overlay import origin_runs
from app.theme import ORIGIN_LABELS, is_dark, origin_background
from engine.store.markdown_text import with_line_breaks

MARKDOWN_FEATURES = (
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
)
LINK_SCHEMES = frozenset({"http", "https", "mailto"})



def open_link(url: QUrl) -> bool:
    """Open a clicked link in the system's handler; only web and mail links, never files or apps."""
    if url.scheme().lower() not in LINK_SCHEMES:
        return False
    return QDesktopServices.openUrl(url)



class MessageView(QTextBrowser):
    """One chat message, sized to its text: no frame, no background, no scroll bar of its own but a
    sideways one under a table wider than the view."""

    def __init__(self, parent: QWidget | None = None, muted: bool = False) -> None:
        super().__init__(parent)
        self._muted = muted  # text in the palette's placeholder colour (a model's thinking)
        self._source = ""
        self._spans: list[tuple[str, str]] | None = None  # None: no origins to tint
        self._has_tables = False
        self._tables_width = 0  # the text width the tables were last sized for
        self._dark = is_dark(self)
        document = self.document()
        document.setUndoRedoEnabled(False)  # streaming would otherwise pile up undo steps
        self._highlighter = CodeHighlighter(document, self._dark)

        self.setReadOnly(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.viewport().setAutoFillBackground(False)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextBrowserInteraction | Qt.TextInteractionFlag.TextSelectableByKeyboard
        )
        # openLinks must be off too: with it on, QTextBrowser "navigates" to the link and drops the message.
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._clicked)
        self.code_blocks: list[str] = []  # each code block's text, for its Copy link
        document.documentLayout().documentSizeChanged.connect(self._fit_height)
        self.setAccessibleName("Message text")
        self.setAccessibleDescription("The text of one chat message; select it to copy part of it")
        self._mute()
        self._fit_height()

    def _mute(self) -> None:
        """A muted view's text colour, from the palette (not a style sheet: one would stop the
        chat's zoom, a font set on the chat, from reaching this view)."""
        palette = self.palette()
        muted = palette.color(QPalette.ColorRole.PlaceholderText)
        if self._muted and palette.color(QPalette.ColorRole.Text) != muted:
            palette.setColor(QPalette.ColorRole.Text, muted)
            self.setPalette(palette)

    def set_markdown(self, text: str) -> None:
        """Show ``text`` as GitHub-flavoured Markdown; raw HTML stays literal text. Cheap enough to call
        on every streamed update."""
        if self._spans is None and text == self._source and not self.document().isEmpty():
            return
        self._source, self._spans = text, None
        self._render()

    def set_spans(self, spans: list[tuple[str, str]]) -> None:
        """Show the joined (piece, origin) runs as Markdown, exactly as ``set_markdown`` would, with
        each run's rendered text tinted by its origin."""
        spans = list(spans)
        if spans == self._spans:
            return
        self._source, self._spans = "".join(piece for piece, _ in spans), spans
        self._render()

    def plain_text(self) -> str:
        """The text last given (Markdown source or the joined spans), for "copy message"."""
        return self._source

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self._content_height())

    def loadResource(self, type: int, name: QUrl) -> object:
        """Load nothing: a message must not show local files or fetch anything. A null QImage, not
        None: on None QTextDocument falls back to reading local files itself."""
        return QImage()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange and getattr(self, "_has_tables", False):
            self._size_tables()  # a zoom: the columns' words changed width
        palette_change = event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange)
        if palette_change and hasattr(self, "_highlighter"):  # not while QTextBrowser is still being built
            self._mute()
            dark = is_dark(self)
            if dark != self._dark:
                self._dark = self._highlighter.dark = dark
                self._render()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if self._has_tables and self.viewport().width() != self._tables_width:
            self._size_tables()  # their room changed
        self._fit_height()

    def wheelEvent(self, event: QWheelEvent) -> None:
        """Never scroll or zoom one message alone: the wheel belongs to the list around it, but for
        a sideways swipe (or Shift and the wheel) over a table wider than the view."""
        bar = self.horizontalScrollBar()
        shift = bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        pixels, angle = event.pixelDelta(), event.angleDelta()
        sideways = pixels.x() or (pixels.y() if shift else 0)
        if not sideways:
            notches = (angle.x() or (angle.y() if shift else 0)) / 120
            sideways = round(notches * 3 * bar.singleStep())
        if bar.maximum() > 0 and sideways:
            bar.setValue(bar.value() - sideways)
            event.accept()
            return
        event.ignore()

    def focusInEvent(self, event: QFocusEvent) -> None:
        super().focusInEvent(event)
        if event.reason() in (Qt.FocusReason.TabFocusReason, Qt.FocusReason.BacktabFocusReason):
            self.setFrameShape(QFrame.Shape.Box)  # a message reached with Tab shows that it has the keyboard

    def focusOutEvent(self, event: QFocusEvent) -> None:
        super().focusOutEvent(event)
        self.setFrameShape(QFrame.Shape.NoFrame)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Page keys and Ctrl+Home / Ctrl+End scroll the whole chat, not a caret inside one message."""
        ctrl = bool(event.modifiers() & Qt.KeyboardModifier.ControlModifier)
        if event.key() in (Qt.Key.Key_PageUp, Qt.Key.Key_PageDown) or (
                ctrl and event.key() in (Qt.Key.Key_Home, Qt.Key.Key_End)):
            event.ignore()  # to the chat around it
            return
        super().keyPressEvent(event)

    def _render(self) -> None:
        document = self.document()
        with self._view_kept():
            self._highlighter.suspended = True
            try:
                document.setMarkdown(with_line_breaks(self._source), MARKDOWN_FEATURES)
                has_code = style_code_blocks(document, self._dark)
                self._has_tables = self._size_tables()
                if self._spans is not None:
                    _tint_origins(document, self._spans, self._dark)  # before the labels: they are not source
                self.code_blocks = label_code_blocks(document) if has_code else []
            finally:
                self._highlighter.suspended = False
            if has_code:
                self._highlighter.rehighlight()

    def _size_tables(self) -> bool:
        """Size the tables for the width the text wraps at (the document's own width can lag a
        resize); returns whether there are any."""
        self._tables_width = self.viewport().width()
        return size_table_columns(self.document(), self._tables_width)

    def _clicked(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:  # a code block's Copy link
            i = int(url.path() or -1)
            if 0 <= i < len(self.code_blocks):
                QGuiApplication.clipboard().setText(self.code_blocks[i])
                QToolTip.showText(QCursor.pos(), "Copied", self)
            return
        open_link(url)

    @contextmanager
    def _view_kept(self) -> Iterator[None]:
        """Keep a selection the reader is making, and how far a wide table is scrolled sideways,
        while the message is replaced under it."""
        cursor = self.textCursor()
        anchor, position = (cursor.anchor(), cursor.position()) if cursor.hasSelection() else (-1, -1)
        sideways = self.horizontalScrollBar().value()
        yield
        end = self.document().characterCount() - 1
        cursor = QTextCursor(self.document())  # at the start, else the view scrolls to show the caret
        if anchor >= 0:
            cursor.setPosition(min(anchor, end))
            cursor.setPosition(min(position, end), QTextCursor.MoveMode.KeepAnchor)
        self.setTextCursor(cursor)
        self._fit_height()
        if self.verticalScrollBar().value():
            self.verticalScrollBar().setValue(0)  # the message is as tall as its text: nothing to scroll
        self.horizontalScrollBar().setValue(sideways)  # clamped to the new text's range

    def _content_height(self) -> int:
        margins, viewport = self.contentsMargins(), self.viewportMargins()
        size = self.document().size()
        wide = size.width() > self.viewport().width() + 0.5  # a table wider than the view: its bar shows
        return (
            math.ceil(size.height())
            + margins.top()
            + margins.bottom()
            + viewport.top()
            + viewport.bottom()
            + (self.horizontalScrollBar().sizeHint().height() if wide else 0)
        )

    def _fit_height(self) -> None:
        height = self._content_height()
        if self.minimumHeight() != height or self.maximumHeight() != height:
            self.setFixedHeight(height)  # also tells the layout around it



def _tint_origins(document: QTextDocument, spans: list[tuple[str, str]], dark: bool) -> None:
    """Lay each tinted origin's background (and a tooltip naming it) over the rendered text its spans
    became. A char format, so the code highlighter's colours (layout formats) still show over it."""
    if all(origin_background(origin, dark) is None for _, origin in spans):
        return  # all the model's own words: nothing to place
    cursor = QTextCursor(document)
    cursor.beginEditBlock()
    for start, end, origin in origin_runs(spans, document.toRawText()):
        background = origin_background(origin, dark)
        if background is None:
            continue
        fmt = QTextCharFormat()
        fmt.setBackground(background)
        fmt.setToolTip(ORIGIN_LABELS.get(origin, origin))
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(fmt)
    cursor.endEditBlock()
