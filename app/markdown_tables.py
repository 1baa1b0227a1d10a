"""Markdown tables laid out for reading: words kept whole, columns as wide as their text allows.

Qt lays a table's columns out to fit the page, and a message wraps anywhere (a long token must not
run off the view), so a table of many columns in a narrow window had columns one letter wide, its
words broken letter by letter. Here each column gets a fixed width, as a web browser's automatic
table layout picks it: a column wants its widest line unwrapped (at most ``CAP_CHARS`` average
characters: a longer cell wraps inside the column) and needs its longest word. Where every column's
want fits the room, each gets it; where even the needs do not, each gets its need and the table
scrolls sideways (``app.message_view.MessageView``); between, each column gets its need plus a
share of the room left, in proportion to how much more it wants.

Worked example (``column_widths``), 300 px of room (the cells' padding and borders taken out):
columns wanting 50, 200 and 150 px (400 in all) and needing 30, 60 and 60 (150) share the 150 px
left over their 250 px of want beyond need: 0.6 of each column's extra, so 30 + 12 = 42,
60 + 84 = 144 and 60 + 54 = 114, which fill the 300.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from PySide6.QtGui import (
    QFont,
    QFontMetricsF,
    QTextCursor,
    QTextDocument,
    QTextFrame,
    QTextLength,
    QTextTable,
    QTextTableFormat,
)

CAP_CHARS = 36  # a column wider than this wraps inside: a sentence stays readable, a table compact
_METRICS: dict[str, QFontMetricsF] = {}
_OUTSIDE: dict[tuple[float, float, bool, int, float], float] = {}  # by table shape: see _outside


def column_widths(wants: list[float], needs: list[float], room: float) -> list[float]:
    """Each column's text width (module docstring): ``wants`` where they fit in ``room``, ``needs``
    where those do not, else each need plus the same fraction of its want beyond it."""
    needs = [min(n, w) for n, w in zip(needs, wants, strict=True)]
    if sum(wants) <= room:
        return list(wants)
    extra = sum(wants) - sum(needs)
    if sum(needs) >= room or extra <= 0:
        return needs
    share = (room - sum(needs)) / extra
    return [n + share * (w - n) for n, w in zip(needs, wants, strict=True)]


def size_table_columns(document: QTextDocument, width: float) -> bool:
    """Fix the column widths of every table in ``document`` for laying it out ``width`` wide (module
    docstring); returns whether it has any. Call again when that width or the font changes."""
    tables = list(_tables(document.rootFrame()))
    if not tables:
        return False
    base = document.defaultFont()
    cap = CAP_CHARS * QFontMetricsF(base).averageCharWidth()
    for table in tables:
        fmt = table.format()
        edges = 2 * (fmt.cellPadding() + fmt.border()) + 1  # a cell's padding and border each side
        wants, needs = [], []
        for column in range(table.columns()):
            lines, words = _measure(document, table, column, base)
            wants.append(min(lines, cap))
            needs.append(words)
        room = width - _outside(fmt, table.columns(), document.documentMargin()) - table.columns() * edges
        widths = column_widths(wants, needs, room - document.documentMargin())
        fmt.setColumnWidthConstraints([QTextLength(QTextLength.Type.FixedLength, w + edges) for w in widths])
        table.setFormat(fmt)
    return True


def _probe(fmt: QTextTableFormat, columns: int, margin: float) -> float:
    probe = QTextDocument()
    probe.setDocumentMargin(margin)
    probe.setTextWidth(100_000)  # room for any table: nothing squeezed
    fmt = QTextTableFormat(fmt)
    fmt.setColumnWidthConstraints([QTextLength(QTextLength.Type.FixedLength, 50)] * columns)
    table = QTextCursor(probe).insertTable(1, columns, fmt)
    return probe.documentLayout().frameBoundingRect(table).right() - 50 * columns


def _outside(fmt: QTextTableFormat, columns: int, margin: float) -> float:
    """From the page's left edge to a table's right edge, beyond its columns' widths: Qt places a
    table a few pixels in from the document's margin. Laid out once per shape in a probe document."""
    key = (fmt.border(), fmt.cellPadding(), fmt.borderCollapse(), columns, margin)
    if key not in _OUTSIDE:
        _OUTSIDE[key] = _probe(fmt, columns, margin)
    return _OUTSIDE[key]


def _tables(frame: QTextFrame) -> Iterator[QTextTable]:
    for child in frame.childFrames():
        if isinstance(child, QTextTable):
            yield child
        yield from _tables(child)


def _measure(document: QTextDocument, table: QTextTable, column: int, base: QFont) -> tuple[float, float]:
    """The widest unwrapped paragraph and the widest word of ``column``'s cells, each fragment in
    its own font (a header's bold is wider)."""
    widest_line = widest_word = 0.0
    for row in range(table.rows()):
        cell = table.cellAt(row, column)
        if cell.column() != column:  # a cell spanning from a column to the left
            continue
        block = document.findBlock(cell.firstPosition())
        while block.isValid() and block.position() <= cell.lastPosition():
            line, it = 0.0, block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                font = fragment.charFormat().font().resolve(base)
                key = font.key()
                if key not in _METRICS:
                    _METRICS[key] = QFontMetricsF(font)
                line += _advance(key, fragment.text())
                widest_word = max([widest_word, *(_advance(key, w) for w in fragment.text().split())])
                it += 1
            widest_line = max(widest_line, line)
            block = block.next()
    return widest_line, widest_word


@lru_cache(maxsize=8192)  # a streamed table is measured again at every token: its cells repeat
def _advance(font_key: str, text: str) -> float:
    return _METRICS[font_key].horizontalAdvance(text)
