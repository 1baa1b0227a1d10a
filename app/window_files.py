"""The window's file actions: text files attached to a message, a conversation exported (named after
its title, starting in the last export's folder) or all of them, and exported JSON imported.
The store's work runs on its thread (``app.exporting``); this only asks and reports."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.exporting import export_to, file_name
from engine.service.transcript_cli import import_files

if TYPE_CHECKING:
    from app.main_window import MainWindow


class WindowFiles:
    def __init__(self, window: MainWindow) -> None:
        self.w = window

    def attach(self) -> None:
        """Put text files into the message being written, each as a fenced block under its name."""
        paths, _chosen = QFileDialog.getOpenFileNames(self.w, "Attach Text Files", str(Path.home()))
        if paths:
            self.w.composer.attach([Path(p) for p in paths])
            self.w.composer.setFocus()

    def export_current(self) -> None:
        if self.w.current is None:
            return
        name = file_name(self.w.title.text() if self.w.title.text() != "New conversation" else "") or "conversation"
        path, chosen = QFileDialog.getSaveFileName(
            self.w, "Export Conversation", str(self._export_dir() / f"{name}.md"),
            "Markdown (*.md);;JSON (*.json);;HTML (*.html)")
        if path:
            fmt = {"JSON (*.json)": "json", "HTML (*.html)": "html"}.get(chosen, Path(path).suffix.lstrip(".") or "md")
            self._export(self.w.current, fmt if fmt in ("md", "json", "html") else "md", Path(path))

    def export_all(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.w, "Export All Conversations (JSON)", str(self._export_dir()))
        if folder:
            self._export(None, "json", Path(folder))

    def import_conversations(self) -> None:
        """Add conversations from exported JSON files (Lanes' own format), all or none, and show the first."""
        names, _chosen = QFileDialog.getOpenFileNames(self.w, "Import Conversations", str(self._export_dir()),
                                                      "Lanes JSON (*.json)")
        if not names:
            return

        def imported(done: list) -> None:
            self.w.statusBar().showMessage(f"Imported {len(done)} conversation{'s' if len(done) != 1 else ''}", 8000)
            self.w.controller.conversationsChanged.emit()
            self.w.sidebar.select(done[0][1].id)
            self.w.open_conversation(done[0][1].id)

        self.w.controller.store_call(lambda store: import_files(store, [Path(n) for n in names]), imported,
                                     lambda exc: QMessageBox.warning(self.w, "Nothing was imported", str(exc)))

    def _export_dir(self) -> Path:
        """Where an export starts: the last export's folder, else Documents (else home)."""
        last = Path(self.w.prefs.export_dir) if self.w.prefs.export_dir else None
        if last is not None and last.is_dir():
            return last
        docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
        return Path(docs) if docs and Path(docs).is_dir() else Path.home()

    def _export(self, conversation_id: int | None, fmt: str, path: Path) -> None:
        def exported(n: int) -> None:
            self.w.statusBar().showMessage(f"Exported {n} conversation{'s' if n != 1 else ''} to {path}", 8000)
            self.w.prefs.export_dir = str(path if conversation_id is None else path.parent)
            self.w.save_prefs()

        self.w.controller.store_call(lambda store: export_to(store, conversation_id, fmt, path), exported,
                                     lambda exc: QMessageBox.warning(self.w, "Export failed", str(exc)))
