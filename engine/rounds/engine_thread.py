"""The engine: one thread owns MLX; callers submit requests and read typed events.

    engine = Engine()                 # starts the thread; the model loads on it
    handle = engine.submit(Request(messages=({"role": "user", "content": "Hi"},)))
    for event in handle:              # or: async for event in handle
        ...

Every call from another thread becomes a command on a queue; the thread runs
scheduler rounds while streams are active and blocks on the queue when idle.
Each request's events go to its own handle, ending with ``Finished`` or ``Failed``.

With ``kv_dir`` a conversation's KV cache also lives on disk (``engine.model.kv_files``): written
once the engine has been idle for ``SAVE_WHEN_IDLE_S`` (never mid-round) and as it closes, read
when a conversation's turn finds nothing in memory, deleted by ``forget_conversation``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import mlx.core as mx

from engine.errors import LanesError
from engine.events import Event, Failed, Finished, ModelInfo, Request
from engine.model import kv_files
from engine.model.loading import LoadedModel, load_model
from engine.model.machine import use_mlx_defaults
from engine.rounds.scheduler import Scheduler

log = logging.getLogger(__name__)

# Idle this long after the last stream ends before writing KV files: a command arriving meanwhile
# (the chat's next turn, already typed) runs first.
SAVE_WHEN_IDLE_S = 0.5


class Handle:
    """The events of one request; iterate synchronously or asynchronously."""

    def __init__(self, request: Request, engine: Engine, loop: asyncio.AbstractEventLoop | None) -> None:
        self.request = request
        self.id = request.id
        self._engine = engine
        self._queue: queue.Queue[Event] = queue.Queue()
        self._loop = loop
        self._aqueue: asyncio.Queue[Event] | None = asyncio.Queue() if loop is not None else None
        self.result: Finished | Failed | None = None

    def _put(self, event: Event) -> None:
        if isinstance(event, Finished | Failed):
            self.result = event
        if self._loop is not None and self._aqueue is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed; nobody is listening any more
                self._loop.call_soon_threadsafe(self._aqueue.put_nowait, event)
        else:
            self._queue.put(event)

    def cancel(self) -> None:
        self._engine.cancel(self.id)

    def __iter__(self) -> Iterator[Event]:
        if self._aqueue is not None:
            raise LanesError("this handle was submitted from an event loop: use `async for`")
        while True:
            event = self._queue.get()
            yield event
            if isinstance(event, Finished | Failed):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        if self._aqueue is None:
            raise LanesError("this handle was submitted outside an event loop: use `for`")
        while True:
            event = await self._aqueue.get()
            yield event
            if isinstance(event, Finished | Failed):
                return

    def wait(self) -> Finished | Failed:
        for _ in self:
            pass
        assert self.result is not None
        return self.result


class Engine:
    def __init__(
        self,
        model: str | None = None,
        *,
        calibrate: bool = True,
        loader: Callable[[str | None], LoadedModel] = load_model,
        memory_limit: int | None = None,
        kv_dir: Path | None = None,
        kv_budget: int = kv_files.DISK_BUDGET,
    ) -> None:
        self._memory_limit = memory_limit  # bytes for weights and KV in all; None: a share of the machine's
        self._kv_dir = kv_dir  # conversations' KV files (the data dir's kv/); None: kept in memory only
        self._kv_budget = kv_budget
        self._forget_lock = threading.Lock()
        self._forgets: list[tuple[str, Future[None]]] = []
        self._ended = False  # past the thread's last look at _forgets
        self._commands: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._handles: dict[str, Handle] = {}
        self._scheduler: Scheduler | None = None
        self._calibrate = calibrate
        self._loader = loader
        self.loaded: Future[ModelInfo] = Future()
        self._thread = threading.Thread(target=self._run, args=(model,), name="lanes-engine", daemon=True)
        self._thread.start()

    # -- caller side (any thread) -------------------------------------------
    def info(self, timeout: float | None = None) -> ModelInfo:
        """Wait for the model to load; raises its ModelLoadError if it failed."""
        return self.loaded.result(timeout)

    def submit(self, request: Request) -> Handle:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        handle = Handle(request, self, loop)
        self._handles[request.id] = handle
        self._call(lambda: self._submit(handle))
        return handle

    def cancel(self, request_id: str) -> None:
        self._call(lambda: self._cancel(request_id))

    def add_recall(self, doc_id: str, tokens: Sequence[int]) -> None:
        """Feed text outside any stream to Recall (another conversation's message)."""
        toks = list(tokens)
        self._call(lambda: self._sched().recall.add(doc_id, toks))

    def add_recall_many(self, docs: Mapping[str, Sequence[int]]) -> None:
        """Load many documents in one engine command (the store's Recall load): each replaces what
        Recall held under its id, so loading again never doubles a conversation."""
        items = [(d, list(t)) for d, t in docs.items()]

        def add_all() -> None:
            recall = self._sched().recall
            for doc_id, tokens in items:
                recall.remove(doc_id)
                recall.add(doc_id, tokens)

        self._call(add_all)

    def remove_recall(self, doc_id: str) -> None:
        self._call(lambda: self._sched().recall.remove(doc_id))

    def forget_conversation(self, key: str) -> Future[None]:
        """Drop a deleted conversation's KV cache, in memory and on disk (every model's file). Resolves
        once done, on the engine thread (the one that writes files), or here once it has ended."""
        done: Future[None] = Future()
        with self._forget_lock:
            if not self._ended:
                self._forgets.append((key, done))
                self._commands.put(self._run_forgets)  # no alive check: _shutdown runs what it missed
                return done
        self._forget(key, done)
        return done

    def encode(self, text: str) -> list[int]:
        """Tokenize on the calling thread (tokenizers hold no MLX state)."""
        self.info()
        assert self._scheduler is not None
        return list(self._scheduler.tokenizer.encode(text, add_special_tokens=False))

    def run_sync(self, fn: Callable[[Scheduler], Any], timeout: float | None = None) -> Any:
        """Run ``fn(scheduler)`` on the engine thread and return its result."""
        fut: Future[Any] = Future()

        def job() -> None:
            try:
                fut.set_result(fn(self._sched()))
            except BaseException as exc:
                fut.set_exception(exc)

        self._call(job)
        return fut.result(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Cancel every stream, stop the thread and join it (``timeout`` None: however long a load takes)."""
        if self._thread.is_alive():
            self._commands.put(None)
            self._thread.join(timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- engine thread -------------------------------------------------------
    def _call(self, command: Callable[[], None]) -> None:
        if not self._thread.is_alive():
            raise LanesError("the engine has stopped")
        self._commands.put(command)

    def _sched(self) -> Scheduler:
        if self._scheduler is None:
            raise LanesError("the model is not loaded")
        return self._scheduler

    def _emit(self, event: Event) -> None:
        handle = self._handles.get(event.request_id)
        if handle is None:
            return
        if isinstance(event, Finished | Failed):
            del self._handles[event.request_id]
        handle._put(event)

    def _submit(self, handle: Handle) -> None:
        try:
            self._sched().submit(handle.request)
        except Exception as exc:
            self._emit(Failed(handle.id, str(exc), type(exc).__name__))

    def _cancel(self, request_id: str) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel(request_id)

    def _run(self, model: str | None) -> None:
        use_mlx_defaults()  # MLX makes this thread's caches at its first pass: a library user's thread too
        try:
            self._load(model)
            self._loop()
        finally:
            self._shutdown()

    def _load(self, model: str | None) -> None:
        try:
            loaded = self._loader(model)
            _wire_weights()
            self._scheduler = Scheduler(loaded, self._emit, memory_limit=self._memory_limit)
            if self._kv_dir is not None:
                model = kv_files.model_id(loaded.name, loaded.path, loaded.device)
                self._scheduler.conversations.disk = kv_files.KvFiles(self._kv_dir, model, loaded.kinds,
                                                                      self._kv_budget)
            if self._calibrate:
                self._scheduler.calibrate()
            fam = loaded.family
            self.loaded.set_result(
                ModelInfo(loaded.name, fam.name, loaded.device, loaded.context_length, loaded.warnings,
                          fam.own_copy_rates, fam.copy_rate, fam.doubt_prior)
            )
        except BaseException as exc:
            self.loaded.set_exception(exc)

    def _loop(self) -> None:
        while True:
            sched = self._scheduler
            busy = sched is not None and sched.busy
            saving = sched is not None and not busy and sched.conversations.unsaved
            commands = self._pending(block=not busy, timeout=SAVE_WHEN_IDLE_S if saving else None)
            for command in commands:
                if command is None:
                    return
                try:
                    command()
                except Exception:
                    log.exception("engine command failed")
            if sched is not None and sched.busy:
                self._step()
            elif saving and not commands and sched is not None:  # idle for SAVE_WHEN_IDLE_S: one file
                self._save(sched.conversations.save_next)

    def _run_forgets(self) -> None:
        with self._forget_lock:
            todo, self._forgets = self._forgets, []
        for key, done in todo:
            self._forget(key, done)

    def _forget(self, key: str, done: Future[None]) -> None:
        try:
            if self._scheduler is not None:
                self._scheduler.conversations.forget(key)
            if self._kv_dir is not None:
                kv_files.remove_conversation(self._kv_dir, key)
            done.set_result(None)
        except BaseException as exc:
            done.set_exception(exc)

    def _save(self, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception:
            log.exception("saving KV files failed")

    def _pending(self, block: bool, timeout: float | None = None) -> list[Callable[[], None] | None]:
        """Every queued command; waits for the first one (up to ``timeout``) when there is nothing to run."""
        commands: list[Callable[[], None] | None] = []
        if block:
            with contextlib.suppress(queue.Empty):
                commands.append(self._commands.get(timeout=timeout))
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _step(self) -> None:
        sched = self._scheduler
        assert sched is not None
        try:
            sched.step()
        except Exception as exc:  # a fault outside any one stream: fail them all, stay up
            log.exception("round failed")
            for s in [*sched.active, *(j.stream for j in sched.joining)]:
                self._emit(Failed(s.id, str(exc), type(exc).__name__, s.text))
            sched.reset()

    def _shutdown(self) -> None:
        sched = self._scheduler
        if sched is not None:
            for s in list(sched.active):
                s.cancelled = True
            for j in sched.joining:
                j.stream.cancelled = True
            try:
                sched.step()  # emits Finished(cancelled) for each
            except Exception:
                log.exception("shutdown")
            self._run_forgets()  # before the last writes: a deleted conversation is not saved
            self._save(sched.conversations.save_all)  # cancelled replies' turns too
            self._scheduler = None
        with self._forget_lock:
            self._ended = True
        self._run_forgets()
        for handle in list(self._handles.values()):
            handle._put(Failed(handle.id, "the engine stopped", "EngineStopped"))
        self._handles.clear()
        # MLX asks each thread to destroy its own streams before it ends; streams left for
        # interpreter exit abort the process ("terminate called without an active exception").
        del sched
        gc.collect()
        mx.synchronize()
        mx.clear_cache()
        mx.clear_streams()


def _wire_weights() -> None:
    """On Macs, let Metal keep up to its recommended working set resident, as mlx-lm's generate does
    (``wired_limit``): without it the weights may be paged out between rounds."""
    if mx.metal.is_available():
        mx.set_wired_limit(int(mx.metal.device_info()["max_recommended_working_set_size"]))
