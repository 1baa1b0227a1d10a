"""The theme (system, light or dark) and the chat's text size, as Settings and the View menu set them.

A platform that follows a colour scheme (macOS, Windows, GNOME) is asked for it first; where the
palette does not follow (other Linux desktops, offscreen), Fusion's palette of that scheme is set.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication, QWidget

SCHEMES = {"system": Qt.ColorScheme.Unknown, "light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}
ZOOM_STEP = 1.1


def dark_palette() -> QPalette:
    p = QPalette()
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    for r, colour in ((role.Window, "#232325"), (role.WindowText, "#ececf0"), (role.Base, "#1c1c1e"),
                      (role.AlternateBase, "#2c2c2e"), (role.Text, "#ececf0"), (role.Button, "#2f2f31"),
                      (role.ButtonText, "#ececf0"), (role.Highlight, "#0a64d6"), (role.HighlightedText, "#ffffff"),
                      (role.ToolTipBase, "#2c2c2e"), (role.ToolTipText, "#ececf0"), (role.PlaceholderText, "#98989d"),
                      (role.Link, "#6ab0ff"), (role.Mid, "#48484a"), (role.Dark, "#101012"), (role.Light, "#3a3a3c")):
        p.setColor(r, QColor(colour))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(group.Disabled, r, QColor("#6e6e73"))
    return p


def apply_theme(app: QApplication, theme: str) -> None:
    """Show ``theme`` ("system", "light" or "dark") in every window of ``app``."""
    app.styleHints().setColorScheme(SCHEMES.get(theme, Qt.ColorScheme.Unknown))
    if theme == "system":
        app.setPalette(app.style().standardPalette())
        return
    dark = app.palette().color(QPalette.ColorRole.Window).lightness() < 128
    if dark != (theme == "dark"):  # the platform did not follow: set the scheme's palette ourselves
        app.setPalette(dark_palette() if theme == "dark" else app.style().standardPalette())


def apply_text_scale(widgets: list[QWidget], scale: float) -> None:
    """The chat's text at ``scale`` times the application's size (messages and the composer)."""
    base = QApplication.font().pointSizeF()
    for w in widgets:
        font = QFont(w.font())
        font.setPointSizeF(base * scale)
        w.setFont(font)
