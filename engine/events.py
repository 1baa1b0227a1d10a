"""What callers send the engine and what it sends back: small frozen dataclasses.

Vocabulary (used across ``engine/``):

- **stream**: one reply being generated. **round**: one batched forward pass that
  verifies every active stream's rows at once.
- **row**: one query position in a round. Each stream has one row for its own next
  token plus the **draft rows** the allocator grants it.
- **window**: a draft copied from earlier text. Its **source** is ``context`` (the
  stream's own prompt and output) or ``recall`` (text outside the stream).
- **tested** rows of a window: those verified up to and including its first
  rejection. **accepted**: those that matched the model's choice.
- **copy rate**: the chance a copied row lands; row j of a window is worth r**j.
- **origin** of an emitted token: ``model`` (the model's own choice) or the source
  of the window it was copied from.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Origin = Literal["model", "context", "recall"]
StopReason = Literal["eos", "stop", "length", "cancelled", "error"]
SOURCES: tuple[str, ...] = ("context", "recall")

_ids = itertools.count(1)


def new_request_id() -> str:
    return f"r{next(_ids)}"


@dataclass(frozen=True)
class Request:
    """One reply to generate.

    ``messages`` are chat turns (``{"role": ..., "content": ...}``) rendered with the
    model's chat template; ``prompt_tokens`` bypasses the template. ``own_copy_rates``
    None means the model family's default. ``copy_history`` is a snapshot from
    ``CopyRates.snapshot()`` (the store keeps one per conversation). ``conversation``
    names the conversation: its earlier turns' KV cache is reused, and Recall does not
    copy from the conversation itself. ``prefix_cache`` (a request naming no conversation, as the
    API server's): reuse and keep KV caches by the longest common token prefix with earlier such
    requests (``engine.model.turn_cache``). ``tools`` go to the chat template, as OpenAI's API sends them.
    """

    messages: tuple[Mapping[str, Any], ...] = ()
    prompt_tokens: tuple[int, ...] | None = None
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    drafts: bool = True
    recall: bool = True
    own_copy_rates: bool | None = None
    copy_history: Mapping[str, Mapping[str, float]] | None = None
    conversation: str | None = None
    recall_exclude: str | None = None  # a Recall document to skip without naming the conversation
    prefix_cache: bool = False
    tools: tuple[Mapping[str, Any], ...] = ()
    fit_context: bool = False  # a chat too long for the context leaves out its earliest turns, not fails
    continue_final: bool = False  # the last message is the assistant's, cut short: carry on writing it
    id: str = field(default_factory=new_request_id)


@dataclass(frozen=True)
class Tokens:
    """Tokens a stream accepted in one round, with the text they completed."""

    request_id: str
    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    text: str


@dataclass(frozen=True)
class RoundStats:
    """One shared round, as one stream saw it."""

    request_id: str
    round: int
    batch: int  # streams in the forward pass
    width: int  # rows per stream after padding
    draft_rows: int  # this stream's granted draft rows
    accepted: int  # of those, how many landed
    source: str | None  # source of the window verified, if any
    forward_s: float
    host_s: float
    rate_key: str | None = None  # history its first row was priced from: "context.first", "context.short", "resync"...
    prefill_rows: int = 0  # prompt tokens of a joining stream that rode in the same pass


@dataclass(frozen=True)
class SourceCounts:
    tested: int = 0
    accepted: int = 0
    granted: int = 0  # rows in the forward pass, rows past the first rejection included


@dataclass(frozen=True)
class ReplyStats:
    prompt_tokens: int
    generated: int
    seconds: float  # from submit to finish
    first_token_s: float | None
    prefill_reused: int  # prompt tokens whose KV came from an earlier turn
    rounds: int
    rows: Mapping[str, SourceCounts]  # by source
    left_out: int = 0  # earliest messages left out of the prompt to fit the context

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, as stored with a message and with a comparison run."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated": self.generated,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "first_token_s": self.first_token_s,
            "prefill_reused": self.prefill_reused,
            "rounds": self.rounds,
            "rows": {s: {"tested": c.tested, "accepted": c.accepted, "granted": c.granted}
                     for s, c in self.rows.items()},
            **({"left_out": self.left_out} if self.left_out else {}),
        }


@dataclass(frozen=True)
class Finished:
    request_id: str
    reason: StopReason
    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    text: str
    stats: ReplyStats
    copy_history: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class Failed:
    """The stream ended with an error; other streams are unaffected."""

    request_id: str
    message: str
    kind: str  # exception class name
    text: str = ""  # what was generated before the failure
    copy_history: Mapping[str, Mapping[str, float]] | None = None


@dataclass(frozen=True)
class Reading:
    """The request's prompt is being read (prefilled): ``done`` of its ``total`` tokens so far."""

    request_id: str
    done: int
    total: int


@dataclass(frozen=True)
class Waiting:
    """The request is queued, not refused: it starts once running replies leave room (``reason``)."""

    request_id: str
    reason: str


@dataclass(frozen=True)
class Notice:
    """Something the user should know about how a request runs, said once when it is submitted
    (e.g. a chat template that takes no system prompt: engine.model.chat_template)."""

    request_id: str
    message: str


Event = Tokens | RoundStats | Finished | Failed | Waiting | Notice | Reading


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model, as the engine describes it (``Engine.loaded`` resolves to one)."""

    name: str
    family: str
    device: str
    context_length: int
    warnings: tuple[str, ...]
    own_copy_rates: bool
    copy_rate: float
    doubt_prior: float  # prior of doubtful first rows (engine.drafts.copy_rates)
