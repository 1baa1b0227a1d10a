"""The store and the engine for a window: nothing here runs on the caller's thread.

- One ``Store`` (one connection) for the whole app: the window's calls, every reply and every
  comparison go through it (``Store`` orders them with its lock). Other processes are ordinary
  concurrent users of the file (docs/store.md).
- ``StoreWorker``: the window's reads and edits, in order, on the ``lanes-store`` thread.
- ``ChatService.switch_model``: on the ``lanes-model`` thread; the new model is checked before the
  old one is unloaded, so a bad setting is refused while the working model keeps running.
- ``ChatService.start_reply``: one thread per reply, running ``ChatSession`` to the end and passing
  every event to ``on_event`` on that thread (the window re-posts them to its own thread).
- ``ChatService.start_server`` / ``stop_server``: the local API (``engine.server``) over the window's
  own engine, so API requests and the window's chats share rounds; started and stopped on the
  ``lanes-model`` thread, stopped before a model switch.
- ``ChatService.close``: stops every reply (each is saved as partial, with its copy history),
  joins every thread, and stops the engine.

No Qt here: the window wraps these Futures and callbacks in signals.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from engine.errors import LanesError
from engine.events import Event, Finished, ModelInfo, Request
from engine.job_thread import JobThread
from engine.model import kv_files
from engine.model.locate import locate_model
from engine.rounds.engine_thread import Engine
from engine.server.app import ServerOptions
from engine.server.server import DEFAULT_PORT, ApiServer
from engine.service import api_saving, comparisons
from engine.service.compare import CompareSpec, run_comparison
from engine.service.session import ChatSession, Reply, ReplySettings
from engine.store.ab_report import Run
from engine.store.records import Comparison, Message
from engine.store.store import Store
from engine.store.worker import StoreWorker

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(eq=False)  # identity: tasks live in a set
class ReplyTask:
    """A reply running on its own thread. ``done`` resolves to the saved message (or the error)."""

    conversation_id: int
    thread: threading.Thread | None = None
    done: Future[Message] = field(default_factory=Future)
    _reply: Reply | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)
    _partial: bool = False

    def cancel(self, partial: bool = False) -> None:
        """Stop the reply: saved ``cancelled``, or ``partial`` when interrupted (the app closing)."""
        self._partial = self._partial or partial
        self._cancel.set()
        if self._reply is not None:
            self._reply.cancel(self._partial)


@dataclass(frozen=True)
class ReplyBegun:
    """The user's message and the empty reply are saved; ``Tokens`` follow for ``message_id``."""

    conversation_id: int
    user_message: Message
    message_id: int
    text: str = ""  # the reply's text so far: a continued reply's earlier part


@dataclass(frozen=True)
class ReplySaved:
    """The reply ended and is saved (complete, cancelled or error): its final form."""

    conversation_id: int
    message: Message


ServiceEvent = ReplyBegun | ReplySaved | Event


@dataclass(frozen=True)
class ComparisonBegun:
    spec: CompareSpec


@dataclass(frozen=True)
class RunEvent:
    """An engine event of one run of a comparison (Tokens as they stream; Finished/Failed at its end)."""

    run: Run
    event: Event


@dataclass(frozen=True)
class RunDone:
    run: Run


@dataclass(frozen=True)
class ComparisonSaved:
    comparison: Comparison


CompareEvent = ComparisonBegun | RunEvent | RunDone | ComparisonSaved


@dataclass(eq=False)
class ComparisonTask:
    """A comparison running on its own thread; ``done`` resolves to the saved Comparison."""

    thread: threading.Thread | None = None
    done: Future[Comparison] = field(default_factory=Future)
    _cancel: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self._cancel.set()


