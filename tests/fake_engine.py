"""A scripted stand-in for ``engine.rounds.engine_thread.Engine`` for fast widget tests (the end-to-end window test
uses the real engine and model).

Replies echo the last user message: ``"Echo: " + text``, one token per character (the id is the
character's code point, so ``decode`` is exact), three tokens an event every ``delay`` seconds; the
echoed part is marked as copied from context, and each event is followed by its round's statistics. A message containing ``FAIL`` fails after the first
event; ``WAIT`` makes it say it waits first (memory limits); ``SLOW`` makes the reply 200 times longer (for tests that stop or close mid-reply).
``DIFFER`` with ``request.own_copy_rates`` True changes the reply's 10th character (token 9), so the
own-copy-rates comparison sees the "on" side's tokens differ from the "off" side's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from engine.drafts.copy_rates import DOUBT_PRIOR
from engine.errors import ModelLoadError
from engine.events import (
    Event,
    Failed,
    Finished,
    ModelInfo,
    Notice,
    Reading,
    ReplyStats,
    Request,
    RoundStats,
    SourceCounts,
    Tokens,
    Waiting,
)
from engine.model.chat_template import FOLDED

INFO = ModelInfo("Fake-Echo", "fake", "cpu", 4096, (), True, 0.94, DOUBT_PRIOR)


class FakeTokenizer:
    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t) for t in tokens)


class FakeHandle:
    def __init__(self, request: Request) -> None:
        self.request = request
        self.id = request.id
        self.events: queue.Queue[Event] = queue.Queue()
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self.events.get()
            yield ev
            if isinstance(ev, Finished | Failed):
                return


class FakeEngine:
    def __init__(self, model: str | None = None, delay: float = 0.01, fail_load: str | None = None) -> None:
        self.model = model
        self.delay = delay
        self.loaded: Future[ModelInfo] = Future()
        if fail_load:
            self.loaded.set_exception(ModelLoadError(fail_load))
        else:
            self.loaded.set_result(INFO)
        self.recall: dict[str, list[int]] = {}
        self.forgotten: list[str] = []  # conversations deleted: their KV caches forgotten
        self.requests: list[Request] = []
        self._threads: list[threading.Thread] = []
        self._handles: list[FakeHandle] = []
        self.closed = False

    def info(self, timeout: float | None = None) -> ModelInfo:
        return self.loaded.result(timeout)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def add_recall(self, doc_id: str, tokens: Sequence[int]) -> None:
        self.recall.setdefault(doc_id, []).extend(tokens)

    def add_recall_many(self, docs: Mapping[str, Sequence[int]]) -> None:
        for d, t in docs.items():
            self.recall[d] = list(t)

    def remove_recall(self, doc_id: str) -> None:
        self.recall.pop(doc_id, None)

    def forget_conversation(self, key: str) -> Future[None]:
        self.forgotten.append(key)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def run_sync(self, fn: Callable[[Any], Any], timeout: float | None = None) -> Any:
        class Sched:
            tokenizer = FakeTokenizer()

        return fn(Sched())

    def submit(self, request: Request) -> FakeHandle:
        self.requests.append(request)
        handle = FakeHandle(request)
        self._handles.append(handle)
        t = threading.Thread(target=self._generate, args=(handle,), name="fake-engine", daemon=True)
        self._threads.append(t)
        t.start()
        return handle

    def _generate(self, h: FakeHandle) -> None:
        text = str(h.request.messages[-1]["content"])
        reply = "Echo: " + (text * 200 if "SLOW" in text else text)
        if "DIFFER" in text and h.request.own_copy_rates is True:  # "DIFFER" makes the reply 12+ long
            reply = reply[:9] + ("#" if reply[9] != "#" else "%") + reply[10:]
        origins_all = ["model"] * 6 + ["context"] * (len(reply) - 6)
        if "WAIT" in text:  # as the engine says of a request its memory limits hold back
            h.events.put(Waiting(h.id, "2 replies are running, the most Fake-Echo runs at once"))
        if "NOTE" in text:  # as the engine says of a model whose chat template takes no system prompt
            h.events.put(Notice(h.id, FOLDED))
        if "READ" in text:  # a long prompt, read a chunk at a time before the reply starts
            for done in (128, 256, 384):
                h.events.put(Reading(h.id, done, 512))
                time.sleep(self.delay * 20)
        start, done = time.perf_counter(), 0
        history = {"context": {"accepted": 3.0, "tested": 4.0}}
        while done < len(reply):
            if h.cancelled.is_set() or self.closed:
                return self._finish(h, reply[:done], origins_all[:done], "cancelled", start, history)
            time.sleep(self.delay)
            chunk = reply[done : done + 3]
            origins = tuple(origins_all[done : done + 3])
            h.events.put(Tokens(h.id, tuple(ord(c) for c in chunk), origins, chunk))
            copied = origins.count("context")  # a round whose copied rows all landed
            h.events.put(RoundStats(h.id, done // 3 + 1, 1, 1 + copied, copied, copied,
                                    "context" if copied else None, 0.0, 0.0))
            done += len(chunk)
            if "FAIL" in text:
                h.events.put(Failed(h.id, "the fake engine was told to fail", "RuntimeError", reply[:done], history))
                return None
        return self._finish(h, reply, origins_all, "eos", start, history)

    def _finish(self, h: FakeHandle, text: str, origins: list[str], reason: str, start: float,
                history: dict[str, dict[str, float]]) -> None:
        n = len(text)
        copied = origins.count("context")
        stats = ReplyStats(len(h.request.messages), n, max(time.perf_counter() - start, 1e-6), 0.01, 0, n // 3 + 1,
                           {"context": SourceCounts(copied, copied, copied), "recall": SourceCounts()})
        h.events.put(Finished(h.id, reason, tuple(ord(c) for c in text), tuple(origins), text, stats,  # type: ignore[arg-type]
                              history))

    def close(self, timeout: float | None = 30.0) -> None:
        self.closed = True
        for t in self._threads:
            t.join(timeout)

    def __enter__(self) -> FakeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
