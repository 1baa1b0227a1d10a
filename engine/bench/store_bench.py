"""``lanes bench-store``: time the store at scale on a synthetic database in a temporary folder.

The issue's targets (10,000 conversations, 100,000 messages, a 2-core machine): list the newest 50
conversations under 50 ms, a full-text search under 200 ms, open a 200-message conversation under
50 ms, and load the engine's Recall index at start under 2 s for 10,000 stored messages.

Data: chat-like messages drawn from a fixed vocabulary (Zipf word frequencies) with a seeded RNG,
user and assistant turns alternating, assistant turns with stats and per-token origins as the app
stores them, token ids kept with each message for a fixed model. Messages are inserted in time
order across conversations (as a user's database fills), through the real schema so the FTS
triggers fire. Never touches the user's data.

Each measure runs once to warm up, then ``repeats`` times; ``met`` is judged on the p90.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.drafts.copy_index import RecallIndex
from engine.model.families import DEFAULT
from engine.model.machine import cpu_model
from engine.store.recall import recall_documents
from engine.store.records import dumps, pack_origins, pack_tokens
from engine.store.store import Store

MODEL = "SmolLM2-135M-Instruct"
TOKEN_VOCAB = 49152  # SmolLM2's vocabulary size: token ids are below it
LONG_CONVERSATION = 200  # messages in the conversation that is opened
SEED = 20261130
NOW = 1_764_460_800.0  # fixed "now" (2025-11-30 UTC) so two runs build the same database
SPAN_S = 2 * 365 * 86_400.0  # conversations start over the two years before NOW
CHUNK = 1_000  # messages per transaction: the app commits often, so the FTS index has many segments

TARGETS_MS = {"list": 50.0, "search": 200.0, "open": 50.0, "recall": 2000.0}

# Search queries: what a user types. Lanes' search treats every word as a prefix.
RARE_WORD = "quokka"  # planted in a handful of messages; no vocabulary word starts with it
RARE_HITS = 5
QUERIES: tuple[tuple[str, str], ...] = (
    ("common word", "the"),
    ("rare word", RARE_WORD),
    ("two words", "python error"),
    ("prefix", "optim"),
    ("one letter", "t"),  # the first keystroke in a search box: a prefix of very many words
)

# Real words, roughly most frequent first; a long tail of made-up words follows them.
_COMMON = """
the to and a of i you it is in that for this with be on can your what if are not have but
as do my or so at will use an from we how here by like one all there would about me they
just which more some should then make when need also code function file it's get data want
example first way time could other thanks any you're know these error python value new
list model help let's question first step work using into set than only check run does
output line because string number return also sure well see each where text two problem
test add change write class method try call name result look why following input create
issue version type update instead error build case point user list different message
project note same both simple default below above great good right thank answer explain
idea start read already loop variable array object key table query database server client
request response json config path install package import module library install script
command option parameter argument memory token cache index search sort filter map reduce
async thread process performance optimize optimization optimal fast slow small large
example lines words sentence paragraph summary translate fix typo rewrite shorter longer
email letter draft tone formal casual meeting schedule plan week today tomorrow morning
recipe cook minutes oven chicken rice garlic onion salt pepper butter sugar flour water
travel trip city train flight hotel budget price cost money pay month year day hour
story character chapter plot scene dialogue poem rhyme title book author write reader
math equation formula proof integral derivative matrix vector probability average median
"""

_SYLLABLES = (
    "ka", "ri", "to", "ne", "mu", "sa", "lo", "vi", "pe", "da", "fu", "gi", "ho", "ja", "ke", "li",
    "mo", "na", "pu", "ra", "se", "ti", "ve", "wa", "ya", "zo", "bel", "cor", "dan", "fer", "gal",
    "hin", "jor", "kel", "lum", "mar", "nor", "pol", "quin", "ros", "sel", "tan", "ul", "ver",
    "wil", "xan", "yor", "zel",
)


@dataclass(frozen=True)
class _Corpus:
    """The vocabulary, its Zipf weights and each word's token ids (one or two per word)."""

    words: tuple[str, ...]
    cum_weights: tuple[float, ...]
    tokens: dict[str, tuple[int, ...]]


