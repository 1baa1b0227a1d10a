"""A reply's text cut into runs by token origin, for showing which text was copied.

Consecutive tokens of one origin form a run; each run's text is decoded on its own. Byte-level
tokenizers give back the whole text when their runs are joined, except where a run boundary splits
a multi-byte character; then the runs do not add up to the text and one ``model`` run is returned,
so the colours are never wrong, only missing.

Example, with a tokenizer whose tokens are words::

    origin_spans(decode, [1, 2, 3, 4], ["model", "context", "context", "model"], "a b c d")
    -> [("a", "model"), (" b c", "context"), (" d", "model")]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def origin_spans(decode: Callable[[list[int]], str], tokens: Sequence[int], origins: Sequence[str],
                 text: str) -> list[tuple[str, str]]:
    """``text`` as (piece, origin) runs; one ("text", "model") run when they cannot be aligned."""
    if not tokens or len(tokens) != len(origins):
        return [(text, "model")] if text else []
    runs: list[tuple[str, str]] = []
    start = 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or origins[i] != origins[start]:
            runs.append((decode(list(tokens[start:i])), origins[start]))
            start = i
    joined = "".join(piece for piece, _ in runs)
    if joined == text:
        return runs
    if text.startswith(joined) or joined.startswith(text):  # a stop string cut the end, or more followed
        return _clip(runs, len(text)) + ([(text[len(joined):], "model")] if len(text) > len(joined) else [])
    return [(text, "model")] if text else []


def _clip(runs: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for piece, origin in runs:
        if n <= 0:
            break
        out.append((piece[:n], origin))
        n -= len(piece)
    return out
