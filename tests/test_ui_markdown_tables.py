"""Markdown tables in a message (app.markdown_tables, app.message_view), on the real offscreen Qt:
words kept whole, columns as wide as the room allows, a table whose words cannot fit scrolling
sideways while the text around it wraps to the view."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QFontMetricsF, QTextBlock, QTextTable, QWheelEvent
from PySide6.QtWidgets import QApplication

from app.markdown_tables import CAP_CHARS, column_widths
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


def test_column_widths_share_the_room_as_the_docstring_works_it() -> None:
    assert column_widths([50, 200, 150], [30, 60, 60], room=300) == pytest.approx([42, 144, 114])
    assert column_widths([50, 200, 150], [30, 60, 60], room=500) == [50, 200, 150]  # all fit
    assert column_widths([50, 200, 150], [30, 60, 60], room=100) == [30, 60, 60]  # scrolls
    assert column_widths([0, 20], [0, 80], room=10) == [0, 20]  # a need past the cap: broken there


def table_width(view: MessageView) -> float:
    return view.document().documentLayout().frameBoundingRect(table_of(view)).width()


def test_a_table_narrows_its_columns_to_the_room_before_it_scrolls(view: MessageView, qtbot) -> None:
    # This table's columns want ~715 px at the test font, their longest words ~540.
    view.window().resize(1000, 300)
    view.set_markdown(WIDE)
    qtbot.waitUntil(lambda: view.viewport().width() > 900)
    assert view.horizontalScrollBar().maximum() == 0
    natural = table_width(view)
    assert natural < view.viewport().width() - 100  # each column its want: no stretching
    assert all(len(lines(cell_block(view, 1, c))) == 1 for c in range(len(HEADS) - 1))
    view.window().resize(700, 300)  # room for the words, not for every want
    qtbot.waitUntil(lambda: table_width(view) < natural)
    assert view.horizontalScrollBar().maximum() == 0
    assert view.viewport().width() - 20 < table_width(view) <= view.viewport().width()  # it fills the room
    notes = lines(cell_block(view, 1, len(HEADS) - 1))
    assert len(notes) > 1 and all(line.endswith(" ") for line in notes[:-1])
    view.window().resize(420, 300)  # narrower than the words need: it scrolls
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() > 0)
    assert [lines(cell_block(view, 0, c)) for c in range(len(HEADS))] == [[h] for h in HEADS]


def test_a_wide_table_keeps_its_words_and_scrolls_sideways(view: MessageView, qtbot) -> None:
    view.set_markdown(WIDE)
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() > 0)
    for column, word in enumerate(HEADS):  # before, eight columns in 420 px broke these letter by letter
        assert lines(cell_block(view, 0, column)) == [word]
    for column, text in enumerate(ROW):  # cells wrap at spaces only
        assert "".join(parts := lines(cell_block(view, 1, column))) == text
        assert all(line.endswith(" ") for line in parts[:-1])
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


def test_a_new_wide_table_shows_its_first_column(view: MessageView, qtbot) -> None:
    view.set_markdown("Before.\n\n" + WIDE.split("\n\n")[1])  # the table last: the caret's end is its last cell
    qtbot.waitUntil(lambda: view.horizontalScrollBar().maximum() > 0)
    qtbot.wait(20)
    assert view.horizontalScrollBar().value() == 0


def test_a_plain_message_never_scrolls_sideways(view: MessageView) -> None:
    view.set_markdown("Words " * 200)
    assert view.horizontalScrollBar().maximum() == 0
    assert not wheel(view, QPoint(-120, 0), Qt.KeyboardModifier.NoModifier)


def test_a_zoom_sizes_the_columns_again(view: MessageView, qtbot) -> None:
    view.window().resize(1000, 300)
    view.set_markdown(WIDE)
    qtbot.waitUntil(lambda: view.viewport().width() > 900)
    before = table_width(view)
    font = view.font()
    font.setPointSizeF(font.pointSizeF() * 1.5)
    view.window().setFont(font)  # as View > Zoom In sets the chat's font
    qtbot.waitUntil(lambda: table_width(view) > before * 1.1)  # words 1.5x as wide: more room taken
    assert [lines(cell_block(view, 0, c)) for c in range(len(HEADS))] == [[h] for h in HEADS]