def _corpus(rng: random.Random, size: int = 20_000) -> _Corpus:
    words = list(dict.fromkeys(_COMMON.split()))
    seen = set(words)
    while len(words) < size:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if w not in seen and not w.startswith((RARE_WORD, "optim")):
            seen.add(w)
            words.append(w)
    cum: list[float] = []
    total = 0.0
    for rank in range(len(words)):
        total += 1.0 / (rank + 1) ** 1.05
        cum.append(total)
    # ~30% of words take two tokens, so token count is ~1.3x word count, as with a BPE tokenizer.
    toks = {w: tuple(rng.randrange(TOKEN_VOCAB) for _ in range(2 if rng.random() < 0.3 else 1)) for w in words}
    toks[RARE_WORD] = (rng.randrange(TOKEN_VOCAB), rng.randrange(TOKEN_VOCAB))
    return _Corpus(tuple(words), tuple(cum), toks)


def _text(rng: random.Random, corpus: _Corpus, n_words: int) -> tuple[str, list[int]]:
    """A chat-like message of ``n_words`` words (sentences, sometimes paragraphs) and its token ids."""
    words = rng.choices(corpus.words, cum_weights=corpus.cum_weights, k=n_words)
    tokens = [t for w in words for t in corpus.tokens[w]]
    out: list[str] = []
    cap = True
    for i, w in enumerate(words):
        out.append(w.capitalize() if cap else w)
        cap = False
        if i == n_words - 1 or rng.random() < 0.08:
            out.append(". " if rng.random() < 0.85 else ".\n\n")
            cap = True
        elif rng.random() < 0.05:
            out.append(", ")
        else:
            out.append(" ")
    return "".join(out).strip(), tokens


def _message_counts(rng: random.Random, conversations: int, messages: int) -> tuple[list[int], int]:
    """Messages per conversation (every one at least 1, one exactly LONG_CONVERSATION) and that one's index."""
    if conversations < 1 or messages < LONG_CONVERSATION + conversations - 1:
        raise ValueError(
            f"need at least 1 conversation and {LONG_CONVERSATION} + (conversations - 1) messages, "
            f"got {conversations} conversations and {messages} messages"
        )
    long_index = rng.randrange(conversations)
    others = conversations - 1
    spare = messages - LONG_CONVERSATION - others
    weights = [rng.expovariate(1.0) + 0.2 for _ in range(others)]
    total = sum(weights) or 1.0
    extra = [int(spare * w / total) for w in weights]
    for _ in range(spare - sum(extra)):
        extra[rng.randrange(others)] += 1
    counts = [1 + e for e in extra]
    counts.insert(long_index, LONG_CONVERSATION)
    return counts, long_index


