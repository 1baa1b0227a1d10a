"""``JobThread``: one thread that runs submitted callables in order, each answered by a Future.

The store (``engine.store.worker``) and the model switch (``engine.service.chat_service``) each get one, so
the window's threads never wait on each other: a model loading for a minute does not freeze the
sidebar's searches, and vice versa.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.errors import LanesError

log = logging.getLogger(__name__)
T = TypeVar("T")


class JobThread:
    """Runs ``submit(fn)`` calls one after another on a thread named ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        if self._closing or not self._thread.is_alive():
            fut.set_exception(LanesError(f"{self.name} has been closed"))
        else:
            self._jobs.put((fn, fut))
        return fut

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self, timeout: float | None = 30.0) -> None:
        """Run what was submitted, then stop; waits up to ``timeout`` for the thread."""
        self._closing = True
        if self._thread.is_alive():
            self._jobs.put(None)
            if not self.on_thread():
                self._thread.join(timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, fut = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)
