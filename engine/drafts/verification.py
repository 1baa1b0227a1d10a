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


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def adjusted_probs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """Rows of ``logits`` [rows, vocab] -> the probabilities mlx-lm's sampler draws from: top-p
    keeps the smallest prefix of the model's own distribution whose mass reaches ``top_p`` (the
    first token always stays), then the temperature applies to what is kept.

    The order matters: with probabilities (0.5, 0.3, 0.15, 0.05), top-p 0.85 keeps three tokens,
    and temperature 0.5 then gives (0.690, 0.248, 0.062, 0); sharpening first would have kept two.
    """
    z = logits.astype(np.float64)
    p = _softmax(z / max(temperature, 1e-6))
    if top_p < 1.0:
        own = _softmax(z)
        order = np.argsort(-own, axis=-1, kind="stable")
        sorted_own = np.take_along_axis(own, order, axis=-1)
        before = np.cumsum(sorted_own, axis=-1) - sorted_own
        keep = np.zeros(own.shape, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)
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
