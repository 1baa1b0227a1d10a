"""Feed the engine's Recall index from the store: token ids kept in the database, so a start does not
re-tokenise every message (only those tokenised for another model, or never)."""

from __future__ import annotations

from collections.abc import Callable

from engine.store.records import unpack_tokens
from engine.store.store import Store

Encode = Callable[[str], list[int]]


def recall_documents(store: Store, model: str, encode: Encode | None = None,
                     conversation_id: int | None = None) -> dict[str, list[int]]:
    """Token ids of every message Recall may copy from, joined per conversation (its engine key).

    Messages whose ids belong to another model's tokenizer are re-encoded with ``encode`` and saved
    back, so the next start is fast; without ``encode`` they are skipped. Empty when the
    "recall other conversations" setting is off.
    """
    if not store.recall_other_conversations:
        return {}
    docs: dict[str, list[int]] = {}
    backfill: list[tuple[int, list[int], str]] = []
    for conv_id, message_id, content, blob, tokens_model in store.recall_rows(conversation_id):
        if blob is not None and tokens_model == model:
            tokens = list(unpack_tokens(blob) or ())
        elif encode is not None:
            tokens = encode(content)
            backfill.append((message_id, tokens, model))
        else:
            continue
        docs.setdefault(f"c{conv_id}", []).extend(tokens)
    if backfill:
        store.set_tokens(backfill)
    return docs
