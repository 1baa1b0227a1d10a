"""Edit a message before it is sent again: a text box that Ctrl+Enter (Cmd+Enter on a Mac) confirms,
as the composer's Enter sends, and Esc cancels."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget


class _Editor(QPlainTextEdit):
    def __init__(self, dialog: QDialog) -> None:
        super().__init__()
        self._dialog = dialog

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self._dialog.accept()
            return
        super().keyPressEvent(event)


class EditDialog(QDialog):
    def __init__(self, text: str, parent: QWidget | None = None, title: str = "Edit Last Message",
                 action: str = "Send Again", what: str = "sends it again and replaces the reply after it") -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.editor = _Editor(self)
        self.editor.setPlainText(text)
        self.editor.setAccessibleName("Message")
        self.editor.moveCursor(self.editor.textCursor().MoveOperation.End)
        send = QKeySequence("Ctrl+Return").toString(QKeySequence.SequenceFormat.NativeText)
        hint = QLabel(f"{send} {what}; Esc cancels.")
        hint.setStyleSheet("color: palette(placeholder-text);")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText(action)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.editor, 1)
        layout.addWidget(hint)
        layout.addWidget(buttons)
        self.resize(560, 300)

    def text(self) -> str:
        return self.editor.toPlainText()
