"""Colours and fonts shared by the chat widgets, chosen to read well in both light and dark mode.

The origin tints mark where a reply's text came from (see ``engine.service.spans``): text the model wrote is
left alone, text copied from this conversation is teal, text recalled from another one is violet.
Each tint keeps a WCAG contrast of at least 7:1 with black text (light) or white text (dark).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

ORIGINS = ("model", "context", "recall")
ORIGIN_LABELS = {
    "model": "Written by the model",
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


class OriginLegend(QWidget):
    """Explains the origin tints, shown above the chat while colouring by origin is on: each origin's
    name drawn as text of that origin is drawn (a tinted label, like the copied text itself; the
    model's own words plain), so nothing in it looks like a control."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Text origin colours")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        self.labels: dict[str, QLabel] = {}
        for origin in ORIGINS:
            label = QLabel(ORIGIN_LABELS[origin], self)
            label.setAccessibleName(ORIGIN_LABELS[origin])
            label.setAccessibleDescription("No highlight: the model's own words" if origin_background(origin, False)
                                           is None else "Text with this background came from here")
            self.labels[origin] = label
            layout.addWidget(label)
            layout.addSpacing(6)
        layout.addStretch(1)
        self._tint()

    def _tint(self) -> None:
        dark = is_dark(self)
        for origin, label in self.labels.items():
            fill = origin_background(origin, dark)
            label.setStyleSheet("padding: 1px 6px; border-radius: 4px;"
                                + (f" background: {fill.name()};" if fill is not None else ""))

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._tint()


# Flat and auto-raised buttons draw no frame, so keyboard focus on them showed nothing: a ring then.
FOCUS_RING = ("QPushButton:flat:focus, QToolButton[autoRaise=\"true\"]:focus "
              "{ border: 2px solid palette(highlight); border-radius: 4px; }")

