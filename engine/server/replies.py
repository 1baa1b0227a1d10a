"""An engine reply as OpenAI's API returns it: whole, or as server-sent chunks.

``TextStream`` turns the engine's ``Tokens`` events into content deltas, holding back the end of
the text that may yet become a stop string or a tool call's opening, so that what a client
reads streamed always equals the whole reply's content (``engine.server.tool_calls.held_back``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.events import Finished
from engine.server.tool_calls import ToolFormat, held_back, split


@dataclass
class Call:
    """One API request: what its answers are labelled with and how its text is cut."""

    kind: Literal["chat", "text"]
    model: str
    include_usage: bool = False
    stops: tuple[str, ...] = ()
    fmt: ToolFormat | None = None  # set when the request sent tools and the model has a format
    tools: Sequence[Any] | None = None
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if self.kind == "text":
            self.id = "cmpl-" + self.id.split("-", 1)[1]

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def parts(self, done: Finished) -> tuple[str, list[dict[str, Any]]]:
        """The reply's content and its tool calls."""
        return split(done.text, self.fmt, self.tools) if self.fmt is not None else (done.text, [])


def usage(done: Finished) -> dict[str, Any]:
    s = done.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
            "total_tokens": s.prompt_tokens + s.generated,
            "prompt_tokens_details": {"cached_tokens": s.prefill_reused}}


def copy_stats(done: Finished) -> dict[str, Any]:
    """The ``lanes`` field of an answer (ordinary clients ignore it): tokens by origin, draft rows
    tested and accepted by source, rounds and speed."""
    by_origin = {o: done.origins.count(o) for o in ("model", "context", "recall")}
    return {"tokens_by_origin": by_origin,
            "rows": {s: {"tested": c.tested, "accepted": c.accepted} for s, c in done.stats.rows.items()},
            "rounds": done.stats.rounds, "seconds": round(done.stats.seconds, 4),
            "tokens_per_s": round(done.stats.tokens_per_s, 2)}


def finish_reason(done: Finished, calls: list[dict[str, Any]]) -> str:
    if calls:
        return "tool_calls"
    return "length" if done.reason == "length" else "stop"


def whole(call: Call, done: Finished) -> dict[str, Any]:
    """A non-streamed answer."""
    content, calls = call.parts(done)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(done, calls), "logprobs": None}
    if call.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        choice["message"] = message
    else:
        choice["text"] = content
    return {"id": call.id, "object": call.object, "created": call.created, "model": call.model,
            "choices": [choice], "usage": usage(done), "lanes": copy_stats(done)}


def chunk(call: Call, delta: dict[str, Any] | None = None, reason: str | None = None,
          done: Finished | None = None) -> str:
    """One server-sent event: a delta of the reply, or (``done`` without a delta) the usage chunk."""
    body: dict[str, Any] = {"id": call.id, "object": call.object + ".chunk" if call.kind == "chat" else call.object,
                            "created": call.created, "model": call.model}
    if delta is None and done is not None:
        body["choices"] = []
        body["usage"] = usage(done)
        body["lanes"] = copy_stats(done)
    elif call.kind == "chat":
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": reason, "logprobs": None}]
    else:
        body["choices"] = [{"index": 0, "text": (delta or {}).get("content", ""), "finish_reason": reason,
                            "logprobs": None}]
    return sse(body)


def sse(body: dict[str, Any] | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)}\n\n"


class TextStream:
    """Content deltas from the text so far (see the module docstring)."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.text = ""  # everything the engine produced so far
        self.sent = ""  # what the client has been sent
        markers = list(call.stops)
        if call.fmt is not None:
            markers.append(call.fmt.start)
        self.markers = markers

    def add(self, text: str) -> str:
        """The delta to send after the engine adds ``text`` (maybe empty)."""
        self.text += text
        safe = self.text
        if self.call.fmt is not None and (i := safe.find(self.call.fmt.start)) >= 0:
            safe = safe[:i]  # from a tool call on, nothing is content until the call is parsed at the end
        else:
            safe = safe[: len(safe) - held_back(safe, self.markers)]
        return self._advance(safe)

    def finish(self, done: Finished) -> tuple[str, list[dict[str, Any]]]:
        """The rest of the content and the tool calls, once the reply is whole."""
        content, calls = self.call.parts(done)
        return self._advance(content), calls

    def _advance(self, content: str) -> str:
        if len(content) <= len(self.sent) or not content.startswith(self.sent):
            return ""
        delta, self.sent = content[len(self.sent):], content
        return delta
