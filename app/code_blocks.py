"""Fenced code in a message: coloured by pygments (``CodeHighlighter``), set in the code font on a tint
(``style_code_blocks``), and labelled with its language and a Copy link (``label_code_blocks``).
Qt's Markdown importer marks each line of a fence with the fence's language and marker; a run of
lines with the same marks is one block."""

from __future__ import annotations

from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name, get_lexer_for_filename
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from pygments.token import Token, _TokenType
from pygments.util import ClassNotFound
from PySide6.QtGui import (
    QColor,
    QFont,
    QSyntaxHighlighter,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)

from app.theme import code_background, code_font

COPY_SCHEME = "lanes-copy"  # a code block's Copy link
PYGMENTS_STYLES = {False: "default", True: "monokai"}  # light, dark
_LANGUAGE = QTextFormat.Property.BlockCodeLanguage
_FENCE = QTextFormat.Property.BlockCodeFence

Line = tuple[tuple[int, int, _TokenType], ...]  # (start, length, token type), in UTF-16 units


@lru_cache(maxsize=64)
def lexer_for(language: str) -> Lexer:
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
def lex_lines(language: str, code: str) -> tuple[Line, ...]:
    """Token runs of each line of ``code``; the whole block is lexed at once so strings and
    comments that span lines come out right."""
    lines: list[list[tuple[int, int, _TokenType]]] = [[]]
    column = 0
    for ttype, value in lexer_for(language).get_tokens(code):
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
def pygments_style(dark: bool) -> StyleMeta:
    return get_style_by_name(PYGMENTS_STYLES[dark])


@lru_cache(maxsize=1024)
def _token_format(dark: bool, ttype: _TokenType) -> QTextCharFormat | None:
    """The char format for a token type; None where the style leaves it as plain text, so the
    palette's own text colour shows (the dark style's base colour is not the palette's)."""
    style = pygments_style(dark)
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
        return lex_lines(key[0], "\n".join(texts))

def style_code_blocks(document: QTextDocument, dark: bool) -> bool:
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


def label_code_blocks(document: QTextDocument) -> list[str]:
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
