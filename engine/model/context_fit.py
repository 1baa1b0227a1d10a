"""A chat that outgrew the model's context: its earliest turns left out, the system prompt kept.

Pure: the caller counts a list of messages' prompt tokens (through the chat template). The kept
turns are the newest ones that fit ``budget`` tokens, starting at a user turn (templates expect one
after the system prompt), and never fewer than the last message. Found by bisection: a template
renders a few times, not once per turn.

Worked example: system S, then u1 a1 u2 a2 u3 with 100 tokens each and a budget of 350: keeping
S u2 a2 u3 costs 400, S u3 costs 200 (a2 alone cannot lead), so u1 a1 u2 a2 are left out: 4.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]


def fit_turns(messages: Sequence[Message], count: Callable[[list[Message]], int],
              budget: int) -> tuple[list[Message], int]:
    """The messages to send and how many of the earliest were left out (0: all fit)."""
    system = [m for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]

    def kept(drop: int) -> list[Message]:
        rest = turns[drop:]
        while len(rest) > 1 and rest[0]["role"] != "user":  # a kept part starts at a user turn
            rest = rest[1:]
        return [*system, *rest]

    if count(list(messages)) <= budget or len(turns) <= 1:
        return list(messages), 0
    lo, hi = 1, len(turns) - 1  # hi (the last message alone) is kept however long it is
    while lo < hi:
        mid = (lo + hi) // 2
        if count(kept(mid)) <= budget:
            hi = mid
        else:
            lo = mid + 1
    out = kept(lo)
    return out, len(messages) - len(out)
