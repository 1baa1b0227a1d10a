"""A one-line label that shows as much of its text as fits, ending in "…" (the window's title of the
shown conversation). Its minimum width is a few characters, so a long text never widens the pane it
sits in: a plain QLabel's minimum is its whole text, which made a long conversation title squeeze
the sidebar when the window narrowed."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel


class ElidedLabel(QLabel):
    """``text()`` stays the whole text (and the tooltip shows it where it is cut); only the
    painting is elided."""

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.fontMetrics().horizontalAdvance("Wwww…")), hint.height())

    def setText(self, text: str) -> None:
        super().setText(text)
        self._tip()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._tip()

    def elided(self) -> str:
        """The text as painted at the label's width."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.drawText(self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), self.elided())
        painter.end()

    def _tip(self) -> None:
        self.setToolTip(self.text() if self.elided() != self.text() else "")
