"""Conversations for people: a readable Markdown transcript and one self-contained HTML page.

Both are rendered from the lossless JSON document (``transcript.conversation_to_json``). Token ids
cannot be turned into text here (no tokenizer), so copied tokens appear as shares in the stats line.
A comparison appears as its A/B report's table (``ab_report.ABReport``), as the pane shows it.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.store.ab_report import ABReport
from engine.store.markdown_text import to_html
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


_REASONS = {"eos": "finished", "stop": "hit a stop sequence", "length": "hit the length limit",
            "cancelled": "stopped", "error": "failed"}
_SOURCE_WORDS = {"context": "this conversation", "recall": "other conversations"}


@dataclass(frozen=True)
class _Figures:
    generated: float | None
    rate: float | None
    first: float | None
    reason: str | None
    copied: float  # share of the reply's tokens that were copied drafts the model confirmed
    shares: list[tuple[str, float]]  # (source, share) of those
    rows: list[tuple[str, float, float]]  # (source, accepted, tested) draft rows
    left_out: int  # earliest messages left out of the prompt to fit the context


def _figures(stats: Mapping[str, Any] | None, origins: str | None) -> _Figures:
    """What a reply's statistics say, tolerant of missing keys and odd values (stats come from any
    version or an imported file)."""
    stats = stats if isinstance(stats, Mapping) else {}
    generated, seconds = _num(stats.get("generated")), _num(stats.get("seconds"))
    rate = _num(stats.get("tokens_per_s"))
    if rate is None and generated is not None and seconds:
        rate = generated / seconds
    shares, copied = [], 0.0
    if origins:
        shares = [(name, origins.count(c) / len(origins)) for c, name in _ORIGIN_NAMES.items() if c in origins]
        copied = sum(share for _, share in shares)
    rows = []
    if isinstance(stats.get("rows"), Mapping):
        for source, c in sorted(stats["rows"].items()):
            c = c if isinstance(c, Mapping) else {}
            acc, tested = _num(c.get("accepted")), _num(c.get("tested"))
            if acc is not None and tested:
                rows.append((source, acc, tested))
    reason = stats.get("reason") if isinstance(stats.get("reason"), str) else None
    left = _num(stats.get("left_out"))
    return _Figures(generated, rate, _num(stats.get("first_token_s")), reason, copied, shares, rows,
                    int(left) if left else 0)


def stats_line(stats: Mapping[str, Any] | None, origins: str | None) -> str:
    """A reply's statistics in one line for transcripts and the terminal ("120 tokens · 41.2 tok/s ·
    first token 0.21 s · finished · copied 35% (context 35%) · rows accepted/tested: context 30/40")."""
    f = _figures(stats, origins)
    parts = _summary_parts(f)
    if f.reason is not None:
        parts.insert(sum(x is not None for x in (f.generated, f.rate, f.first)), _REASONS.get(f.reason, f.reason))
    if isinstance(stats, Mapping) and isinstance(stats.get("rows"), Mapping) and stats["rows"]:
        counts = [f"{src} {_count(acc)}/{_count(tested)}" for src, acc, tested in f.rows]
        parts.append("rows accepted/tested: " + ", ".join(counts) if counts else "no copied rows")
    return " · ".join(parts)


def _summary_parts(f: _Figures) -> list[str]:
    parts = []
    if f.generated is not None:
        parts.append(f"{_count(f.generated)} tokens")
    if f.rate is not None:
        parts.append(f"{f.rate:.1f} tok/s")
    if f.first is not None:
        parts.append(f"first token {f.first:.2f} s")
    if f.copied:
        parts.append(f"copied {f.copied:.0%} ({', '.join(f'{n} {v:.0%}' for n, v in f.shares)})")
    return parts


def stats_summary(stats: Mapping[str, Any] | None, origins: str | None) -> str:
    """The window's line under a reply, in plain words ("120 tokens · 41.2 tok/s · first token 0.21 s ·
    35% copied"), saying how it ended only when that was not the model's own end;
    ``stats_explained`` says what each figure means."""
    f = _figures(stats, origins)
    parts = _summary_parts(f)[:3]
    if f.copied:
        parts.append(f"{f.copied:.0%} copied")
    if f.reason not in (None, "eos"):
        parts.append(_REASONS.get(f.reason or "", f.reason or ""))
    if f.left_out:
        parts.append(f"{f.left_out} earliest messages left out")
    return " · ".join(parts)


