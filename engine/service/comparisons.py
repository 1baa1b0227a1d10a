"""Comparisons with the store: build the request from a prompt or a stored conversation, save the
runs (engine/service/compare.py runs them), and report a saved one (engine/store/ab_report.py) as
its table and its one JSON document. Used by ``lanes compare`` and the comparison pane."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.errors import LanesError
from engine.service.compare import CompareSpec
from engine.service.session import request_messages
from engine.store.ab_report import ABReport, Run
from engine.store.records import Comparison, ComparisonRun
from engine.store.store import Store


def build_spec(store: Store, *, prompt: str | None = None, conversation_id: int | None = None,
               max_tokens: int = 256, repeats: int = 3, plain: bool = False) -> CompareSpec:
    """The comparison's request.

    A prompt alone: a new single-turn request from the family prior. A conversation: its stored
    turns and copy history, then ``prompt`` as the next message, or without one, its last user
    message answered again (the turns before it as history).
    """
    sides = ("off", "on", "plain") if plain else ("off", "on")
    recall = store.recall_other_conversations
    if conversation_id is None:
        if not prompt or not prompt.strip():
            raise LanesError("give a prompt or a conversation to compare")
        return CompareSpec(({"role": "user", "content": prompt},), max_tokens, repeats, sides, recall=recall)
    conv = store.conversation(conversation_id)
    messages = store.messages(conversation_id)
    if prompt is None or not prompt.strip():
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            raise LanesError(f"conversation {conversation_id} has no message to answer; give --prompt")
        prompt, messages = messages[users[-1]].content, messages[: users[-1]]
    turns = (*request_messages(conv, messages), {"role": "user", "content": prompt})
    return CompareSpec(tuple(turns), max_tokens, repeats, sides, copy_history=store.copy_history(conversation_id),
                       recall=recall, exclude=conv.key)


def save(store: Store, spec: CompareSpec, runs: Sequence[Run], model: str, conversation_id: int | None,
         status: str = "complete") -> Comparison:
    return store.add_comparison(
        spec.messages,
        [ComparisonRun(r.side, r.repeat, r.position, r.text, r.status, r.error, r.stats, r.origins or None,
                       r.tokens or None, r.copy_history_after, tuple(r.rates) if r.side == "on" else None)
         for r in runs],
        conversation_id=conversation_id, settings=spec.settings(), model=model,
        copy_history=spec.copy_history, status=status,
    )


def runs_of(comparison: Comparison) -> list[Run]:
    """A saved comparison's runs as ab_report Runs (tokens None where they were not saved)."""
    return [Run(r.side, r.repeat, r.position, r.status, r.content, r.tokens, r.origins or (),
                dict(r.stats) if r.stats else None, r.error, r.copy_history_after, list(r.rates or ()))
            for r in comparison.runs]


def report_of(comparison: Comparison) -> ABReport:
    """A saved comparison's report, with the sides and rounds its settings planned."""
    return ABReport.planned(runs_of(comparison), comparison.settings)


def comparison_document(comparison: Comparison, device: str | None = None) -> dict[str, Any]:
    """The one JSON shape of a saved comparison, written by ``lanes compare --json`` and the pane's
    export: what ran (``device``: where, None when not known), then the report's runs and summaries."""
    c = comparison
    return report_of(c).document(
        comparison=c.id, model=c.model, device=device, status=c.status, created_at=c.created_at,
        conversation_id=c.conversation_id, settings=dict(c.settings), messages=[dict(m) for m in c.messages],
        copy_history=c.copy_history)
