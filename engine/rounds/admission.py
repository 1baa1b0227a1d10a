"""Admission: a request's prompt rendered and checked before any compute, and the room it needs.

A stream reserves the KV memory of its whole reply (prompt plus ``max_tokens`` positions) when it
joins, so a reply that started never runs out half way (``engine.model.memory_limits``); since the
lanes keep every stream's row as long as the longest, the streams together reserve their count
times the longest reply. A request that does not fit now waits; one that never could is refused,
naming the model and the limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.errors import LanesError, MemoryLimitError, PromptTooLongError
from engine.events import Request
from engine.model.chat_template import Rendered, render
from engine.model.context_fit import fit_turns
from engine.model.lane_buffers import capacity_for
from engine.model.loading import LoadedModel
from engine.model.memory_limits import MemoryLimits, mib


@dataclass(frozen=True)
class Admitted:
    request: Request  # with max_tokens cut to the room the context leaves
    rendered: Rendered


class Admission:
    def __init__(self, loaded: LoadedModel, limits: MemoryLimits) -> None:
        self.loaded = loaded
        self.limits = limits

    def render(self, request: Request) -> Rendered:
        """The request's prompt tokens (its own, or its messages through the chat template), checked
        against the context limit."""
        limit = self.loaded.context_length
        if request.prompt_tokens is not None:
            rendered = Rendered(list(request.prompt_tokens), None)
        else:
            rendered = render(self.loaded.tokenizer, request.messages, request.tools, request.continue_final)
            room = min(request.max_tokens, limit // 4)  # a chat's reply keeps room to be written
            if request.fit_context and len(rendered.tokens) + room > limit:
                rendered = self._fit(request, limit - room)
        tokens = rendered.tokens
        if len(tokens) < 2:
            raise LanesError("a prompt needs at least two tokens: give at least one message")
        if len(tokens) >= limit:
            raise PromptTooLongError(
                f"prompt of {len(tokens)} tokens exceeds {self.loaded.name}'s context limit of {limit} tokens"
            )
        return rendered

    def _fit(self, request: Request, budget: int) -> Rendered:
        """The chat with its earliest turns left out to fit ``budget`` tokens (engine.model.context_fit)."""
        tok = self.loaded.tokenizer
        def count(ms: list) -> int:
            return len(render(tok, ms, request.tools, request.continue_final).tokens)

        kept, left = fit_turns(request.messages, count, budget)
        rendered = render(tok, kept, request.tools, request.continue_final)
        why = (f"the {left} earliest messages were left out: the conversation is longer than "
               f"{self.loaded.name}'s context of {self.loaded.context_length:,} tokens")
        return Rendered(rendered.tokens, "; ".join(filter(None, (rendered.notice, why))), left)

    def check(self, request: Request) -> Admitted:
        """Validate ``request`` (raising before any compute) and price the room it reserves."""
        if request.max_tokens < 1:
            raise LanesError(f"max_tokens must be at least 1 (got {request.max_tokens})")
        if not 0.0 <= request.top_p <= 1.0 or request.temperature < 0:
            raise LanesError("temperature must be >= 0 and top_p within 0..1")
        rendered = self.render(request)
        prompt = rendered.tokens
        room = self.loaded.context_length - len(prompt)
        if request.max_tokens > room:
            request = replace(request, max_tokens=room)
        need = self.reserve(len(prompt), request.max_tokens)
        if need > self.limits.kv_bytes:
            raise MemoryLimitError(
                f"a reply of {len(prompt)} prompt and {request.max_tokens} new tokens needs {mib(need)} of KV "
                f"memory; {self.loaded.name} may use {mib(self.limits.kv_bytes)} for replies on this machine "
                f"({self.limits.kv_tokens:,} tokens): ask for fewer tokens or shorten the conversation"
            )
        return Admitted(request, rendered)

    def reserve(self, prompt: int, max_tokens: int) -> int:
        """KV bytes a stream alone holds at most: every position its reply may reach, as the lanes
        allocate them (``capacity_for``)."""
        return capacity_for(prompt + max_tokens) * self.limits.kv_bytes_per_token

    def no_room(self, reach: int, running: Sequence[int]) -> str | None:
        """Why a stream whose reply may reach ``reach`` positions (prompt plus max tokens) cannot join
        now beside the ``running`` streams' reaches, or None if it can. The lanes keep every stream's
        row as long as the longest one's (engine.model.lane_cache), so together they hold the count
        of streams times the longest reach: streams reaching 300, 300 and 2,000 positions hold
        3 x 2,048, not 2,600."""
        if len(running) >= self.limits.max_streams:
            return f"{len(running)} replies are running, the most {self.loaded.name} runs at once"
        reaches = [*running, reach]
        held = len(reaches) * capacity_for(max(reaches)) * self.limits.kv_bytes_per_token
        if held > self.limits.kv_bytes:
            return (f"{len(reaches)} replies as long as the longest ({max(reaches):,} tokens) would hold "
                    f"{mib(held)} of the {mib(self.limits.kv_bytes)} of KV memory {self.loaded.name} may use here")
        return None