class ChatService:
    """One model and one data folder, for a window. Use from one thread (the GUI's).

    ``store`` is the app's open Store (closed by whoever opened it) or a path to open one (closed
    with the service). ``engine_factory`` None: the real engine, keeping conversations' KV caches in
    the database's folder (``kv/``), so a long chat reopened after a restart is not read again."""

    def __init__(self, store: Store | Path, model: str | None = None,
                 engine_factory: Callable[[str | None], Engine] | None = None) -> None:
        self._owns_db = not isinstance(store, Store)
        self.db = Store(Path(store)) if not isinstance(store, Store) else store
        self.path = self.db.path
        self.store = StoreWorker(self.db)
        self._models = JobThread("lanes-model")
        self._engine_factory = engine_factory or partial(Engine, kv_dir=kv_files.folder(self.path.parent))
        self.engine = self._engine_factory(model)
        self.tasks: set[ReplyTask] = set()
        self.comparisons: set[ComparisonTask] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.server: ApiServer | None = None

    def start_server(self, on_change: Callable[[int], None], port: int = DEFAULT_PORT,
                     on_saved: Callable[[], None] | None = None) -> Future[str]:
        """Serve this engine on loopback once its model is ready; resolves to the API's URL (a port in
        use fails it with a LanesError naming the port). ``on_change(running)`` comes from the
        server's thread. A finished request is saved as a conversation when the store's setting says
        so at that moment, then ``on_saved()`` is called (from the server's worker thread)."""

        def start() -> str:
            if self.server is not None:
                return self.server.url
            engine = self.engine
            save = self._api_saver(engine.info().name, on_saved)
            server = ApiServer(engine, port=port, options=ServerOptions(save=save), on_change=on_change)
            server.start()
            self.server = server
            return server.url

        return self._models.submit(start)

    def _api_saver(self, model: str, on_saved: Callable[[], None] | None) -> Callable[[Request, Finished], None]:
        save = api_saving.saver(model)

        def in_store(store: Store, request: Request, done: Finished) -> bool:
            if not store.setting(api_saving.SETTING, False):
                return False
            save(store, request, done)
            return True

        def run(request: Request, done: Finished) -> None:
            if self.store.submit(lambda store: in_store(store, request, done)).result() and on_saved is not None:
                on_saved()

        return run

    def stop_server(self) -> Future[None]:
        return self._models.submit(self._stop_server)

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def switch_model(self, model: str | None) -> Future[Engine]:
        """Check ``model``, then stop every reply and load it, on the ``lanes-model`` thread; the
        Future resolves to the new engine (whose own ``loaded`` says when it is ready).

        A spec that cannot work (``locate_model`` raises ModelLoadError) fails the Future before anything
        is stopped: the working model keeps running. The old engine's thread is joined without a
        time limit (a model mid-load cannot be interrupted): two threads never own MLX at once."""
        return self._models.submit(lambda: self._switch(model))

    def _switch(self, model: str | None) -> Engine:
        locate_model(model)
        self._stop_server()
        self.cancel_all()
        self.join_replies()
        self.engine.close(timeout=None)
        with self._lock:
            if self._closed:
                raise LanesError("closed while switching models")
            self.engine = self._engine_factory(model)
            return self.engine

    def load_recall(self) -> Future[int]:
        """Feed Recall from the store (after the model loaded): on the store thread."""
        engine = self.engine  # one engine for the name and the calls, even if a switch comes between
        info = engine.info()
        return self.store.submit(lambda store: ChatSession(store, engine, info.name).load_recall())

    def session_call(self, fn: Callable[[ChatSession], T]) -> Future[T]:
        """Run ``fn`` with a ChatSession on the store thread (set_recallable, delete_conversation, ...)."""
        engine = self.engine

        def job(store: Store) -> T:
            return fn(ChatSession(store, engine, engine.info().name))

        return self.store.submit(job)

    def start_reply(self, conversation_id: int, text: str | None, settings: ReplySettings,
                    on_event: Callable[[ServiceEvent], None], resend: bool = False,
                    continue_last: bool = False) -> ReplyTask:
        """Send ``text`` (or with ``resend``, answer the last user message again, edited to ``text`` if
        given; with ``continue_last``, carry on writing the last reply) on a new thread; every event
        goes to ``on_event`` on that thread."""
        task = ReplyTask(conversation_id)
        how = "continue" if continue_last else "resend" if resend else "send"
        task.thread = threading.Thread(target=self._run_reply, args=(task, text, settings, on_event, how),
                                       name=f"lanes-reply-{conversation_id}", daemon=True)
        with self._lock:
            self.tasks.add(task)
        task.thread.start()
        return task

    def _run_reply(self, task: ReplyTask, text: str | None, settings: ReplySettings,
                   on_event: Callable[[ServiceEvent], None], how: str) -> None:
        try:
            info = self._wait_for_model(task._cancel)
            session = ChatSession(self.db, self.engine, info.name)
            if how == "continue":
                reply = session.continue_last(task.conversation_id, settings)
            elif how == "resend":
                reply = session.resend(task.conversation_id, text, settings)
            else:
                assert text is not None
                reply = session.begin(task.conversation_id, text, settings)
            task._reply = reply
            if task._cancel.is_set():
                reply.cancel(task._partial)
            on_event(ReplyBegun(task.conversation_id, reply.user_message, reply.message_id, reply.text))
            for event in reply.events():
                on_event(event)
            saved = self.db.message(reply.message_id)
            on_event(ReplySaved(task.conversation_id, saved))
            task.done.set_result(saved)
        except BaseException as exc:
            log.exception("reply in conversation %s failed", task.conversation_id)
            self._abandon(task, exc)
            task.done.set_exception(exc)
        finally:
            with self._lock:
                self.tasks.discard(task)

    def _abandon(self, task: ReplyTask, exc: BaseException) -> None:
        """A reply that broke outside the engine (the store, a callback): stop its stream and keep
        what it had, marked as an error, rather than a silent partial row."""
        reply = task._reply
        if reply is None or reply.saved:
            return
        if reply.done is None:
            reply.handle.cancel()
        try:
            self.db.update_message(reply.message_id, content=reply.text, status="error", error=str(exc))
        except Exception:
            log.exception("could not save the broken reply %s", reply.message_id)

    def start_comparison(self, on_event: Callable[[CompareEvent], None], *, prompt: str | None = None,
                         conversation_id: int | None = None, max_tokens: int = 256, repeats: int = 3,
                         plain: bool = False) -> ComparisonTask:
        """Run the own-copy-rates A/B (engine/service/compare.py) on a new thread and save it; events go to
        ``on_event`` on that thread. Stopping saves what ran, marked cancelled."""
        task = ComparisonTask()
        args = (task, on_event, prompt, conversation_id, max_tokens, repeats, plain)
        task.thread = threading.Thread(target=self._run_comparison, args=args, name="lanes-compare", daemon=True)
        with self._lock:
            self.comparisons.add(task)
        task.thread.start()
        return task

    def _run_comparison(self, task: ComparisonTask, on_event: Callable[[CompareEvent], None], prompt: str | None,
                        conversation_id: int | None, max_tokens: int, repeats: int, plain: bool) -> None:
        try:
            spec = self.db.run(lambda store: comparisons.build_spec(
                store, prompt=prompt, conversation_id=conversation_id, max_tokens=max_tokens, repeats=repeats,
                plain=plain))
            on_event(ComparisonBegun(spec))
            info = self._wait_for_model(task._cancel)
            runs = run_comparison(self.engine.submit, spec, info.copy_rate,
                                  on_event=lambda run, ev: on_event(RunEvent(run, ev)),
                                  on_run=lambda run: on_event(RunDone(run)), cancelled=task._cancel.is_set,
                                  doubt_prior=info.doubt_prior)
            if task._cancel.is_set():
                status = "cancelled"
            elif all(r.status == "complete" for r in runs):
                status = "complete"
            else:
                status = "error"
            saved = comparisons.save(self.db, spec, runs, info.name, conversation_id, status)
            on_event(ComparisonSaved(saved))
            task.done.set_result(saved)
        except BaseException as exc:
            log.exception("comparison failed")
            task.done.set_exception(exc)
        finally:
            with self._lock:
                self.comparisons.discard(task)

    def _wait_for_model(self, cancelled: threading.Event) -> ModelInfo:
        """The loaded model's info; gives up when the reply or comparison is cancelled first."""
        while True:
            try:
                return self.engine.info(timeout=0.1)
            except TimeoutError:
                if cancelled.is_set():
                    raise LanesError("cancelled before the model loaded") from None

    def generating(self) -> set[int]:
        """Conversations with a reply running now."""
        with self._lock:
            return {t.conversation_id for t in self.tasks}

    def cancel_all(self, partial: bool = False) -> None:
        with self._lock:
            tasks, comparing = list(self.tasks), list(self.comparisons)
        for t in tasks:
            t.cancel(partial)
        for c in comparing:
            c.cancel()

    def join_replies(self, timeout: float = 60.0) -> None:
        with self._lock:
            threads = [t.thread for t in [*self.tasks, *self.comparisons] if t.thread is not None]
        for th in threads:
            th.join(timeout)

    def close(self) -> None:
        """Stop every reply (saved as partial), join every thread, stop the store and the engine.

        The model thread goes first: a switch running on it then finishes (or sees the service
        closed and starts nothing) before the engine it left behind is closed."""
        with self._lock:
            self._closed = True
        self.cancel_all(partial=True)
        self._models.submit(self._stop_server)
        self._models.close(timeout=None)
        self.join_replies()
        self.store.close()
        self.engine.close()
        if self._owns_db:
            self.db.close()
