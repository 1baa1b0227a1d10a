"""Request bodies of the API, validated into what the engine takes (``engine.events.Request``).

Types are checked strictly (``"max_tokens": "5"`` is a 400, as OpenAI answers it); fields the
engine has no use for (``frequency_penalty``, ``user``, ...) are accepted and ignored, as local
servers do, so that clients written for OpenAI keep working. Worked example: ``{"model": "m",
"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens":
8}`` becomes ``Request(messages=({"role": "user", "content": "Hi"},), max_tokens=8)``.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.server.api_errors import ApiError

DEFAULT_MAX_TOKENS = 1024


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextPart(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class Sampling(_Body):
    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1)

    def limit(self) -> int:
        """The reply's max tokens."""
        return self.max_tokens or DEFAULT_MAX_TOKENS

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "stop takes at most 4 sequences", param="stop")
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatBody(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None

    def limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    def engine_messages(self) -> tuple[dict[str, Any], ...]:
        """The turns as the chat template takes them (mlx-lm's server converts them the same way)."""
        out = []
        for m in self.messages:
            if isinstance(m.content, list):
                if any(p.type != "text" for p in m.content):
                    raise ApiError(400, "only text content is supported", param="messages")
                content = "".join(p.text or "" for p in m.content)
            else:
                content = m.content or ""
            msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            if m.tool_calls:
                msg["tool_calls"] = [_with_parsed_arguments(c) for c in m.tool_calls]
            out.append(msg)
        return tuple(out)


class CompletionBody(Sampling):
    prompt: str | list[str]
    echo: bool = False

    def text(self) -> str:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise ApiError(400, "prompt takes one string here (a list of several is a batch, not supported)",
                               param="prompt")
            return self.prompt[0]
        return self.prompt


T = TypeVar("T", bound="_Body")


def _with_parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call of an assistant turn with its JSON ``arguments`` as a dict, as templates expect."""
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            function["arguments"] = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"a tool call's arguments are not JSON: {exc}", param="messages") from exc
    return {**call, "function": function}


def parse(kind: type[T], raw: bytes) -> T:
    """The body as ``kind``, or a 400 naming the first thing wrong with it."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}", param=where) from exc
