"""One reply, from the store to the engine and back.

``ChatSession.begin`` saves the user's message and an empty assistant message marked ``partial``,
then submits a Request built from the stored conversation: its messages, system prompt, settings
and copy history (None for a new conversation: the model family's prior). ``Reply.consume`` takes
the engine's events: the growing text is saved at most ``SAVE_EVERY_S`` behind (so a killed process
loses at most that much), and the end (finished, cancelled or failed) saves the final text,
statistics, each token's origin and the stream's copy history, and feeds the reply to Recall.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.errors import LanesError
from engine.events import Event, Failed, Finished, ReplyStats, Request, Tokens
from engine.store.recall import recall_documents
from engine.store.records import Conversation, Message
from engine.store.store import Store

SAVE_EVERY_S = 0.5  # a growing reply is saved at least this often while tokens arrive
TITLE_CHARS = 60


class EngineLike(Protocol):
    """What a session needs from ``engine.rounds.engine_thread.Engine`` (tests may pass the real one only)."""

    def submit(self, request: Request) -> Any: ...
    def encode(self, text: str) -> list[int]: ...
    def add_recall(self, doc_id: str, tokens: list[int]) -> None: ...
    def add_recall_many(self, docs: Mapping[str, list[int]]) -> None: ...
    def remove_recall(self, doc_id: str) -> None: ...
    def forget_conversation(self, key: str) -> Any: ...


@dataclass(frozen=True)
class ReplySettings:
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    own_copy_rates: bool | None = None  # None: the model family's setting

    def as_dict(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "own_copy_rates": self.own_copy_rates}


def stats_dict(stats: ReplyStats, reason: str, settings: ReplySettings,
               copy_history_before: Mapping[str, Any] | None) -> dict[str, Any]:
    """A reply's statistics as stored with its message (JSON)."""
    return {
        "reason": reason,
        **stats.as_dict(),
        "settings": settings.as_dict(),
        "copy_history_before": copy_history_before,
    }


def delete_without_engine(store: Store, conversation_id: int) -> None:
    """Delete a conversation where no engine runs (``lanes delete``, the window before its model
    loads): the store's rows, then its KV files beside the database."""
    from engine.model import kv_files  # imports MLX: not for `lanes list` and the like

    key = store.conversation(conversation_id).key
    store.delete_conversation(conversation_id)
    kv_files.remove_conversation(kv_files.folder(store.path.parent), key)


