"""Tool calls in a reply's text, cut out and parsed with the parser mlx-lm picks for the model's
tokenizer (``TokenizerWrapper.tool_parser``, one of ``mlx_lm.tool_parsers``), as mlx-lm's server does.

Worked example, with Qwen's markers ``<tool_call>`` / ``</tool_call>`` and the ``json_tools`` parser:
``'Let me look.<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>'`` splits into the
content ``'Let me look.'`` and one call ``{"id": "call_…", "type": "function", "function": {"name":
"ls", "arguments": '{"path": "."}'}}``. A call the parser cannot read stays in the content.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolFormat:
    start: str
    end: str
    parser: Callable[[str, Any], Any]

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat | None:
        """The model's format, or None when its tokenizer says of none."""
        if not getattr(tokenizer, "has_tool_calling", False) or tokenizer.tool_parser is None:
            return None
        return cls(tokenizer.tool_call_start, tokenizer.tool_call_end or "", tokenizer.tool_parser)


def split(text: str, fmt: ToolFormat, tools: Sequence[Any] | None) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool calls in OpenAI's shape) of a whole reply."""
    content, calls, rest = [], [], text
    while (i := rest.find(fmt.start)) >= 0:
        content.append(rest[:i])
        body_at = i + len(fmt.start)
        j = rest.find(fmt.end, body_at) if fmt.end else -1
        body, after = (rest[body_at:j], rest[j + len(fmt.end):]) if j >= 0 else (rest[body_at:], "")
        parsed = _parse(fmt, body, tools)
        if parsed is None:
            content.append(rest[i:len(rest) - len(after)])
        else:
            calls += parsed
        rest = after
    content.append(rest)
    return "".join(content), calls


def _parse(fmt: ToolFormat, body: str, tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    try:
        parsed = fmt.parser(body, tools)
    except (ValueError, KeyError, TypeError):  # json.JSONDecodeError is a ValueError
        return None
    out = []
    for call in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(call, dict) or "name" not in call:
            return None
        args = call.get("arguments", {})
        out.append({"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": call["name"],
                                 "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    return out


def held_back(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` to hold back from a stream because they may be the
    start of one of ``markers`` (a stop string, a tool call's opening): ``held_back("ab<to",
    ["<tool_call>"]) == 3``."""
    keep = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), keep, -1):
            if text.endswith(m[:n]):
                keep = n
                break
    return keep
