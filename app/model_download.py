"""A model download from the Hub on a thread of its own, speaking in Qt signals (for Settings):
started by the person only, cancellable, joined before it is dropped."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.errors import LanesError
from engine.model.hub_download import DownloadCancelled, Progress, download


class ModelDownload(QObject):
    progress = Signal(int, int, str)  # bytes done, of total, the file arriving
    finished = Signal(str)  # the repo, now in the cache
    failed = Signal(str)  # why, naming the repo
    cancelled = Signal()

    def __init__(self, repo: str, endpoint: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.repo, self.endpoint = repo, endpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lanes-download", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        def report(p: Progress) -> None:
            self.progress.emit(p.done, p.total, p.file)

        try:
            download(self.repo, report, self._stop.is_set, self.endpoint)
        except DownloadCancelled:
            self.cancelled.emit()
        except LanesError as exc:
            self.failed.emit(str(exc))
        except Exception as exc:  # a network or disk error: said, not raised into Qt
            self.failed.emit(f"downloading '{self.repo}' failed: {exc}")
        else:
            self.finished.emit(self.repo)
