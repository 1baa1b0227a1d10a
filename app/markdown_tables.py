"""Markdown tables laid out for reading: each column as wide as its widest line, up to a cap.

Qt lays a table's columns out to fit the page, and a message wraps anywhere (a long token must not
run off the view), so a table of many columns in a narrow window had columns one letter wide, its
words broken letter by letter. Here each column gets a fixed width instead: its widest line
unwrapped, or ``CAP_CHARS`` average characters where that is narrower (a longer cell wraps inside
the column, at words). A table wider than the view then scrolls sideways
(``app.message_view.MessageView``), as tables do on the web.

Worked example, in a font whose average character is 7 px: a column whose cells read "name",
"Ada" and "a long description of forty-one characters" (about 290 px unwrapped) gets
``min(290, 36 * 7) = 252`` px plus the cells' padding and border; a column of "id", "1", "2" gets
its widest line, "id", plus the same.
"""

from __future__ import annotations

from collections.abc import Iterator

from PySide6.QtGui import QFont, QFontMetricsF, QTextDocument, QTextFrame, QTextLength, QTextTable

CAP_CHARS = 36  # a column wider than this wraps inside: a sentence stays readable, a table compact


def column_width(line_widths: list[float], cap: float) -> float:
    """A column's text width: its widest line, at most ``cap`` (0 for a column of empty cells)."""
    return min(max(line_widths, default=0.0), cap)


def size_table_columns(document: QTextDocument) -> bool:
    """Fix the column widths of every table in ``document`` (module docstring); returns whether it
    has any."""
    tables = list(_tables(document.rootFrame()))
    if not tables:
        return False
    base = document.defaultFont()
    cap = CAP_CHARS * QFontMetricsF(base).averageCharWidth()
    for table in tables:
        fmt = table.format()
        edges = 2 * (fmt.cellPadding() + fmt.border()) + 1  # a cell's padding and border each side
        widths = [column_width(_line_widths(document, table, column, base), cap) + edges
                  for column in range(table.columns())]
        fmt.setColumnWidthConstraints([QTextLength(QTextLength.Type.FixedLength, w) for w in widths])
        table.setFormat(fmt)
    return True


def _tables(frame: QTextFrame) -> Iterator[QTextTable]:
    for child in frame.childFrames():
        if isinstance(child, QTextTable):
            yield child
        yield from _tables(child)


def _line_widths(document: QTextDocument, table: QTextTable, column: int, base: QFont) -> list[float]:
    """The unwrapped width of each paragraph in ``column``'s cells, in each fragment's own font."""
    widths = []
    for row in range(table.rows()):
        cell = table.cellAt(row, column)
        if cell.column() != column:  # a cell spanning from a column to the left
            continue
        block = document.findBlock(cell.firstPosition())
        while block.isValid() and block.position() <= cell.lastPosition():
            width, it = 0.0, block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                font = fragment.charFormat().font().resolve(base)
                width += QFontMetricsF(font).horizontalAdvance(fragment.text())
                it += 1
            widths.append(width)
            block = block.next()
    return widths
