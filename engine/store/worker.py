"""``StoreWorker``: the window's store calls on a thread of their own, over the app's one Store.

The app opens one ``Store`` (one connection) for the whole process; the window's reads and edits run
here, one after another, so the GUI thread never waits on SQLite, while replies write through the
same Store from their own threads (its lock orders them).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from engine.job_thread import JobThread
from engine.store.store import Store

T = TypeVar("T")


class StoreWorker:
    """``submit(fn)`` runs ``fn(store)`` on the ``lanes-store`` thread and returns a Future."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._thread = JobThread("lanes-store")

    def submit(self, fn: Callable[[Store], T]) -> Future[T]:
        return self._thread.submit(lambda: fn(self.store))

    def close(self, timeout: float | None = 30.0) -> None:
        """Run what was submitted, then stop the thread (the Store stays open: its owner closes it)."""
        self._thread.close(timeout)