def _stats(rng: random.Random, generated: int) -> dict[str, Any]:
    """An assistant message's stats, shaped as the app stores them (engine.service.session.stats_dict)."""
    seconds = generated / rng.uniform(20.0, 50.0)
    tested = rng.randint(0, generated)
    return {
        "reason": "stop", "prompt_tokens": rng.randint(50, 3000), "generated": generated,
        "seconds": round(seconds, 3), "tokens_per_s": round(generated / seconds, 2),
        "first_token_s": round(rng.uniform(0.05, 0.6), 3), "prefill_reused": rng.randint(0, 2000),
        "rounds": generated // 2 + 1,
        "rows": {"context": {"tested": tested, "accepted": tested // 2, "granted": tested},
                 "recall": {"tested": 0, "accepted": 0, "granted": 0}},
        "settings": {"max_tokens": 512, "temperature": 0.0, "top_p": 1.0, "own_copy_rates": "family"},
        "copy_history_before": None,
    }


def _origins(rng: random.Random, n: int) -> list[str]:
    """Per-token origins: model-written with runs copied from context."""
    out: list[str] = []
    while len(out) < n:
        out.extend([rng.choice(("model", "model", "context"))] * rng.randint(1, 12))
    return out[:n]


def build_database(path: Path, conversations: int, messages: int, seed: int = SEED) -> dict[str, Any]:
    """Fill a new database at ``path``; returns its long conversation's id, build seconds and size."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    corpus = _corpus(rng)
    counts, long_index = _message_counts(rng, conversations, messages)
    rare = set(rng.sample(range(messages), min(RARE_HITS, messages)))

    # Schedule: each conversation starts somewhere in the span; turns follow minutes apart, with the
    # odd gap of days (a conversation picked up again). The long one runs over months.
    plans: list[tuple[float, int, list[float]]] = []
    for i, n in enumerate(counts):
        start = NOW - rng.uniform(86_400.0, SPAN_S)
        gap_mean = 30 * 86_400.0 / n if i == long_index else 90.0
        times, t = [], start
        for _ in range(n):
            times.append(t)
            t += rng.expovariate(1.0 / gap_mean) if rng.random() > 0.03 else rng.uniform(86_400.0, 5 * 86_400.0)
        plans.append((start, i, times))
    plans.sort()  # conversation ids ascend with creation, as in the app

    rows: list[tuple[float, int, int, str, bytes | None, str | None, str | None]] = []
    titles: dict[int, str] = {}
    serial = 0
    for _, i, times in plans:
        for k, when in enumerate(times):
            role = "user" if k % 2 == 0 else "assistant"
            n_words = rng.randint(20, 80) if role == "user" else rng.randint(40, 150)
            content, tokens = _text(rng, corpus, n_words)
            if serial in rare:
                content += f" What about the {RARE_WORD}?"
                tokens.extend(corpus.tokens[RARE_WORD])
            serial += 1
            if k == 0:
                titles[i] = " ".join(content.split()[:6])
            if role == "assistant":
                stats, origins = dumps(_stats(rng, len(tokens))), pack_origins(_origins(rng, len(tokens)))
            else:
                stats, origins = None, None
            rows.append((when, i, k, content, pack_tokens(tokens), stats, origins))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))  # messages arrive interleaved across conversations

    with Store(path) as store:
        ids: dict[int, int] = {}
        with store.db.atomic():
            for start, i, times in plans:
                ids[i] = store.create_conversation(
                    title=titles[i], model=MODEL, created_at=start, updated_at=times[-1]
                ).id
        sql = (
            "INSERT INTO messages (conversation_id, role, content, status, error, stats, origins, tokens,"
            " tokens_model, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        for lo in range(0, len(rows), CHUNK):
            with store.db.atomic():
                store.db.conn.executemany(sql, [
                    (ids[i], "user" if k % 2 == 0 else "assistant", content, "complete", None, stats, origins,
                     blob, MODEL, when, when)
                    for when, i, k, content, blob, stats, origins in rows[lo : lo + CHUNK]
                ])
        # Fold the WAL back so reads and the size reflect a settled file, as after the app's checkpoints.
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        long_id = ids[long_index]
    return {"long_conversation_id": long_id, "build_s": time.perf_counter() - t0, "bytes": _size(path)}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def _summary(runs_ms: list[float]) -> dict[str, float]:
    ordered = sorted(runs_ms)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return {"median_ms": statistics.median(ordered), "p90_ms": p90, "max_ms": ordered[-1]}


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    """Milliseconds of ``repeats`` calls after one warm-up call, and the last call's result."""
    result = fn()
    runs: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        runs.append((time.perf_counter() - t) * 1000.0)
    return runs, result


def _measure(key: str, name: str, target: str, runs_ms: list[float], **detail: Any) -> dict[str, Any]:
    s = _summary(runs_ms)
    limit = TARGETS_MS[target]
    return {"key": key, "name": name, **s, "target_ms": limit, "met": s["p90_ms"] < limit,
            "runs_ms": [round(r, 3) for r in runs_ms], "detail": detail}


def machine() -> dict[str, Any]:
    """Where the numbers came from."""
    return {
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "date": time.strftime("%Y-%m-%d"),
    }


def _recall_load(path: Path, min_match: int) -> tuple[float, float, int, int]:
    """A start's Recall load as the app does it: open the store, read the documents, index them
    (engine.Engine.add_recall_many). Returns read ms, index ms, documents, tokens indexed."""
    t0 = time.perf_counter()
    with Store(path) as store:
        docs = recall_documents(store, MODEL)
    t1 = time.perf_counter()
    index = RecallIndex(min_match=min_match)
    for doc_id, tokens in [(d, list(t)) for d, t in docs.items()]:
        index.add(doc_id, tokens)
    t2 = time.perf_counter()
    return (t1 - t0) * 1000.0, (t2 - t1) * 1000.0, len(docs), len(index)


def run_store_bench(conversations: int, messages: int, recall_messages: int, repeats: int,
                    folder: Path) -> dict[str, Any]:
    """Build the databases under ``folder``, time each measure, and return the results."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    folder = Path(folder)
    main_db, recall_db = folder / "main" / "lanes.db", folder / "recall" / "lanes.db"
    main = build_database(main_db, conversations, messages)
    # The Recall database keeps the main one's messages per conversation (and so its document sizes).
    recall_conversations = max(1, round(conversations * recall_messages / messages))
    recall_conversations = min(recall_conversations, max(1, recall_messages - LONG_CONVERSATION + 1))
    recall = build_database(recall_db, recall_conversations, recall_messages, seed=SEED + 1)

    measures: list[dict[str, Any]] = []
    with Store(main_db) as store:
        runs, listed = _timed(lambda: store.list_conversations(50), repeats)
        measures.append(_measure("list", "list newest 50 conversations", "list", runs, rows=len(listed)))
        for label, query in QUERIES:
            runs, found = _timed(lambda q=query: store.search(q), repeats)
            measures.append(_measure(f"search:{label}", f'search "{query}" ({label})', "search", runs,
                                     query=query, results=len(found)))
        long_id = main["long_conversation_id"]
        runs, opened = _timed(lambda: store.messages(long_id), repeats)
        measures.append(_measure("open", f"open a conversation of {len(opened)} messages", "open", runs,
                                 conversation_id=long_id, messages=len(opened),
                                 tokens=sum(len(m.tokens or ()) for m in opened)))

    min_match = DEFAULT.min_match["recall"]
    _recall_load(recall_db, min_match)  # warm-up
    reads, indexes, totals = [], [], []
    docs = tokens = 0
    for _ in range(repeats):
        t = time.perf_counter()
        read_ms, index_ms, docs, tokens = _recall_load(recall_db, min_match)
        totals.append((time.perf_counter() - t) * 1000.0)
        reads.append(read_ms)
        indexes.append(index_ms)
    measures.append(_measure(
        "recall", f"load Recall at start ({recall_messages:,} messages)", "recall", totals,
        documents=docs, tokens=tokens, min_match=min_match,
        read_median_ms=statistics.median(reads), index_median_ms=statistics.median(indexes),
    ))

    return {
        "machine": machine(),
        "sizes": {"conversations": conversations, "messages": messages, "recall_conversations": recall_conversations,
                  "recall_messages": recall_messages, "repeats": repeats},
        "build": {"main_s": main["build_s"], "main_bytes": main["bytes"], "recall_s": recall["build_s"],
                  "recall_bytes": recall["bytes"]},
        "measures": measures,
        "all_met": all(m["met"] for m in measures),
    }


def to_markdown(result: dict[str, Any]) -> str:
    """The results as a Markdown table with the machine and build figures."""
    m, s, b = result["machine"], result["sizes"], result["build"]
    lines = [
        f"Store at scale: {s['conversations']:,} conversations, {s['messages']:,} messages; Recall load from "
        f"{s['recall_messages']:,} messages in {s['recall_conversations']:,} conversations; "
        f"{s['repeats']} timed runs each after one warm-up.",
        "",
        "| measure | median ms | p90 ms | max ms | target ms | met (p90) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["measures"]:
        lines.append(f"| {r['name']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['max_ms']:.1f} | "
                     f"< {r['target_ms']:.0f} | {'yes' if r['met'] else 'no'} |")
    details = []
    for r in result["measures"]:
        d = r["detail"]
        if r["key"].startswith("search:"):
            details.append(f"`{d['query']}`: {d['results']} conversations")
    recall = next(r["detail"] for r in result["measures"] if r["key"] == "recall")
    lines += [
        "",
        "Search results: " + ", ".join(details) + ".",
        f"Recall: {recall['documents']:,} documents, {recall['tokens']:,} tokens indexed (min_match "
        f"{recall['min_match']}); median read {recall['read_median_ms']:.0f} ms + index "
        f"{recall['index_median_ms']:.0f} ms.",
        f"Build: main database {b['main_s']:.1f} s, {b['main_bytes'] / 2**20:.1f} MiB; Recall database "
        f"{b['recall_s']:.1f} s, {b['recall_bytes'] / 2**20:.1f} MiB.",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs ({m['cpu_model'] or 'unknown model'}), "
        f"Python {m['python']}, SQLite {m['sqlite']}, {m['date']}.",
    ]
    return "\n".join(lines) + "\n"


def run_store_bench_cli(args: argparse.Namespace) -> int:
    """``lanes bench-store``: run in a temporary folder, print Markdown, write JSON with --json.
    Exit status 0 even when a target is missed: it is a measurement, not a test."""
    with tempfile.TemporaryDirectory(prefix="lanes-bench-store-") as tmp:
        result = run_store_bench(args.conversations, args.messages, args.recall_messages, args.repeats, Path(tmp))
    sys.stdout.write(to_markdown(result))
    if args.json is not None:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    return 0
