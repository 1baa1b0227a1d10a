"""Deciding which drafted rows a stream keeps (pure; numpy only).

A stream's rows in a round are its last token followed by its k drafted tokens
``d[0..k-1]``. Row j's output is the model's distribution for the token after
row j, so draft ``d[j]`` is checked against row j.

Greedy: ``d[j]`` is **accepted** while it equals the model's choice at row j; the
first mismatch yields the model's own token there (the **bonus** when every draft
lands comes from row k). A round so advances a stream by accepted + 1 tokens.

    >>> verify_greedy(choices=[7, 8, 4, 5], drafts=[7, 8, 9])
    (2, 4)

Sampling: a copied token x is accepted with probability p(x) under the adjusted
distribution p of its row (temperature, then top-p). On rejection the token is drawn
from the residual, p with x removed and renormalised. Because a copy is a point
draft (q(x) = 1), this is exactly speculative sampling's rule, so every emitted
token is distributed as plain sampling from p.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def verify_greedy(choices: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
    """Return (accepted drafts, next token). ``choices`` has len(drafts) + 1 entries."""
    accepted = 0
    for drafted, chosen in zip(drafts, choices, strict=False):
        if drafted != chosen:
            break
        accepted += 1
    return accepted, int(choices[accepted])


def adjusted_probs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """Rows of ``logits`` [rows, vocab] -> probabilities after temperature and top-p."""
    z = logits.astype(np.float64) / max(temperature, 1e-6)
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        before = np.cumsum(sorted_p, axis=-1) - sorted_p
        keep_sorted = before < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def verify_sampled(probs: np.ndarray, drafts: Sequence[int], rng: np.random.Generator) -> tuple[int, int]:
    """Return (accepted drafts, next token) for rows ``probs`` [len(drafts) + 1, vocab]."""
    for j, x in enumerate(drafts):
        row = probs[j]
        if rng.random() < row[x]:
            continue
        residual = row.copy()
        residual[x] = 0.0
        total = residual.sum()
        if total <= 0.0:  # p(x) is 1 up to rounding: nothing else can be drawn
            continue
        return j, int(rng.choice(residual.size, p=residual / total))
    last = probs[len(drafts)]
    return len(drafts), int(rng.choice(last.size, p=last))
