"""Markdown tables in a message (app.markdown_tables, app.message_view), on the real offscreen Qt:
columns as wide as their text up to a cap, words kept whole, a table wider than the view scrolling
sideways on its own while the text around it wraps to the view."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QFontMetricsF, QTextBlock, QTextTable, QWheelEvent
from PySide6.QtWidgets import QApplication

from app.markdown_tables import CAP_CHARS, column_width
from app.message_view import MessageView
from tests.test_ui_message_view import stacked_view

HEADS = ["Model", "Parameters", "Context", "Quantization", "Speed", "Memory", "License", "Notes"]
ROW = ["SmolLM2-135M", "135 million", "8192 tokens", "4-bit", "fast", "small", "Apache-2.0",
       "the embedded default model, which runs anywhere and answers quickly on any machine it is given"]
AFTER = "And text after the table, which wraps at the width of the view as every paragraph does."
WIDE = ("A table:\n\n| " + " | ".join(HEADS) + " |\n|" + "---|" * len(HEADS) + "\n| " + " | ".join(ROW)
        + " |\n\n" + AFTER)


@pytest.fixture
def view(qtbot) -> Iterator[MessageView]:
    area, v = stacked_view(qtbot)
    yield v
    area.close()


def table_of(view: MessageView) -> QTextTable:
    (table,) = [f for f in view.document().rootFrame().childFrames() if isinstance(f, QTextTable)]
    return table


def cell_block(view: MessageView, row: int, column: int) -> QTextBlock:
    return view.document().findBlock(table_of(view).cellAt(row, column).firstPosition())


def lines(block: QTextBlock) -> list[str]:
    layout, text = block.layout(), block.text()
    return [text[(line := layout.lineAt(i)).textStart(): line.textStart() + line.textLength()]
            for i in range(layout.lineCount())]


def test_column_width_is_the_widest_line_up_to_the_cap() -> None:
    assert column_width([12.0, 40.0, 25.5], cap=100.0) == 40.0
    assert column_width([12.0, 400.0], cap=100.0) == 100.0
    assert column_width([], cap=100.0) == 0.0  # a column of empty cells: padding only


def test_a_wide_table_keeps_its_words_and_scrolls_sideways(view: MessageView, qtbot) -> None:
    view.set_markdown(WIDE)
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() > 0)
    for column, word in enumerate(HEADS):  # before, eight columns in 420 px broke these letter by letter
        assert lines(cell_block(view, 0, column)) == [word]
    for column in range(len(HEADS) - 1):
        assert len(lines(cell_block(view, 1, column))) == 1
    after = view.document().lastBlock()
    assert after.text() == AFTER and len(lines(after)) > 1  # the text still wraps to the view
    assert after.layout().boundingRect().width() <= view.viewport().width()
    bar = view.horizontalScrollBar()
    assert view.height() >= view.document().size().height() + bar.sizeHint().height()
    assert view.verticalScrollBar().maximum() == 0  # the bar's height was added: no text hidden under it


def test_a_long_cell_wraps_at_words_within_the_cap(view: MessageView) -> None:
    view.set_markdown(WIDE)
    notes = lines(cell_block(view, 1, len(HEADS) - 1))
    assert len(notes) > 1 and "".join(notes) == ROW[-1]
    assert all(line.endswith(" ") for line in notes[:-1])  # broken at spaces, never inside a word
    cap = CAP_CHARS * QFontMetricsF(view.document().defaultFont()).averageCharWidth()
    assert max(QFontMetricsF(view.document().defaultFont()).horizontalAdvance(x.rstrip()) for x in notes) <= cap


def test_a_narrow_table_fits_without_a_bar(view: MessageView, qtbot) -> None:
    view.set_markdown("| a | b |\n|---|---|\n| one two | three |\n")
    qtbot.wait(10)
    assert view.horizontalScrollBar().maximum() == 0
    assert lines(cell_block(view, 1, 0)) == ["one two"]
    assert view.height() < 100  # no bar's height added


def wheel(view: MessageView, angle: QPoint, modifiers: Qt.KeyboardModifier) -> bool:
    centre = QPointF(view.viewport().rect().center())
    event = QWheelEvent(centre, view.viewport().mapToGlobal(centre), QPoint(), angle,
                        Qt.MouseButton.NoButton, modifiers, Qt.ScrollPhase.NoScrollPhase, False)
    event.ignore()
    QApplication.sendEvent(view.viewport(), event)
    return event.isAccepted()


def test_sideways_wheel_scrolls_a_wide_table_and_streaming_keeps_it(view: MessageView, qtbot) -> None:
    view.set_markdown(WIDE)
    bar = view.horizontalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    assert not wheel(view, QPoint(0, -120), Qt.KeyboardModifier.NoModifier)  # down: the chat scrolls
    assert bar.value() == 0
    assert wheel(view, QPoint(-120, 0), Qt.KeyboardModifier.NoModifier)  # a swipe to the right
    swiped = bar.value()
    assert swiped > 0
    assert wheel(view, QPoint(0, -120), Qt.KeyboardModifier.ShiftModifier)
    assert bar.value() > swiped
    kept = bar.value()
    view.set_markdown(WIDE + " More streamed words.")
    assert bar.value() == kept  # a streamed token does not throw the reader back to the left


def test_a_plain_message_never_scrolls_sideways(view: MessageView) -> None:
    view.set_markdown("Words " * 200)
    assert view.horizontalScrollBar().maximum() == 0
    assert not wheel(view, QPoint(-120, 0), Qt.KeyboardModifier.NoModifier)
