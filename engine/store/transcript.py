"""Conversations out of and into the store as lossless JSON (``render.py`` makes Markdown and HTML).

JSON is the exchange format (``lanes export --format json`` / ``lanes import``): importing a document
gives back the same conversation, everything but database ids. Version 2 added each reply's earlier
versions (``version``, ``versions``); version 1 documents are read as replies with one version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.errors import LanesError
from engine.store.ab_report import SIDES
from engine.store.records import (
    ROLES,
    STATUSES,
    ComparisonRun,
    Conversation,
    Message,
    MessageVersion,
    pack_origins,
    unpack_origins,
)
from engine.store.store import Store

FORMAT = "lanes-conversation"
VERSION = 2
_ORIGIN_LETTERS = "mcr"  # records.pack_origins: m(odel), c(ontext), r(ecall)
_INT32 = (-(2**31), 2**31 - 1)
_REQUIRED: Any = object()


class TranscriptError(LanesError):
    """An import document that is not a valid Lanes conversation (names the file and the field)."""


# -- export --------------------------------------------------------------------
def conversation_to_json(store: Store, conversation_id: int) -> dict[str, Any]:
    """The whole conversation as a JSON-ready dict; read in one transaction so it is one snapshot."""
    with store.snapshot():
        conv = store.conversation(conversation_id)
        messages = store.messages(conversation_id)
        versions = {m.id: store.versions(m.id) for m in messages if m.versions > 1}
        history = store.copy_history(conversation_id)
        comparisons = store.comparisons(conversation_id)
    return {
        "format": FORMAT,
        "version": VERSION,
        "conversation": {
            "title": conv.title, "model": conv.model, "system_prompt": conv.system_prompt,
            "settings": dict(conv.settings), "recallable": conv.recallable,
            "created_at": conv.created_at, "updated_at": conv.updated_at,
        },
        "messages": [_message_out(m, versions.get(m.id, ())) for m in messages],
        "copy_history": history,
        "comparisons": [
            {
                "messages": [dict(x) for x in c.messages], "settings": dict(c.settings), "model": c.model,
                "copy_history": c.copy_history, "status": c.status, "created_at": c.created_at,
                "runs": [
                    {
                        "side": r.side, "repeat": r.repeat, "position": r.position, "content": r.content,
                        "status": r.status, "error": r.error, "stats": r.stats, "origins": pack_origins(r.origins),
                        "tokens": _list(r.tokens), "copy_history_after": r.copy_history_after,
                        "rates": None if r.rates is None else [dict(x) for x in r.rates],
                    }
                    for r in c.runs  # in the store's order: by repeat, then position
                ],
            }
            for c in comparisons
        ],
    }


def _message_out(m: Message, versions: Sequence[MessageVersion]) -> dict[str, Any]:
    return {
        "role": m.role, "content": m.content, "status": m.status, "error": m.error, "stats": m.stats,
        "origins": pack_origins(m.origins), "tokens": _list(m.tokens), "tokens_model": m.tokens_model,
        "created_at": m.created_at, "updated_at": m.updated_at, "version": m.version,
        "versions": [  # the others, each with the user message it answered as it was then
            {"number": v.number, "prompt": v.prompt, "content": v.content, "status": v.status, "error": v.error,
             "stats": v.stats, "origins": pack_origins(v.origins), "tokens": _list(v.tokens),
             "tokens_model": v.tokens_model, "created_at": v.created_at}
            for v in versions
        ],
    }


def _list(tokens: tuple[int, ...] | None) -> list[int] | None:
    return None if tokens is None else list(tokens)


# -- import --------------------------------------------------------------------
class _Invalid(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")


Check = Callable[[Any, str], Any]


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    for t, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
                    (list, "an array"), (Mapping, "an object")):
        if isinstance(v, t):
            return name
    return type(v).__name__


def _text(v: Any, f: str) -> str:
    if not isinstance(v, str):
        raise _Invalid(f, f"must be a string, not {_kind(v)}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Invalid(f, "is not valid Unicode (it holds a lone surrogate)") from exc
    return v


def _number(v: Any, f: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _Invalid(f, f"must be a finite number, not {_kind(v) if not isinstance(v, float) else v}")
    return v


def _flag(v: Any, f: str) -> bool:
    if not isinstance(v, bool):
        raise _Invalid(f, f"must be true or false, not {_kind(v)}")
    return v


def _object(v: Any, f: str) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise _Invalid(f, f"must be an object, not {_kind(v)}")
    return dict(v)


def _array(v: Any, f: str) -> list[Any]:
    if not isinstance(v, list):
        raise _Invalid(f, f"must be an array, not {_kind(v)}")
    return v


def _index(v: Any, f: str) -> int:
    """A whole number from 0 (a repeat, a position, a round), small enough for the database."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _INT32[1]:
        raise _Invalid(f, f"must be a whole number from 0 (got {json.dumps(v)})")
    return v