def stats_explained(stats: Mapping[str, Any] | None, origins: str | None) -> str:
    """What each figure of ``stats_summary`` means, one line each (the window's tooltip)."""
    f = _figures(stats, origins)
    lines = []
    if f.generated is not None:
        lines.append(f"{_count(f.generated)} tokens: the length of the reply in the model's word pieces.")
    if f.rate is not None:
        lines.append(f"{f.rate:.1f} tok/s: tokens written per second, from sending to the last token.")
    if f.first is not None:
        lines.append(f"First token {f.first:.2f} s: how long the model read the conversation before writing.")
    if f.reason is not None:
        lines.append(f"Ended: {_REASONS.get(f.reason, f.reason)}.")
    if f.copied:
        where = ", ".join(f"{v:.0%} from {_SOURCE_WORDS.get(n, n)}" for n, v in f.shares)
        lines.append(f"{f.copied:.0%} copied: tokens Lanes proposed by copying earlier text ({where}) and the "
                     "model confirmed, so they cost no pass of their own. The text is exactly the model's.")
    if f.left_out:
        lines.append(f"{f.left_out} earliest messages left out: the conversation no longer fits the model's "
                     "context, so this reply saw the system prompt and the newest messages only.")
    for src, acc, tested in f.rows:
        lines.append(f"Copy drafts from {_SOURCE_WORDS.get(src, src)}: {_count(acc)} of {_count(tested)} "
                     "proposed tokens accepted.")
    return "\n".join(lines)


def _meta(conv: Mapping[str, Any]) -> list[str]:
    lines = [" · ".join(x for x in (
        f"Model: {conv['model']}" if conv["model"] else "",
        f"started {_when(conv['created_at'])}", f"updated {_when(conv['updated_at'])}",
        "" if conv["recallable"] else "not offered to Recall",
    ) if x)]
    if conv["settings"]:
        lines.append(_settings(conv["settings"]))
    return lines


def _settings(settings: Mapping[str, Any]) -> str:
    """The reply settings in words ("max_tokens=512, own_copy_rates=model default"): None is the default."""
    return "Settings: " + ", ".join(
        f"{k}={'model default' if v is None else v if isinstance(v, str) else json.dumps(v)}"
        for k, v in sorted(settings.items()))


def _versions(m: Mapping[str, Any], asked: str | None) -> tuple[str, list[tuple[str, str | None, Mapping[str, Any]]]]:
    """A message's heading suffix (" · version 2 of 3") and its other versions: (title, the question it
    answered where that was not ``asked``, the version)."""
    others = m.get("versions") or []
    if not others:
        return "", []
    n = len(others) + 1
    return f" · version {m['version']} of {n}", [
        (f"Version {v['number']} of {n}", v["prompt"] if v["prompt"] not in (None, asked) else None, v)
        for v in others]


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

    asked = None
    for m in doc["messages"]:
        suffix, others = _versions(m, asked)
        reply(f"## {m['role'].capitalize()}{suffix}", m)
        for title, prompt, v in others:  # regenerated or edited away, kept
            if prompt is not None:
                out += [f"*{title} answered:*", "", *(f"> {x}" for x in prompt.splitlines()), ""]
            reply(f"### {title}", v)
        asked = m["content"] if m["role"] == "user" else asked
    for i, c in enumerate(doc["comparisons"], 1):
        mark = _STATUS_MARK.get(c["status"])
        out += [f"## Comparison {i}" + (f" ({mark})" if mark else ""), "",
                f"*{c['model'] or 'model ?'} · {_when(c['created_at'])}*" + ("  " if c["settings"] else "")]
        if c["settings"]:
            out.append(f"*{_settings(c['settings'])}*")
        out.append("")
        if c["messages"]:
            out += ["**Request:**", "", str(c["messages"][-1].get("content", "")), ""]
        out.append(ABReport.from_document(c).markdown())  # the table the pane and ``lanes compare`` show
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
.text { overflow-wrap: anywhere; margin: 0; }
.text > :first-child { margin-top: 0; } .text > :last-child { margin-bottom: 0; }
.text pre { background: var(--user); border-radius: 8px; padding: .6rem .85rem; overflow-x: auto;
  font: 14px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre; }
