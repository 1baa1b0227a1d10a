"""Deciding which drafted rows a stream keeps (pure).

A stream's rows in a round are its last token followed by its k drafted tokens
``d[0..k-1]``. Row j's output is the model's distribution for the token after
row j, so draft ``d[j]`` is checked against row j.

Greedy: ``d[j]`` is **accepted** while it equals the model's choice at row j; the
first mismatch yields the model's own token there (the **bonus** when every draft
lands comes from row k). A round so advances a stream by accepted + 1 tokens.

    >>> verify(choices=[7, 8, 4, 5], drafts=[7, 8, 9])
    (2, 4)

A sampling stream's rows are checked the same way, against the tokens drawn at their
positions (``engine.rounds.sampling``): a copy lands when it equals the draw, with probability
p(x), and on a mismatch the draw itself is emitted, distributed as p without x (speculative
sampling's residual), so every emitted token follows the model's distribution.
"""

from __future__ import annotations

from collections.abc import Sequence


def verify(choices: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
    """Return (accepted drafts, next token). ``choices`` has len(drafts) + 1 entries."""
    accepted = 0
    for drafted, chosen in zip(drafts, choices, strict=False):
        if drafted != chosen:
            break
        accepted += 1
    return accepted, int(choices[accepted])
