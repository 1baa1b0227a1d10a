"""Conversations for people: a readable Markdown transcript and one self-contained HTML page.

Both are rendered from the lossless JSON document (``transcript.conversation_to_json``). Token ids
cannot be turned into text here (no tokenizer), so copied tokens appear as shares in the stats line.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from engine.store.store import Store
from engine.store.transcript import conversation_to_json

_STATUS_MARK = {"partial": "partial: stopped early", "cancelled": "cancelled", "error": "error"}
_ORIGIN_NAMES = {"c": "context", "r": "recall"}


def _when(ts: float | None) -> str:
    try:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts is not None else "?"
    except (OverflowError, OSError, ValueError):
        return str(ts)


def _num(v: Any) -> float | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _count(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"


def stats_line(stats: Mapping[str, Any] | None, origins: str | None) -> str:
    """A reply's statistics in one line ("120 tokens · 41.2 tok/s · copied 35% · rows accepted/tested:
    context 30/40"); tolerant of missing keys, as stats come from any version."""
    stats = stats if isinstance(stats, Mapping) else {}
    parts = []
    generated, seconds = _num(stats.get("generated")), _num(stats.get("seconds"))
    if generated is not None:
        parts.append(f"{_count(generated)} tokens")
    rate = _num(stats.get("tokens_per_s"))
    if rate is None and generated is not None and seconds:
        rate = generated / seconds
    if rate is not None:
        parts.append(f"{rate:.1f} tok/s")
    first = _num(stats.get("first_token_s"))
    if first is not None:
        parts.append(f"first token {first:.2f} s")
    if origins:
        shares = [f"{name} {origins.count(c) / len(origins):.0%}" for c, name in _ORIGIN_NAMES.items()
                  if c in origins]
        copied = sum(origins.count(c) for c in _ORIGIN_NAMES) / len(origins)
        parts.append(f"copied {copied:.0%}" + (f" ({', '.join(shares)})" if shares else ""))
    rows = stats.get("rows")
    if isinstance(rows, Mapping) and rows:
        counts = []
        for source, c in sorted(rows.items()):
            c = c if isinstance(c, Mapping) else {}
            acc, tested = _num(c.get("accepted")), _num(c.get("tested"))
            if acc is not None and tested is not None:
                counts.append(f"{source} {_count(acc)}/{_count(tested)}")
        if counts:
            parts.append("rows accepted/tested: " + ", ".join(counts))
    return " · ".join(parts)


def _meta(conv: Mapping[str, Any]) -> list[str]:
    lines = [" · ".join(x for x in (
        f"Model: {conv['model']}" if conv["model"] else "",
        f"started {_when(conv['created_at'])}", f"updated {_when(conv['updated_at'])}",
        "" if conv["recallable"] else "not offered to Recall",
    ) if x)]
    if conv["settings"]:
        lines.append("Settings: " + ", ".join(
            f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(conv["settings"].items())))
    return lines


def _title(conv: Mapping[str, Any], conversation_id: int) -> str:
    return conv["title"] or f"Conversation {conversation_id}"


def conversation_to_markdown(store: Store, conversation_id: int) -> str:
    """A readable Markdown transcript; message text is kept verbatim."""
    doc = conversation_to_json(store, conversation_id)
    conv = doc["conversation"]
    out = [f"# {_title(conv, conversation_id)}", "", *(f"*{line}*  " for line in _meta(conv)), ""]
    if conv["system_prompt"]:
        out += ["## System prompt", "", conv["system_prompt"], ""]

    def reply(heading: str, r: Mapping[str, Any]) -> None:
        mark = _STATUS_MARK.get(r["status"])
        out.extend([heading + (f" ({mark})" if mark else ""), "", r["content"] or "*(no text)*", ""])
        if r["error"]:
            out.extend([f"> **Error:** {r['error']}", ""])
        line = stats_line(r["stats"], r["origins"])
        if line:
            out.extend([f"*{line}*", ""])

    for m in doc["messages"]:
        reply(f"## {m['role'].capitalize()}", m)
    for i, c in enumerate(doc["comparisons"], 1):
        out += [f"## Comparison {i}", "", f"*{c['model'] or 'model ?'} · {_when(c['created_at'])}*", ""]
        if c["messages"]:
            out += ["**Request:**", "", str(c["messages"][-1].get("content", "")), ""]
        for s in c["sides"]:
            reply(f"### Own copy rates {'on' if s['own_copy_rates'] else 'off'}", s)
    return "\n".join(out).rstrip("\n") + "\n"