def _optional(check: Check) -> Check:
    return lambda v, f: None if v is None else check(v, f)


def _choice(options: tuple[str, ...]) -> Check:
    def check(v: Any, f: str) -> str:
        if v not in options:
            raise _Invalid(f, f"must be one of {', '.join(options)} (got {json.dumps(v)})")
        return v

    return check


def _tokens(v: Any, f: str) -> tuple[int, ...]:
    for i, t in enumerate(_array(v, f)):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= _INT32[1]:
            raise _Invalid(f"{f}[{i}]", f"must be a token id (a whole number 0 to 2^31-1), not {json.dumps(t)}")
    return tuple(v)


def _origins(v: Any, f: str) -> tuple[str, ...]:
    for i, c in enumerate(_text(v, f)):
        if c not in _ORIGIN_LETTERS:
            raise _Invalid(f, f"has {c!r} at position {i}; each letter must be m, c or r")
    return unpack_origins(v) or ()


def _field(obj: Mapping[str, Any], key: str, f: str, check: Check, default: Any = _REQUIRED) -> Any:
    if key not in obj:
        if default is _REQUIRED:
            raise _Invalid(f"{f}.{key}" if f else key, "is missing")
        return default
    return check(obj[key], f"{f}.{key}" if f else key)


def _counts(v: Any, f: str) -> dict[str, dict[str, float]]:
    """A copy history: {source: {"accepted": n, "tested": n}}."""
    out = {}
    for source, counts in _object(v, f).items():
        g = f"{f}[{json.dumps(source)}]"
        c = _object(counts, g)
        out[_text(source, g)] = {k: _field(c, k, g, _number) for k in ("accepted", "tested")}
    return out


def _reply(m: Any, f: str) -> dict[str, Any]:
    """Fields a message and a comparison run share, checked; origins and tokens must pair up."""
    out = {
        "content": _field(m, "content", f, _text),
        "status": _field(m, "status", f, _choice(STATUSES), "complete"),
        "error": _field(m, "error", f, _optional(_text), None),
        "stats": _field(m, "stats", f, _optional(_object), None),
        "origins": _field(m, "origins", f, _optional(_origins), None),
        "tokens": _field(m, "tokens", f, _optional(_tokens), None),
    }
    if out["origins"] is not None and out["tokens"] is not None and len(out["origins"]) != len(out["tokens"]):
        raise _Invalid(f"{f}.origins", f"has {len(out['origins'])} letters but {f}.tokens has "
                       f"{len(out['tokens'])} ids; they must match one to one")
    return out


def _message(v: Any, f: str) -> dict[str, Any]:
    m = _object(v, f)
    out = {
        "role": _field(m, "role", f, _choice(ROLES)),
        **_reply(m, f),
        "tokens_model": _field(m, "tokens_model", f, _optional(_text), None),
        "created_at": _field(m, "created_at", f, _number, None),
        "updated_at": _field(m, "updated_at", f, _number, None),
        "version": _field(m, "version", f, _number_from(1), 1),
        "versions": [_version(x, f"{f}.versions[{i}]") for i, x in enumerate(_field(m, "versions", f, _array, []))],
    }
    numbers = [out["version"], *(x.number for x in out["versions"])]
    if sorted(numbers) != list(range(1, len(numbers) + 1)):
        raise _Invalid(f"{f}.versions", f"numbers {sorted(numbers)} (with {f}.version) must be 1 to {len(numbers)},"
                       " each once")
    return out


