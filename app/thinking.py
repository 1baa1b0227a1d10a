"""A reasoning model's thinking, apart from its answer: ``<think>…</think>`` (Qwen3, DeepSeek-R1,
SmolLM3 and others; ``<thinking>`` too). The window shows it collapsed above the answer. Earlier
turns go to the model as they were written: their chat templates leave the thinking out themselves
where they are made to.

Worked example: "<think>Add 2 and 2.</think>It is 4." splits into ("Add 2 and 2.", "It is 4.",
False); while "<think>Add 2" streams, into ("Add 2", "", True): still thinking.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_OPEN = re.compile(r"^\s*<(think|thinking)>", re.IGNORECASE)


class Split(NamedTuple):
    thinking: str | None  # None: the text has no thinking
    answer: str
    still_thinking: bool  # the thinking has not been closed yet (streaming, or cut short)


def split_thinking(text: str) -> Split:
    m = _OPEN.match(text)
    if m is None:
        return Split(None, text, False)
    close = f"</{m.group(1)}>"
    end = text.lower().find(close.lower(), m.end())
    if end < 0:
        return Split(text[m.end():].strip(), "", True)
    return Split(text[m.end():end].strip(), text[end + len(close):].lstrip(), False)