_CSS = """
:root { color-scheme: light dark; --bg: #fff; --fg: #1d1d1f; --muted: #6e6e73; --line: #e3e3e8;
  --user: #f2f2f7; --warn: #a05a00; --err: #c4001a; }
@media (prefers-color-scheme: dark) { :root { --bg: #1c1c1e; --fg: #ececf0; --muted: #98989d;
  --line: #3a3a3c; --user: #2c2c2e; --warn: #ffb340; --err: #ff6961; } }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 16px/1.6 -apple-system, BlinkMacSystemFont, "Segoe UI", system-ui, sans-serif; }
main { max-width: 46rem; margin: 0 auto; padding: 2.5rem 1.25rem 4rem; }
h1 { font-size: 1.6rem; line-height: 1.25; margin: 0 0 .4rem; }
h2 { font-size: 1.15rem; margin: 2.5rem 0 .5rem; }
.meta, .stats { color: var(--muted); font-size: .85rem; margin: .2rem 0; }
.msg { border-top: 1px solid var(--line); padding: 1rem 0; }
.msg h3 { font-size: .78rem; letter-spacing: .06em; text-transform: uppercase; color: var(--muted);
  margin: 0 0 .4rem; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
.user .text, .system .text { background: var(--user); border-radius: 10px; padding: .6rem .85rem; }
.mark { color: var(--warn); font-weight: 600; text-transform: none; letter-spacing: 0; }
.error { color: var(--err); margin: .4rem 0 0; white-space: pre-wrap; }
"""


def conversation_to_html(store: Store, conversation_id: int) -> str:
    """One self-contained HTML page: inline CSS, no scripts or outside resources, all content escaped."""
    doc = conversation_to_json(store, conversation_id)
    conv = doc["conversation"]
    e = html.escape
    title = e(_title(conv, conversation_id))
    out = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
        f"<title>{title}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", "<main>",
        f"<h1>{title}</h1>", *(f'<p class="meta">{e(line)}</p>' for line in _meta(conv)),
    ]
    if conv["system_prompt"]:
        out.append(f'<section class="msg system"><h3>System prompt</h3><div class="text">'
                   f'{e(conv["system_prompt"])}</div></section>')

    def reply(cls: str, heading: str, r: Mapping[str, Any]) -> None:
        mark = _STATUS_MARK.get(r["status"])
        out.append(f'<section class="msg {e(cls)}"><h3>{e(heading)}'
                   + (f' <span class="mark">({e(mark)})</span>' if mark else "") + "</h3>"
                   + (f'<div class="text">{e(r["content"])}</div>' if r["content"] or not r["error"] else ""))
        if r["error"]:
            out.append(f'<p class="error">Error: {e(r["error"])}</p>')
        line = stats_line(r["stats"], r["origins"])
        if line:
            out.append(f'<p class="stats">{e(line)}</p>')
        out.append("</section>")

    for m in doc["messages"]:
        reply(m["role"], m["role"].capitalize(), m)
    for i, c in enumerate(doc["comparisons"], 1):
        out.append(f"<h2>Comparison {i}</h2>")
        out.append(f'<p class="meta">{e(c["model"] or "model ?")} · {e(_when(c["created_at"]))}</p>')
        if c["messages"]:
            last = {"content": str(c["messages"][-1].get("content", "")), "status": "complete",
                    "error": None, "stats": None, "origins": None}
            reply("user", "Request", last)
        for s in c["sides"]:
            reply("assistant", f"Own copy rates {'on' if s['own_copy_rates'] else 'off'}", s)
    out += ["</main>", "</body>", "</html>", ""]
    return "\n".join(out)