def _number_from(low: int) -> Check:
    def check(v: Any, f: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _INT32[1]:
            raise _Invalid(f, f"must be a whole number from {low} (got {json.dumps(v)})")
        return v

    return check


def _version(v: Any, f: str) -> MessageVersion:
    x = _object(v, f)
    reply = _reply(x, f)
    return MessageVersion(0, _field(x, "number", f, _number_from(1)), _field(x, "prompt", f, _optional(_text), None),
                          reply["content"], reply["status"], reply["error"], reply["stats"], reply["origins"],
                          reply["tokens"], _field(x, "tokens_model", f, _optional(_text), None),
                          _field(x, "created_at", f, _number, 0.0))


def _rate(v: Any, f: str) -> dict[str, Any]:
    """One entry of a run's rate trajectory: {"round": n, "source": name, "rate": 0..1}."""
    x = _object(v, f)
    rate = _field(x, "rate", f, _number)
    if not 0 <= rate <= 1:
        raise _Invalid(f"{f}.rate", f"must be from 0 to 1 (got {json.dumps(rate)})")
    return {"round": _field(x, "round", f, _index), "source": _field(x, "source", f, _text), "rate": rate}


def _rates(v: Any, f: str) -> tuple[dict[str, Any], ...]:
    return tuple(_rate(x, f"{f}[{i}]") for i, x in enumerate(_array(v, f)))


def _run(v: Any, f: str) -> ComparisonRun:
    r = _object(v, f)
    return ComparisonRun(
        side=_field(r, "side", f, _choice(SIDES)),
        repeat=_field(r, "repeat", f, _index),
        position=_field(r, "position", f, _index),
        **_reply(r, f),
        copy_history_after=_field(r, "copy_history_after", f, _optional(_object), None),
        rates=_field(r, "rates", f, _optional(_rates), None),
    )


def _comparison(v: Any, f: str) -> dict[str, Any]:
    c = _object(v, f)
    runs = [_run(r, f"{f}.runs[{i}]") for i, r in enumerate(_field(c, "runs", f, _array, []))]
    first: dict[tuple[str, int], int] = {}
    for i, r in enumerate(runs):
        j = first.setdefault((r.side, r.repeat), i)
        if j != i:
            raise _Invalid(f"{f}.runs[{i}]", f"repeats side {json.dumps(r.side)} in repeat {r.repeat} "
                           f"(already {f}.runs[{j}]); each side runs once per repeat")
    messages = _field(c, "messages", f, _array)
    for i, x in enumerate(messages):
        for k, text in _object(x, f"{f}.messages[{i}]").items():
            _text(text, f"{f}.messages[{i}].{k}")
    return {
        "messages": messages, "runs": runs,
        "settings": _field(c, "settings", f, _object, {}),
        "model": _field(c, "model", f, _text, ""),
        "copy_history": _field(c, "copy_history", f, _optional(_object), None),
        "status": _field(c, "status", f, _choice(STATUSES), "complete"),
        "created_at": _field(c, "created_at", f, _number, None),
    }


def _parse(data: Any) -> dict[str, Any]:
    """The whole document checked and normalised, or _Invalid naming the first wrong field."""
    if not isinstance(data, Mapping):
        raise _Invalid("the document", f"must be a JSON object with \"format\": \"{FORMAT}\", not {_kind(data)}")
    if data.get("format") != FORMAT:
        raise _Invalid("format", f"must be \"{FORMAT}\" (got {json.dumps(data.get('format'))}); "
                       "is this a file `lanes export --format json` wrote?")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _Invalid("version", f"must be a whole number from 1 (got {json.dumps(version)})")
    if version > VERSION:
        raise _Invalid("version", f"is {version}, newer than this Lanes reads (up to {VERSION}); update Lanes")
    c = _field(data, "conversation", "", _object)
    conv = {
        "title": _field(c, "title", "conversation", _text, ""),
        "model": _field(c, "model", "conversation", _text, ""),
        "system_prompt": _field(c, "system_prompt", "conversation", _text, ""),
        "settings": _field(c, "settings", "conversation", _object, {}),
        "recallable": _field(c, "recallable", "conversation", _flag, True),
        "created_at": _field(c, "created_at", "conversation", _number, None),
        "updated_at": _field(c, "updated_at", "conversation", _number, None),
    }
    messages = _field(data, "messages", "", _array, [])
    comparisons = _field(data, "comparisons", "", _array, [])
    return {
        "conversation": conv,
        "messages": [_message(m, f"messages[{i}]") for i, m in enumerate(messages)],
        "copy_history": _field(data, "copy_history", "", _optional(_counts), None),
        "comparisons": [_comparison(x, f"comparisons[{i}]") for i, x in enumerate(comparisons)],
    }


def validate(data: Any, source: str) -> dict[str, Any]:
    """Check a whole document before anything is written; TranscriptError names ``source`` and the field."""
    try:
        return _parse(data)
    except _Invalid as exc:
        raise TranscriptError(f"{source}: {exc}") from None


def import_conversation(store: Store, data: Mapping[str, Any], source: str) -> Conversation:
    """Add a conversation from a JSON document, all or nothing (one transaction, checked first)."""
    doc = validate(data, source)
    conv = doc["conversation"]
    with store.write():
        new = store.create_conversation(**conv)
        for m in doc["messages"]:
            shown, versions = m.pop("version"), m.pop("versions")
            added = store.add_message(new.id, **m)
            if versions:
                store.add_versions(added.id, shown, versions)
        if doc["copy_history"]:
            store.save_copy_history(new.id, doc["copy_history"])
        for c in doc["comparisons"]:
            store.add_comparison(c["messages"], c["runs"], conversation_id=new.id, settings=c["settings"],
                                 model=c["model"], copy_history=c["copy_history"], status=c["status"],
                                 created_at=c["created_at"])
        if conv["updated_at"] is not None:  # adding messages touched it; keep the document's time
            store.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (conv["updated_at"], new.id))
        return store.conversation(new.id)
