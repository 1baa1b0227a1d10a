"""One chat message: a read-only text view that grows to fit its text, so many can be stacked in a
scroll area. It shows Markdown (Qt's importer, raw HTML off, fenced code coloured by pygments),
optionally with each run of the source tinted by where it came from (``set_spans``: the tints of
``app.theme.origin_background`` laid over the rendered text, placed by ``app.origin_overlay``). Text
wraps to the view; a table wider than it (``app.markdown_tables``) scrolls sideways, alone."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name, get_lexer_for_filename
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from pygments.token import Token, _TokenType
from pygments.util import ClassNotFound
from PySide6.QtCore import QEvent, QSize, Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QCursor,
    QDesktopServices,
    QFocusEvent,
    QFont,
    QGuiApplication,
    QImage,
    QKeyEvent,
    QPalette,
    QResizeEvent,
    QSyntaxHighlighter,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextOption,
    QWheelEvent,
)
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QToolTip, QWidget

from app.markdown_tables import size_table_columns
from app.origin_overlay import origin_runs
from app.theme import ORIGIN_LABELS, code_background, code_font, is_dark, origin_background
from engine.store.markdown_text import with_line_breaks

MARKDOWN_FEATURES = (
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
)
LINK_SCHEMES = frozenset({"http", "https", "mailto"})
COPY_SCHEME = "lanes-copy"  # a code block's Copy link
_PYGMENTS_STYLES = {False: "default", True: "monokai"}  # light, dark
_LANGUAGE = QTextFormat.Property.BlockCodeLanguage
_FENCE = QTextFormat.Property.BlockCodeFence

Line = tuple[tuple[int, int, _TokenType], ...]  # (start, length, token type), in UTF-16 units


def open_link(url: QUrl) -> bool:
    """Open a clicked link in the system's handler; only web and mail links, never files or apps."""
    if url.scheme().lower() not in LINK_SCHEMES:
        return False
    return QDesktopServices.openUrl(url)


@lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer:
    """The pygments lexer for a fence's info string (``python``, ``py``, ``rs``...); plain text if unknown.

    No guessing from the code: pygments' guess_lexer takes ~100 ms cold, and changes its mind as a
    streamed block grows (it calls short Python snippets TeraTerm)."""
    words = language.strip().lower().split()
    options = {"stripnl": False, "ensurenl": False}
    if words:
        name = words[0].strip("{}.")
        try:
            return get_lexer_by_name(name, **options)
        except ClassNotFound:
            pass
        try:
            return get_lexer_for_filename(f"code.{name}", **options)
        except ClassNotFound:
            pass
    return TextLexer(**options)


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@lru_cache(maxsize=32)
def _lex_lines(language: str, code: str) -> tuple[Line, ...]:
    """Token runs of each line of ``code``; the whole block is lexed at once so strings and
    comments that span lines come out right."""
    lines: list[list[tuple[int, int, _TokenType]]] = [[]]
    column = 0
    for ttype, value in _lexer(language).get_tokens(code):
        for i, part in enumerate(value.split("\n")):
            if i:
                lines.append([])
                column = 0
            if part:
                n = _utf16_len(part)
                lines[-1].append((column, n, ttype))
                column += n
    return tuple(tuple(line) for line in lines)


@lru_cache(maxsize=2)
def _style(dark: bool) -> StyleMeta:
    return get_style_by_name(_PYGMENTS_STYLES[dark])


@lru_cache(maxsize=1024)
def _token_format(dark: bool, ttype: _TokenType) -> QTextCharFormat | None:
    """The char format for a token type; None where the style leaves it as plain text, so the
    palette's own text colour shows (the dark style's base colour is not the palette's)."""
    style = _style(dark)
    while not style.styles_token(ttype) and ttype.parent is not None:  # e.g. YAML's Literal.Scalar.Plain
        ttype = ttype.parent  # the nearest type the style knows, as pygments' own formatters do
    spec, base = style.style_for_token(ttype), style.style_for_token(Token)
    fmt = QTextCharFormat()
    if spec["color"] and spec["color"] != base["color"]:
        fmt.setForeground(QColor(f"#{spec['color']}"))
    if spec["bold"] and not base["bold"]:
        fmt.setFontWeight(QFont.Weight.Bold)
    if spec["italic"] and not base["italic"]:
        fmt.setFontItalic(True)
    return fmt if fmt.properties() else None


def _code_key(block: QTextBlock) -> tuple[str, str, int, float] | None:
    """What makes consecutive blocks one fenced code block; None for anything else."""
    fmt = block.blockFormat()
    if not fmt.hasProperty(_FENCE):
        return None
    # stringProperty, not property(): PySide6 6.12's property() hands back an unowned None for a
    # missing property, which crashes the interpreter a few thousand calls later.
    return (fmt.stringProperty(_LANGUAGE), fmt.stringProperty(_FENCE), fmt.indent(), fmt.leftMargin())


