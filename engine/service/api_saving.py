"""API requests saved as conversations, when the setting ``SETTING`` (read as each request
finishes) or ``lanes serve --save-conversations`` asks for it: off by default, since an agent's hundreds of requests would
bury a person's chats. Each finished chat request becomes one conversation: its system prompt, its
turns (a tool result is kept as a user turn marked ``[tool]``: the store holds three roles) and the reply
with its statistics."""

from __future__ import annotations

from collections.abc import Callable

from engine.events import Finished, Request
from engine.service.session import ReplySettings, stats_dict, title_from
from engine.store.store import Store

SETTING = "api_saves_conversations"


def saver(model: str) -> Callable[[Store, Request, Finished], None]:
    """``save(store, request, done)``: one finished chat request of ``model`` as a conversation."""

    def save(store: Store, request: Request, done: Finished) -> None:
        system = "\n\n".join(str(m.get("content") or "") for m in request.messages if m["role"] == "system")
        turns = [m for m in request.messages if m["role"] != "system"]
        first = next((str(m.get("content") or "") for m in turns if m["role"] == "user"), "API request")
        settings = ReplySettings(request.max_tokens, request.temperature, request.top_p, request.own_copy_rates)
        with store.durable():
            conv = store.create_conversation(title=title_from(first), model=model, system_prompt=system,
                                             settings=settings.as_dict())
            for m in turns:
                content = str(m.get("content") or "")
                if m["role"] == "tool":
                    store.add_message(conv.id, "user", f"[tool] {content}")
                else:
                    store.add_message(conv.id, m["role"], content)
            store.add_message(conv.id, "assistant", done.text, tokens=done.tokens, origins=done.origins,
                              tokens_model=model, stats=stats_dict(done.stats, done.reason, settings, None))

    return save
