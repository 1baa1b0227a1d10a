"""Messages to prompt tokens through the model's own chat template, with the fallbacks a chat needs.

- A template that rejects a system role (Gemma 2, Mistral's early ones raise "System role not
  supported", others "Conversation roles must alternate"): the system prompt goes at the start of
  the first user message, and the user is told.
- A model with no template at all (a base model): a plain one, ``System:`` / ``User:`` /
  ``Assistant:`` lines, and the user is told its answers may read oddly.

Worked example: ``[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]``
on a template that raises for the system role renders ``[{"role": "user", "content": "Be brief.\\n\\nHi"}]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.exceptions import TemplateError
from mlx_lm.tokenizer_utils import TokenizerWrapper

Message = dict[str, Any]

FOLDED = "this model's chat template takes no system prompt: it was put at the start of the first message"
PLAIN = "this model has no chat template, so Lanes wrote the conversation as plain text; answers may read oddly"


@dataclass(frozen=True)
class Rendered:
    tokens: list[int]
    notice: str | None  # what the user should know about how the conversation was written, if anything
    left_out: int = 0  # earliest messages left out to fit the context (``Request.fit_context``)


def fold_system(messages: Sequence[Message]) -> list[Message]:
    """The system messages' text put at the start of the first user message (or one made for it)."""
    system = "\n\n".join(str(m["content"]) for m in messages if m["role"] == "system" and m.get("content"))
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not system:
        return rest
    for m in rest:
        if m["role"] == "user":
            m["content"] = f"{system}\n\n{m['content']}"
            return rest
    return [{"role": "user", "content": system}, *rest]


def plain(messages: Sequence[Message], continue_final: bool = False) -> str:
    """A conversation as plain labelled lines, ending where the assistant speaks next (or, with
    ``continue_final``, inside its last message)."""
    names = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
    lines = [f"{names.get(m['role'], m['role'].title())}: {m['content']}" for m in messages]
    return "\n\n".join(lines if continue_final else [*lines, "Assistant:"])


def render(tokenizer: TokenizerWrapper, messages: Sequence[Message],
           tools: Sequence[Message] = (), continue_final: bool = False) -> Rendered:
    """Prompt tokens for ``messages`` (and the ``tools`` a template may describe to the model)
    ending where the assistant's reply starts, or with ``continue_final`` where its last message
    (the assistant's, cut short) ends, so the model carries on writing it."""
    if not tokenizer.has_chat_template:
        return Rendered(list(tokenizer.encode(plain(messages, continue_final))), PLAIN)
    extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
    extra.update({"continue_final_message": True, "add_generation_prompt": False} if continue_final
                 else {"add_generation_prompt": True})
    try:
        return Rendered(list(tokenizer.apply_chat_template(list(messages), **extra)), None)
    except TemplateError:
        if not any(m["role"] == "system" for m in messages):
            raise
    tokens = tokenizer.apply_chat_template(fold_system(messages), **extra)
    return Rendered(list(tokens), FOLDED)
