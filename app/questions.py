"""The question asked before something that cannot be undone, as a Mac app words it: the button that
goes ahead names the action ("Delete", "Quit"), and Cancel is the default and what Esc answers, so a
stray Enter never deletes anything."""

from __future__ import annotations

from PySide6.QtCore import SignalInstance
from PySide6.QtWidgets import QMessageBox, QWidget


def confirm(parent: QWidget, title: str, text: str, action: str, moot: SignalInstance | None = None) -> bool:
    """Whether the user chose ``action`` over Cancel. ``moot``: a signal whose falsy value means the
    reason to ask has gone (the replies a quit would cut short have finished): the box then closes
    itself as if ``action`` had been chosen."""
    box = QMessageBox(QMessageBox.Icon.Question, title, text, QMessageBox.StandardButton.NoButton, parent)
    go = box.addButton(action, QMessageBox.ButtonRole.DestructiveRole)
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(cancel)
    box.setEscapeButton(cancel)

    def settled(value: object) -> None:
        if not value and box.isVisible():
            go.click()

    if moot is not None:
        moot.connect(settled)
    try:
        box.exec()
        return box.clickedButton() is go
    finally:
        if moot is not None:
            moot.disconnect(settled)
        box.deleteLater()
