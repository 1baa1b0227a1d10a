"""Colours and fonts shared by the chat widgets, chosen to read well in both light and dark mode.

The origin tints mark where a reply's text came from (see ``engine.service.spans``): text the model wrote is
left alone, text copied from this conversation is teal, text recalled from another one is violet.
Each tint keeps a WCAG contrast of at least 7:1 with black text (light) or white text (dark).
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

ORIGINS = ("model", "context", "recall")
ORIGIN_LABELS = {
    "model": "Model",
    "context": "Copied from this conversation",
    "recall": "Recalled from another conversation",
}

# (light, dark) per origin; "model" has none so most text stays plain.
_ORIGIN_TINTS = {
    "context": ("#c9efe8", "#1b4d47"),  # soft teal
    "recall": ("#ecd8f7", "#4d2a5e"),  # soft violet
}


def is_dark(widget: QWidget) -> bool:
    """Whether ``widget`` is drawn in a dark theme, judged from its own (inherited) palette."""
    return widget.palette().color(QPalette.ColorRole.Window).lightness() < 128


def origin_background(origin: str, dark: bool) -> QColor | None:
    """Background for text of ``origin``; None for model text and for origins this app does not know."""
    tints = _ORIGIN_TINTS.get(origin)
    return None if tints is None else QColor(tints[dark])


def code_background(dark: bool) -> QColor:
    """A translucent tint behind code blocks, so it sits on whatever the window colour is."""
    return QColor(255, 255, 255, 22) if dark else QColor(0, 0, 0, 13)


def code_font() -> QFont:
    """The system's fixed-width font, as the platform's terminals and editors use it."""
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


class OriginSwatch(QWidget):
    """A small square in an origin's tint; an empty outlined square for model text, which has none."""

    def __init__(self, origin: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.origin = origin
        side = self.fontMetrics().height() - 2
        self.setFixedSize(QSize(side, side))
        label = ORIGIN_LABELS.get(origin, origin)
        self.setAccessibleName(f"{label} colour")
        self.setAccessibleDescription(
            "No highlight"
            if origin_background(origin, False) is None
            else "Text with this background came from here"
        )
        self.setToolTip(label)

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fill = origin_background(self.origin, is_dark(self))
        painter.setPen(self.palette().color(QPalette.ColorRole.Mid))
        painter.setBrush(fill if fill is not None else Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5), 3, 3)


class OriginLegend(QWidget):
    """Explains the origin tints; shown above the chat while colouring by origin is on."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Text origin colours")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        for origin in ORIGINS:
            swatch = OriginSwatch(origin, self)
            text = QLabel(ORIGIN_LABELS[origin], self)
            text.setAccessibleName(ORIGIN_LABELS[origin])
            text.setBuddy(swatch)
            layout.addWidget(swatch)
            layout.addWidget(text)
            layout.addSpacing(12)
        layout.addStretch(1)
