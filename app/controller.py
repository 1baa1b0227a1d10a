"""The window's one link to the engine and the store: ``ChatService`` calls turned into Qt signals.

Every database call runs on the service's store thread and every reply on its own thread; results
come back here as queued signals, so the GUI thread only ever waits for Qt. Streamed text is
collected per reply and announced at most ~30 times a second (``liveUpdated``), whatever the rate
of rounds, so views repaint at that pace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from engine.errors import ModelLoadError
from engine.events import ModelInfo, Notice, Reading, Tokens, Waiting
from engine.rounds.engine_thread import Engine
from engine.service.chat_service import ChatService, ReplyBegun, ReplySaved, ServiceEvent
from engine.service.session import ReplySettings, delete_without_engine
from engine.service.spans import origin_spans
from engine.store.records import Conversation, ConversationSummary, Message
from engine.store.store import Store

log = logging.getLogger(__name__)
REPAINT_MS = 33  # ~30 repaints a second at most, however fast tokens arrive


@dataclass
class LiveReply:
    """A reply being streamed, as the views show it."""

    conversation_id: int
    message_id: int | None = None
    text: str = ""
    spans: list[tuple[str, str]] = field(default_factory=list)
    user_message: Message | None = None
    reading: tuple[int, int] | None = None  # prompt tokens read, of how many (a long prompt, until it is read)


class ChatController(QObject):
    modelLoaded = Signal(object)  # ModelInfo
    modelFailed = Signal(str)
    modelRefused = Signal(str, object)  # why, the spec still loaded (the new one cannot work)
    modelFellBack = Signal(str)  # the saved model failed at launch; the embedded one loads instead
    conversationsChanged = Signal()
    replyStarted = Signal(int)  # conversation id: its user message and empty reply are saved
    replyWaiting = Signal(int, str)  # conversation id, why its reply has not started (engine memory limits)
    replyNotice = Signal(int, str)  # conversation id, what the user should know about how its reply runs
    replyReading = Signal(int, int, int)  # conversation id, prompt tokens read so far, of how many
    liveUpdated = Signal(object)  # set of conversation ids whose streamed text changed
    replyFinished = Signal(int, object)  # conversation id, the saved Message
    replyFailed = Signal(int, str)  # conversation id, why (the reply could not start or broke)
    generatingChanged = Signal(object)  # set of conversation ids generating now
    storeError = Signal(str)
    comparisonBegun = Signal(object)  # CompareSpec
    comparisonEvent = Signal(object, object)  # Run, engine Event (Tokens while a run streams)
    comparisonRunDone = Signal(object)  # Run
    comparisonSaved = Signal(object)  # Comparison
    comparisonFailed = Signal(str)
    serverStarted = Signal(str)  # the local API's URL
    serverStopped = Signal(str)  # why, in words ("" when the user stopped it)
    serverFailed = Signal(str)  # why it could not start (a port in use, the model not loaded)
    serverRequests = Signal(int)  # API requests running or queued now (from the server's thread)

    _serviceEvent = Signal(object)
    _compareEvent = Signal(object)
    _futureDone = Signal(object, object)

    def __init__(self, store: Store | Path, model: str | None = None,
                 engine_factory: Callable[[str | None], Engine] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.data_path = store.path if isinstance(store, Store) else Path(store)
        self.model_spec = model
        self.info: ModelInfo | None = None
        self.load_error: str | None = None  # why the model failed to load, until another is chosen
        self.fell_back: str | None = None  # why the launch model was replaced by the embedded one
        self.live: dict[int, LiveReply] = {}
        self._dirty: set[int] = set()
        self._tasks: dict[int, Any] = {}
        self._decode: Callable[[list[int]], str] | None = None
        self._compareEvent.connect(self._on_compare_event)
        self.comparison_task: Any = None
        self._model_generation = 0  # answers about a model replaced since are dropped
        self._serviceEvent.connect(self._on_service_event)
        self._futureDone.connect(self._on_future_done)
        self._timer = QTimer(self)
        self._timer.setInterval(REPAINT_MS)
        self._timer.timeout.connect(self._flush)  # runs only while a reply streams
        self.service = ChatService(store, model, engine_factory)
        self._watch_model()

    # -- futures back on the GUI thread ---------------------------------------------------------
    def when_done(self, fut: Future[Any], on_result: Callable[[Any], None],
                  on_error: Callable[[BaseException], None] | None = None) -> None:
        """Call ``on_result(value)`` (or ``on_error(exc)``) on the GUI thread when ``fut`` resolves."""
        fut.add_done_callback(lambda f: self._futureDone.emit(f, (on_result, on_error)))

    @Slot(object, object)
    def _on_future_done(self, fut: Future[Any], callbacks: tuple[Callable[..., None], Any]) -> None:
        on_result, on_error = callbacks
        exc = fut.exception()
        try:
            if exc is None:
                on_result(fut.result())
            elif on_error is not None:
                on_error(exc)
            else:
                self.storeError.emit(str(exc))
        except Exception as err:  # a slot must not raise into Qt: report it where people look
            log.exception("handling a finished store call failed")
            self.storeError.emit(f"{type(err).__name__}: {err}")

    def store_call(self, fn: Callable[[Store], Any], on_result: Callable[[Any], None] = lambda _r: None,
                   on_error: Callable[[BaseException], None] | None = None) -> None:
        self.when_done(self.service.store.submit(fn), on_result, on_error)

    # -- the model -------------------------------------------------------------------------------
    def _watch_model(self) -> None:
        engine, gen = self.service.engine, self._model_generation
        self.when_done(engine.loaded, lambda info: self._loaded(engine, gen, info),
                       lambda exc: self._load_failed(gen, exc))

    def _load_failed(self, gen: int, exc: BaseException) -> None:
        if gen != self._model_generation:
            return
        if gen == 0 and self.model_spec is not None:
            # The saved (or asked-for) model failed at launch: the embedded one instead, said plainly;
            # the setting itself is left as it was, for the user to see and change.
            self.fell_back = (f"Lanes could not load its saved model ({exc}). It is using the embedded model "
                              f"instead; Settings still names '{self.model_spec}' for you to change.")
            self.modelFellBack.emit(self.fell_back)
            self._load(None)
            return
        self.load_error = str(exc)
        self.modelFailed.emit(self.load_error)

    def _loaded(self, engine: Engine, gen: int, info: ModelInfo) -> None:
        if gen != self._model_generation:
            return  # a model replaced before it finished loading
        self.info = info
        self.modelLoaded.emit(info)

        def tokenizer_ready(tokenizer: Any) -> None:
            if gen == self._model_generation:
                self._decode = tokenizer.decode

        # Asked for on the store thread: the engine thread may be mid-round, and the GUI never waits.
        self.store_call(lambda _s: engine.run_sync(lambda sched: sched.tokenizer, timeout=60), tokenizer_ready)
        self._load_recall()

    def _load_recall(self) -> None:
        """(Re)load the engine's Recall from the store: at load, and each time the setting turns on
        (what was said while it was off was not fed). Documents replace, never double."""
        if self.info is not None:
            self.when_done(self.service.load_recall(), lambda _tokens: None)

    def switch_model(self, model: str | None) -> None:
        """Load another model; replies running now are stopped and saved first. The old engine is
        stopped and joined on the model thread, so the window and its store calls go on meanwhile.
        A model that cannot work is refused before anything stops (``modelRefused``)."""
        self._load(model, refusable=True)

    def _load(self, model: str | None, refusable: bool = False) -> None:
        before = (self.info, self.model_spec, self._decode)
        self.info = None
        self.load_error = None
        self._decode = None
        self.model_spec = model
        self._model_generation += 1
        gen = self._model_generation

        def refused(exc: BaseException) -> None:
            if gen != self._model_generation:
                return
            if refusable and isinstance(exc, ModelLoadError):  # nothing was stopped: the old model stays
                # the old engine's own answers (if it is still loading) count again
                self.info, self.model_spec, self._decode = before
                self._model_generation = gen - 1
                self.modelRefused.emit(str(exc), self.model_spec)
            else:
                self.modelFailed.emit(str(exc))

        serving = self.service.server is not None

        def switched(_engine: Engine) -> None:
            if serving:
                self.serverStopped.emit("the model changed: start the server again to serve the new one")
            self._watch_model()

        self.when_done(self.service.switch_model(model), switched, refused)

    # -- the local API server (engine.server) --------------------------------------------------------
    def start_server(self) -> None:
        self.when_done(self.service.start_server(self.serverRequests.emit, on_saved=self.conversationsChanged.emit),
                       self.serverStarted.emit,
                       lambda exc: self.serverFailed.emit(str(exc)))

    def stop_server(self, why: str = "") -> None:
        self.when_done(self.service.stop_server(), lambda _r: self.serverStopped.emit(why))

    def set_api_saves_conversations(self, on: bool) -> None:
        from engine.service.api_saving import SETTING

        self.store_call(lambda s: s.set_setting(SETTING, on))

    def api_saves_conversations(self, on_result: Callable[[bool], None]) -> None:
        from engine.service.api_saving import SETTING

        self.store_call(lambda s: bool(s.setting(SETTING, False)), on_result)

    # -- conversations ---------------------------------------------------------------------------
    def list_conversations(self, offset: int, limit: int, on_result: Callable[[list[ConversationSummary]], None]) -> None:
        self.store_call(lambda s: s.list_conversations(limit, offset), on_result)

    def search(self, text: str, on_result: Callable[[list[ConversationSummary]], None]) -> None:
        self.store_call(lambda s: s.search(text, 200), on_result)

    def load_conversation(self, conversation_id: int,
                          on_result: Callable[[tuple[Conversation, list[Message]]], None]) -> None:
        self.store_call(lambda s: (s.conversation(conversation_id), s.messages(conversation_id)), on_result)

    def new_conversation(self, system_prompt: str, settings: ReplySettings,
                         on_result: Callable[[Conversation], None]) -> None:
        model = self.info.name if self.info else (self.model_spec or "")

        def create(s: Store) -> Conversation:
            return s.create_conversation(model=model, system_prompt=system_prompt, settings=settings.as_dict())

        self.store_call(create, lambda conv: (self.conversationsChanged.emit(), on_result(conv)))

    def edit_message(self, message: Message, text: str, on_done: Callable[[], None]) -> None:
        """Change a message's text in place (the next replies read the new text). Its tokens and
        origins no longer say what the text is, so they go."""
        self.store_call(lambda s: s.update_message(message.id, content=text, tokens=None, origins=None,
                                                   tokens_model=None), lambda _r: on_done())

    def show_version(self, message: Message, number: int, on_done: Callable[[list[Message]], None]) -> None:
        """Show another version of a reply; ``on_done`` gets the conversation's messages as they are then."""
        def show(s: Store) -> list[Message]:
            s.show_version(message.id, number)
            return s.messages(message.conversation_id)

        self.store_call(show, on_done)

    def delete_message(self, message: Message, on_done: Callable[[], None]) -> None:
        self.store_call(lambda s: s.delete_message(message.id), lambda _r: (on_done(), self.conversationsChanged.emit()))

    def rename(self, conversation_id: int, title: str) -> None:
        self.store_call(lambda s: s.update_conversation(conversation_id, title=title),
                        lambda _c: self.conversationsChanged.emit())

    def delete(self, conversation_id: int, on_done: Callable[[], None] = lambda: None) -> None:
        """Delete a conversation; a reply running in it is stopped and ends first."""
        task = self._tasks.get(conversation_id)
        if task is not None:
            task.cancel()

            def ended(_result: object) -> None:
                if self._tasks.get(conversation_id) is task:
                    self._tasks.pop(conversation_id)
                self.delete(conversation_id, on_done)

            self.when_done(task.done, ended, ended)
            return

        def gone(_r: object) -> None:
            self.conversationsChanged.emit()
            on_done()

        if self.info is None:  # no engine to ask yet
            self.store_call(lambda s: delete_without_engine(s, conversation_id), gone)
        else:
            self.when_done(self.service.session_call(lambda cs: cs.delete_conversation(conversation_id)), gone,
                           lambda exc: self.storeError.emit(str(exc)))

    def set_recall_other_conversations(self, on: bool) -> None:
        from engine.store.store import RECALL_SETTING

        self.store_call(lambda s: s.set_setting(RECALL_SETTING, on), lambda _r: self._load_recall() if on else None)

    # -- replies ---------------------------------------------------------------------------------
    def generating(self) -> set[int]:
        return set(self._tasks)

    def send(self, conversation_id: int, text: str, settings: ReplySettings) -> None:
        self._start(conversation_id, text, settings, resend=False)

    def regenerate(self, conversation_id: int, settings: ReplySettings) -> None:
        """Answer the last user message again (the last reply is replaced)."""
        self._start(conversation_id, None, settings, resend=True)

    def edit_last(self, conversation_id: int, text: str, settings: ReplySettings) -> None:
        """Change the last user message and answer it again."""
        self._start(conversation_id, text, settings, resend=True)

    def continue_reply(self, conversation_id: int, settings: ReplySettings) -> None:
        """Carry on writing the last reply where it stopped (the length limit, Stop, or a quit)."""
        self._start(conversation_id, None, settings, resend=False, continue_last=True)

    def _start(self, conversation_id: int, text: str | None, settings: ReplySettings, resend: bool,
               continue_last: bool = False) -> None:
        if conversation_id in self._tasks:
            return  # one reply at a time per conversation
        self.live[conversation_id] = LiveReply(conversation_id)
        task = self.service.start_reply(conversation_id, text, settings, self._serviceEvent.emit, resend=resend,
                                        continue_last=continue_last)
        self._tasks[conversation_id] = task
        self.when_done(task.done, lambda _m: None, lambda exc: self._failed_to_run(conversation_id, exc))
        self.generatingChanged.emit(self.generating())

    def stop(self, conversation_id: int) -> None:
        task = self._tasks.get(conversation_id)
        if task is not None:
            task.cancel()

    def _failed_to_run(self, conversation_id: int, exc: BaseException) -> None:
        self._tasks.pop(conversation_id, None)
        self.live.pop(conversation_id, None)
        self.generatingChanged.emit(self.generating())
        self.replyFailed.emit(conversation_id, str(exc))
        self.conversationsChanged.emit()

    @Slot(object)
    def _on_service_event(self, ev: ServiceEvent) -> None:
        if isinstance(ev, ReplyBegun):
            live = self.live.setdefault(ev.conversation_id, LiveReply(ev.conversation_id))
            live.message_id, live.user_message = ev.message_id, ev.user_message
            if ev.text:  # a continued reply: it grows from its earlier text
                live.text, live.spans = ev.text, [(ev.text, "model")]
            self.replyStarted.emit(ev.conversation_id)
            self.conversationsChanged.emit()
        elif isinstance(ev, Tokens):
            live = self._live_for(ev.request_id)
            if live is not None and ev.text:
                live.text += ev.text
                for piece, origin in self._spans(ev):  # neighbours of one origin merge: fewer runs to paint
                    if live.spans and live.spans[-1][1] == origin:
                        live.spans[-1] = (live.spans[-1][0] + piece, origin)
                    else:
                        live.spans.append((piece, origin))
                self._dirty.add(live.conversation_id)
                if not self._timer.isActive():
                    self._timer.start()
        elif isinstance(ev, Waiting):
            live = self._live_for(ev.request_id)
            if live is not None:
                self.replyWaiting.emit(live.conversation_id, ev.reason)
        elif isinstance(ev, Notice):
            live = self._live_for(ev.request_id)
            if live is not None:
                self.replyNotice.emit(live.conversation_id, ev.message)
        elif isinstance(ev, Reading):
            live = self._live_for(ev.request_id)
            if live is not None:
                live.reading = (ev.done, ev.total)
                self.replyReading.emit(live.conversation_id, ev.done, ev.total)
        elif isinstance(ev, ReplySaved):  # a failure, too, ends in ReplySaved (status "error")
            self._tasks.pop(ev.conversation_id, None)
            self.live.pop(ev.conversation_id, None)
            self._dirty.discard(ev.conversation_id)
            self.generatingChanged.emit(self.generating())
            self.replyFinished.emit(ev.conversation_id, ev.message)
            self.conversationsChanged.emit()

    def _live_for(self, request_id: str) -> LiveReply | None:
        for cid, task in self._tasks.items():
            reply = task._reply
            if reply is not None and reply.handle.id == request_id:
                return self.live.get(cid)
        return None

    def _spans(self, ev: Tokens) -> list[tuple[str, str]]:
        if self._decode is None:
            return [(ev.text, "model")]
        return origin_spans(self._decode, ev.tokens, ev.origins, ev.text)

    def spans_for(self, message: Message) -> list[tuple[str, str]]:
        """A saved reply's text by origin (one model run when tokens are unknown)."""
        if self._decode is None or message.tokens is None or message.origins is None:
            return [(message.content, "model")] if message.content else []
        return origin_spans(self._decode, message.tokens, message.origins, message.content)

    def _flush(self) -> None:
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            self.liveUpdated.emit(dirty)
        else:
            self._timer.stop()  # nothing new for a tick: sleep until the next token

    # -- comparisons ------------------------------------------------------------------------------
    def start_comparison(self, *, prompt: str | None = None, conversation_id: int | None = None,
                         max_tokens: int = 256, repeats: int = 3, plain: bool = False) -> bool:
        """Start the own-copy-rates A/B; False when one is already running (one at a time, so runs
        never share rounds with each other)."""
        if self.comparison_task is not None:
            return False
        task = self.service.start_comparison(self._compareEvent.emit, prompt=prompt, conversation_id=conversation_id,
                                             max_tokens=max_tokens, repeats=repeats, plain=plain)
        self.comparison_task = task

        def failed(exc: BaseException) -> None:
            self.comparison_task = None
            self.comparisonFailed.emit(str(exc))

        self.when_done(task.done, lambda _c: None, failed)
        return True

    def stop_comparison(self) -> None:
        if self.comparison_task is not None:
            self.comparison_task.cancel()

    def list_comparisons(self, on_result: Callable[[list[Any]], None]) -> None:
        self.store_call(lambda s: s.comparisons(None, 200), on_result)

    @Slot(object)
    def _on_compare_event(self, ev: Any) -> None:
        from engine.service.chat_service import ComparisonBegun, ComparisonSaved, RunDone, RunEvent

        if isinstance(ev, ComparisonBegun):
            self.comparisonBegun.emit(ev.spec)
        elif isinstance(ev, RunEvent):
            self.comparisonEvent.emit(ev.run, ev.event)
        elif isinstance(ev, RunDone):
            self.comparisonRunDone.emit(ev.run)
        elif isinstance(ev, ComparisonSaved):
            self.comparison_task = None
            self.comparisonSaved.emit(ev.comparison)

    def decode(self, tokens: list[int]) -> str:
        """Token ids as text (empty until the model's tokenizer is known)."""
        return self._decode(tokens) if self._decode is not None else ""

    def close(self) -> None:
        """Stop and save every reply (as partial), join every thread."""
        self._timer.stop()
        self.service.close()