class CodeHighlighter(QSyntaxHighlighter):
    """Colours fenced code blocks from Qt's Markdown importer with pygments.

    Each block's state is its line number inside its fence, so the fence is lexed once (when its first
    line is highlighted) and later lines take their slice."""

    def __init__(self, document: QTextDocument, dark: bool = False) -> None:
        super().__init__(document)
        self.dark = dark
        self.suspended = False  # set while the document is being rebuilt: one pass afterwards is enough
        self._start = -1
        self._lines: tuple[Line, ...] = ()

    def highlightBlock(self, text: str) -> None:
        if self.suspended:
            return
        block = self.currentBlock()
        key = _code_key(block)
        if key is None:
            self.setCurrentBlockState(-1)
            return
        previous = self.previousBlockState()
        index = previous + 1 if previous >= 0 and _code_key(block.previous()) == key else 0
        self.setCurrentBlockState(index)
        start = block.blockNumber() - index
        if index == 0 or start != self._start:
            self._start, self._lines = start, self._lex_fence(block, index, key)
        if index < len(self._lines):
            for column, length, ttype in self._lines[index]:
                fmt = _token_format(self.dark, ttype)
                if fmt is not None:
                    self.setFormat(column, length, fmt)

    @staticmethod
    def _lex_fence(block: QTextBlock, index: int, key: tuple[str, str, int, float]) -> tuple[Line, ...]:
        for _ in range(index):
            block = block.previous()
        texts = []
        while block.isValid() and _code_key(block) == key:
            texts.append(block.text())
            block = block.next()
        return _lex_lines(key[0], "\n".join(texts))


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
                has_code = _style_code_blocks(document, self._dark)
                self._has_tables = self._size_tables()
                if self._spans is not None:
                    _tint_origins(document, self._spans, self._dark)  # before the labels: they are not source
                self.code_blocks = _label_code_blocks(document) if has_code else []
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


def _style_code_blocks(document: QTextDocument, dark: bool) -> bool:
    """Give code blocks (fenced and indented) the code font and a tint, and let long lines wrap
    rather than run off the view (only a table scrolls sideways). Returns whether there were any."""
    block_format = QTextBlockFormat()
    block_format.setBackground(code_background(dark))
    block_format.setNonBreakableLines(False)
    char_format = QTextCharFormat()
    char_format.setFontFamilies(code_font().families())
    char_format.setFontFixedPitch(True)
    cursor = QTextCursor(document)
    found = False
    block = document.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(_LANGUAGE):
            if not found:
                cursor.beginEditBlock()
                found = True
            cursor.setPosition(block.position())
            cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeBlockFormat(block_format)
            cursor.mergeCharFormat(char_format)
        block = block.next()
    if found:
        cursor.endEditBlock()
    return found


def _label_code_blocks(document: QTextDocument) -> list[str]:
    """Put a line above each code block with its language and a Copy link (``lanes-copy:N``); returns
    each block's text, N in order. A block is a run of lines with the same fence."""
    blocks: list[tuple[int, str, list[str]]] = []  # (first line's block number, language, lines)
    block, previous = document.begin(), None
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(_LANGUAGE):
            language = str(fmt.property(_LANGUAGE) or "")
            if previous is not None and previous.blockFormat().hasProperty(_LANGUAGE) and blocks \
                    and blocks[-1][1] == language:
                blocks[-1][2].append(block.text())
            else:
                blocks.append((block.blockNumber(), language, [block.text()]))
        previous, block = block, block.next()
    cursor = QTextCursor(document)
    cursor.beginEditBlock()
    header = QTextBlockFormat()
    header.setTopMargin(6)
    for i, (number, language, _lines) in reversed(list(enumerate(blocks))):
        code = document.findBlockByNumber(number)
        cursor.setPosition(code.position())
        cursor.insertBlock(code.blockFormat(), code.charFormat())  # the code moves down a line, unchanged
        cursor.movePosition(QTextCursor.MoveOperation.PreviousBlock)
        cursor.setBlockFormat(header)
        label = QTextCharFormat()
        label.setFontPointSize(max(7.0, code.charFormat().font().pointSizeF() * 0.85))
        label.setForeground(QColor(128, 128, 128))
        cursor.insertText(f"{language or 'code'}   ", label)
        link = QTextCharFormat(label)
        link.setAnchor(True)
        link.setFontUnderline(True)
        link.setAnchorHref(f"{COPY_SCHEME}:{i}")
        link.setToolTip("Copy this code")
        cursor.insertText("Copy", link)
    cursor.endEditBlock()
    return ["\n".join(lines) for _n, _l, lines in blocks]


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
