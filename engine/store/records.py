"""Rows of the store as frozen dataclasses, and the packing of token ids and origins."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]
Status = Literal["complete", "partial", "cancelled", "error"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
STATUSES: tuple[str, ...] = ("complete", "partial", "cancelled", "error")

# One letter per token in messages.origins: m(odel), c(ontext), r(ecall).
_ORIGIN_LETTER = {"model": "m", "context": "c", "recall": "r"}
_LETTER_ORIGIN = {v: k for k, v in _ORIGIN_LETTER.items()}


def pack_tokens(tokens: Sequence[int] | None) -> bytes | None:
    """Token ids as int32 little-endian bytes (None stays None)."""
    if tokens is None:
        return None
    a = array("i", tokens)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def unpack_tokens(blob: bytes | None) -> tuple[int, ...] | None:
    if blob is None:
        return None
    a = array("i")
    a.frombytes(blob)
    if sys.byteorder == "big":
        a.byteswap()
    return tuple(a)


def pack_origins(origins: Sequence[str] | None) -> str | None:
    """``("model", "context")`` -> ``"mc"``."""
    return None if origins is None else "".join(_ORIGIN_LETTER[o] for o in origins)


def unpack_origins(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(_LETTER_ORIGIN[c] for c in text)


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    system_prompt: str
    settings: Mapping[str, Any]
    recallable: bool
    created_at: float
    updated_at: float

    @property
    def key(self) -> str:
        """The engine's name for this conversation (KV reuse, Recall document)."""
        return f"c{self.id}"


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    model: str
    updated_at: float
    messages: int
    snippet: str = ""  # for search results: the best matching text, hits in [brackets]


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: Role
    content: str
    status: Status = "complete"
    error: str | None = None
    stats: Mapping[str, Any] | None = None
    origins: tuple[str, ...] | None = None
    tokens: tuple[int, ...] | None = None
    tokens_model: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    version: int = 1  # which of its versions this row holds (regenerate, edit and resend make more)
    versions: int = 1  # how many there are


@dataclass(frozen=True)
class MessageVersion:
    """A reply's version that is not the one shown (``store.versions``), with the user message it answered."""

    message_id: int
    number: int
    prompt: str | None  # the user message before it as it was then (None: there was none)
    content: str
    status: Status
    error: str | None = None
    stats: Mapping[str, Any] | None = None
    origins: tuple[str, ...] | None = None
    tokens: tuple[int, ...] | None = None
    tokens_model: str | None = None
    created_at: float = 0.0


@dataclass(frozen=True)
class ComparisonRun:
    """One side of a comparison in one repeat (see engine/service/compare.py)."""

    side: str  # off / on / plain
    repeat: int
    position: int  # order within its repeat
    content: str
    status: Status
    error: str | None = None
    stats: Mapping[str, Any] | None = None
    origins: tuple[str, ...] | None = None
    tokens: tuple[int, ...] | None = None
    copy_history_after: Mapping[str, Any] | None = None
    rates: tuple[Mapping[str, Any], ...] | None = None  # per round with a window: source and rate


@dataclass(frozen=True)
class Comparison:
    id: int
    conversation_id: int | None
    messages: tuple[Mapping[str, str], ...]
    settings: Mapping[str, Any]
    model: str
    copy_history: Mapping[str, Any] | None
    status: Status
    created_at: float
    runs: tuple[ComparisonRun, ...] = field(default=())