.text code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .92em; }
/* a cell breaks at words only (with "anywhere" a wide table squeezed its columns to a letter): a
   table wider than the page scrolls sideways instead */
.text table { border-collapse: collapse; margin: .6rem 0; display: block; max-width: 100%;
  overflow-x: auto; }
.text th, .text td { border: 1px solid var(--line); padding: .25rem .6rem; text-align: left;
  overflow-wrap: normal; }
.system .text { white-space: pre-wrap; }
.user .text, .system .text { background: var(--user); border-radius: 10px; padding: .6rem .85rem; }
.mark { color: var(--warn); font-weight: 600; text-transform: none; letter-spacing: 0; }
.error { color: var(--err); margin: .4rem 0 0; white-space: pre-wrap; }
.ab { border-collapse: collapse; margin: .8rem 0; font-variant-numeric: tabular-nums; }
.ab th, .ab td { border-bottom: 1px solid var(--line); padding: .25rem .8rem; text-align: right; }
.ab th:first-child, .ab td:first-child { text-align: left; }
.notes { color: var(--muted); font-size: .9rem; padding-left: 1.2rem; }
.notes li { white-space: pre-wrap; overflow-wrap: anywhere; }
details.version { border-top: 1px dashed var(--line); padding: .4rem 0 0; margin-top: .6rem; }
details.version summary { cursor: pointer; } details.version summary h3 { display: inline; }
.asked { color: var(--muted); margin: .6rem 0 0; white-space: pre-wrap; }
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

    def reply(cls: str, heading: str, r: Mapping[str, Any], tag: str = "section", asked: str | None = None,
              others: Sequence[tuple[str, str | None, Mapping[str, Any]]] = ()) -> None:
        mark = _STATUS_MARK.get(r["status"])
        title = f"<h3>{e(heading)}" + (f' <span class="mark">({e(mark)})</span>' if mark else "") + "</h3>"
        out.append(f'<{tag} class="msg {e(cls)}">' + (f"<summary>{title}</summary>" if tag == "details" else title)
                   + (f'<blockquote class="asked">Answering: {e(asked)}</blockquote>' if asked is not None else "")
                   + (f'<div class="text">{to_html(r["content"])}</div>' if r["content"] or not r["error"] else ""))
        if r["error"]:
            out.append(f'<p class="error">Error: {e(r["error"])}</p>')
        line = stats_line(r["stats"], r["origins"])
        if line:
            out.append(f'<p class="stats">{e(line)}</p>')
        for version_title, prompt, v in others:  # regenerated or edited away, kept: folded under the shown one
            reply("version", version_title, v, "details", prompt)
        out.append(f"</{tag}>")

    asked = None
    for m in doc["messages"]:
        suffix, others = _versions(m, asked)
        reply(m["role"], m["role"].capitalize() + suffix, m, others=others)
        asked = m["content"] if m["role"] == "user" else asked
    for i, c in enumerate(doc["comparisons"], 1):
        mark = _STATUS_MARK.get(c["status"])
        out.append(f"<h2>Comparison {i}" + (f' <span class="mark">({e(mark)})</span>' if mark else "") + "</h2>")
        out.append(f'<p class="meta">{e(c["model"] or "model ?")} · {e(_when(c["created_at"]))}</p>')
        if c["settings"]:
            out.append(f'<p class="meta">{e(_settings(c["settings"]))}</p>')
        if c["messages"]:
            last = {"content": str(c["messages"][-1].get("content", "")), "status": "complete",
                    "error": None, "stats": None, "origins": None}
            reply("user", "Request", last)
        header, rows, notes = ABReport.from_document(c).table()
        if rows:
            out += ['<table class="ab">', "<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr></thead>",
                    "<tbody>", *("<tr>" + f"<th>{e(r[0])}</th>" + "".join(f"<td>{e(x)}</td>" for x in r[1:]) + "</tr>"
                                 for r in rows), "</tbody>", "</table>"]
        if notes:
            out += ['<ul class="notes">', *(f"<li>{e(n)}</li>" for n in notes), "</ul>"]
    out += ["</main>", "</body>", "</html>", ""]
    return "\n".join(out)