def title_from(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def request_messages(conv: Conversation, messages: list[Message]) -> list[dict[str, str]]:
    """The chat turns a new reply sees: the system prompt, then every user turn and every reply
    that has text (partial and cancelled ones as they were shown; failed ones are left out)."""
    out = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    for m in messages:
        if m.role == "system" or m.status == "error" or (m.role == "assistant" and not m.content):
            continue
        out.append({"role": m.role, "content": m.content})
    return out


@dataclass
class Reply:
    """A reply being generated: consume the engine's events to keep the store current."""

    session: ChatSession
    conversation: Conversation
    user_message: Message
    message_id: int
    handle: Any
    settings: ReplySettings
    copy_history_before: Mapping[str, Any] | None
    clock: Callable[[], float] = time.monotonic
    text: str = ""
    done: Finished | Failed | None = None
    _saved_at: float = field(default=0.0)
    _dirty: bool = False
    interrupted: bool = False
    saved: bool = False  # its end (text, status, statistics, copy history) is in the store
    continues: Message | None = None  # the reply this one carries on (``ChatSession.continue_last``)

    def __post_init__(self) -> None:
        self._saved_at = self.clock()
        if self.continues is not None:
            self.text = self.continues.content

    def consume(self, event: Event) -> None:
        if isinstance(event, Tokens):
            self.text += event.text
            self._dirty = True
            if self.clock() - self._saved_at >= SAVE_EVERY_S:
                self.save_progress()
        elif isinstance(event, Finished):
            self.session._finish(self, event)
        elif isinstance(event, Failed):
            self.session._fail(self, event)

    def save_progress(self) -> None:
        if self._dirty:
            self.session.store.save_progress(self.message_id, self.text)
            self._dirty = False
        self._saved_at = self.clock()

    def cancel(self, partial: bool = False) -> None:
        """Stop the reply. ``partial``: it was interrupted (the app closing), not stopped by the user,
        so it is saved as ``partial`` rather than ``cancelled``."""
        self.interrupted = self.interrupted or partial
        self.handle.cancel()

    def events(self) -> Iterator[Event]:
        """The engine's events, each consumed first (a blocking iterator; use ``consume`` with async)."""
        for event in self.handle:
            self.consume(event)
            yield event


class ChatSession:
    """The store and the engine together, for one model (owned by one thread)."""

    def __init__(self, store: Store, engine: EngineLike, model: str) -> None:
        self.store = store
        self.engine = engine
        self.model = model

    def load_recall(self) -> int:
        """Feed Recall with every stored message it may copy from; returns the tokens fed."""
        docs = recall_documents(self.store, self.model, self.engine.encode)
        if docs:
            self.engine.add_recall_many(docs)
        return sum(len(t) for t in docs.values())

    def new_conversation(self, system_prompt: str = "", settings: ReplySettings | None = None) -> Conversation:
        return self.store.create_conversation(
            model=self.model, system_prompt=system_prompt, settings=(settings or ReplySettings()).as_dict()
        )

    def set_recallable(self, conversation_id: int, recallable: bool) -> None:
        """Opt a conversation in or out of being recalled from, in the store and the running engine."""
        conv = self.store.update_conversation(conversation_id, recallable=recallable)
        self.engine.remove_recall(conv.key)
        if recallable and self.store.recall_other_conversations:
            docs = recall_documents(self.store, self.model, self.engine.encode, conversation_id)
            if conv.key in docs:
                self.engine.add_recall(conv.key, docs[conv.key])

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation from the store and forget it in the running engine: its Recall and
        its KV cache, in memory and on disk."""
        conv = self.store.conversation(conversation_id)
        self.store.delete_conversation(conversation_id)
        self.engine.remove_recall(conv.key)
        self.engine.forget_conversation(conv.key)

    def begin(self, conversation_id: int, text: str, settings: ReplySettings | None = None) -> Reply:
        """Save the user's message and a partial reply, and submit the request."""
        if not text.strip():
            raise LanesError("the message is empty")
        conv = self.store.conversation(conversation_id)
        history = request_messages(conv, self.store.messages(conversation_id))
        tokens = self.engine.encode(text)
        user = self.store.add_message(conv.id, "user", text, tokens=tokens, tokens_model=self.model)
        if not conv.title:
            conv = self.store.update_conversation(conv.id, title=title_from(text))
        if conv.recallable and self.store.recall_other_conversations:
            self.engine.add_recall(conv.key, tokens)
        return self._submit(conv, user, history, settings or ReplySettings())

    def resend(self, conversation_id: int, text: str | None = None, settings: ReplySettings | None = None) -> Reply:
        """Answer the conversation's last user message again, as a new version of its reply: the reply
        is kept as an earlier version (with the message as it was; a failed one is written over), anything
        after it is deleted.

        With ``text`` the message is edited before it is resent ("edit and resend"); without, this is
        "regenerate the last reply".
        """
        conv = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            raise LanesError(f"conversation {conversation_id} has no message to answer")
        last = messages[users[-1]]
        if text is not None and not text.strip():
            raise LanesError("the message is empty")  # before anything is deleted
        tokens = self.engine.encode(text) if text is not None else None
        reply = next((m for m in messages[users[-1] + 1:] if m.role == "assistant"), None)
        with self.store.write():
            self.store.delete_messages_after(last.id if reply is None else reply.id)
            if reply is not None and reply.status == "error":  # Retry: a failure is no version worth keeping
                self.store.update_message(reply.id, content="", status="partial", error=None, stats=None,
                                          origins=None, tokens=None, tokens_model=None)
            elif reply is not None:
                self.store.new_version(reply.id)
            if text is not None:
                self.store.update_message(last.id, content=text, tokens=tokens, tokens_model=self.model)
        last = self.store.message(last.id)
        history = request_messages(conv, messages[: users[-1]])
        return self._submit(conv, last, history, settings or ReplySettings(),
                            into=None if reply is None else self.store.message(reply.id))

    def continue_last(self, conversation_id: int, settings: ReplySettings | None = None) -> Reply:
        """Carry on writing the conversation's last reply where it stopped (the length limit, Stop,
        or the app closing): its text so far goes to the model as the start of its answer, and what
        comes next is added to the same message."""
        conv = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        last = messages[-1] if messages else None
        users = [m for m in messages if m.role == "user"]
        if last is None or last.role != "assistant" or not last.content or last.status == "error" or not users:
            raise LanesError(f"conversation {conversation_id} has no reply to continue")
        self.store.update_message(last.id, status="partial")
        return self._submit(conv, users[-1], request_messages(conv, messages[:-1]), settings or ReplySettings(),
                            continues=last)

    def _submit(self, conv: Conversation, user: Message, history: list[dict[str, str]],
                settings: ReplySettings, continues: Message | None = None, into: Message | None = None) -> Reply:
        """Submit the reply to ``user``: a new message, ``into`` an emptied one (a new version), or
        more of ``continues``."""
        assistant = continues or into or self.store.add_message(conv.id, "assistant", "", status="partial")
        before = self.store.copy_history(conv.id)
        tail = ({"role": "assistant", "content": continues.content},) if continues is not None else ()
        request = Request(
            messages=(*history, {"role": "user", "content": user.content}, *tail), continue_final=bool(tail),
            max_tokens=settings.max_tokens, temperature=settings.temperature, top_p=settings.top_p,
            own_copy_rates=settings.own_copy_rates, copy_history=before, conversation=conv.key,
            recall=self.store.recall_other_conversations, fit_context=True,
        )
        handle = self.engine.submit(request)
        return Reply(self, conv, user, assistant.id, handle, settings, before, continues=continues)

    def ask(self, conversation_id: int, text: str, settings: ReplySettings | None = None,
            on_event: Callable[[Event], None] | None = None) -> Message:
        """``begin`` and run the reply to its end on this thread; returns the saved reply."""
        reply = self.begin(conversation_id, text, settings)
        try:
            for event in reply.events():
                if on_event is not None:
                    on_event(event)
        except BaseException:  # Ctrl-C or the caller's error: stop the stream and save what it had
            reply.cancel()
            if reply.done is None:
                for event in reply.events():
                    if on_event is not None:
                        on_event(event)
            raise
        return self.store.message(reply.message_id)

    # -- ends of a reply ---------------------------------------------------------
    def _finish(self, reply: Reply, done: Finished) -> None:
        reply.done = done
        before = reply.continues
        reply.text = (before.content if before else "") + done.text
        status = "complete"
        if done.reason == "cancelled":
            status = "partial" if reply.interrupted else "cancelled"
        stats = stats_dict(done.stats, done.reason, reply.settings, reply.copy_history_before)
        tokens, origins = done.tokens, done.origins
        if before is not None:  # the earlier part's tokens first, where they were kept for this model
            old_tokens, old_origins = before.tokens or (), before.origins or ()
            stats["continued_from"] = len(old_tokens)
            if old_tokens and before.tokens_model == self.model and len(old_origins) == len(old_tokens):
                tokens, origins = (*old_tokens, *tokens), (*old_origins, *origins)
        with self.store.durable():  # the reply and its copy history, together, synced before it shows
            self.store.update_message(
                reply.message_id, content=reply.text, status=status,
                tokens=tokens, origins=origins, tokens_model=self.model, stats=stats,
            )
            self.store.save_copy_history(reply.conversation.id, done.copy_history)
        reply.saved = True
        conv = reply.conversation
        if done.tokens and conv.recallable and self.store.recall_other_conversations:
            self.engine.add_recall(conv.key, list(done.tokens))

    def _fail(self, reply: Reply, failed: Failed) -> None:
        reply.done = failed
        text = (reply.continues.content if reply.continues else "") + failed.text
        with self.store.durable():
            self.store.update_message(reply.message_id, content=text, status="error", error=failed.message)
            if failed.copy_history is not None:
                self.store.save_copy_history(reply.conversation.id, failed.copy_history)
        reply.saved = True
