"""The comparison pane's parts: reports of a saved comparison, and one column per side whose text
can show the first differing token highlighted (used by ``app/compare_pane.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.message_view import MessageView
from app.theme import is_dark
from engine.service.comparisons import comparison_document, report_of
from engine.service.spans import origin_spans
from engine.store.ab_report import Run
from engine.store.records import Comparison

SIDE_TITLES = {"off": "Own copy rates off", "on": "Own copy rates on", "plain": "Plain (no drafts)"}
DIFF_ORIGIN = "differs"  # the span origin of the first differing token (the theme has no tint for it)
DIFF_TINTS = ("#ffd54f", "#8a6100")  # amber (light, dark), drawn by DiffView itself
END_MARK = "⟂"  # stands for "this run ended here" when the other run has a token there
Spans = list[tuple[str, str]]
Decode = Callable[[list[int]], str]


# -- reports ---------------------------------------------------------------------------------------
def markdown_report(c: Comparison) -> str:
    """The comparison's A/B table (the one ``lanes compare`` prints and transcripts hold), under a line
    saying what ran and over its verdict."""
    s, report = c.settings, report_of(c)
    head = (f"# Own copy rates A/B (comparison {c.id})\n\n{c.model}, {len(c.messages)} turn(s), up to "
            f"{s.get('max_tokens', '?')} tokens, greedy, {report.repeats} alternated rounds, {c.status}; "
            "tok/s by round:\n\n")
    return head + report.markdown() + "\n" + report.verdict() + "\n"


def json_report(c: Comparison) -> str:
    """The comparison's JSON document, the shape ``lanes compare --json`` writes."""
    return json.dumps(comparison_document(c), indent=1, default=dict) + "\n"


def run_spans(decode: Decode, run: Run) -> Spans:
    """A finished run's text by origin (one model run when the tokens cannot be decoded)."""
    return [s for s in origin_spans(decode, list(run.tokens or ()), list(run.origins), run.text) if s[0]]


def marked_spans(decode: Decode, run: Run, position: int) -> tuple[Spans, int, int] | None:
    """``run``'s text with the token at ``position`` as its own ``differs`` span: the spans and that
    span's start and length in UTF-16 units. None when the tokens cannot be decoded."""
    toks, origs = list(run.tokens or ()), list(run.origins)
    if run.text and not decode(toks):
        return None  # no tokenizer yet

    def part(a: int, b: int) -> Spans:
        return [s for s in origin_spans(decode, toks[a:b], origs[a:b], decode(toks[a:b])) if s[0]]

    before, after = part(0, position), part(position + 1, len(toks))
    marked = (decode(toks[position:position + 1]) if position < len(toks) else "") or END_MARK
    start = sum(_utf16(p) for p, _ in before)
    return [*before, (marked, DIFF_ORIGIN), *after], start, _utf16(marked)


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def run_lines(runs: Sequence[Run]) -> list[str]:
    out = []
    for r in sorted(runs, key=lambda r: r.repeat):
        n = (r.stats or {}).get("generated", len(r.tokens or ()))
        if r.status == "complete":
            speed = "no speed saved" if r.tok_s is None else f"{r.tok_s:.1f} tok/s"
            out.append(f"repeat {r.repeat + 1}: {speed}, {n} tokens")
        elif r.status == "cancelled":
            out.append(f"repeat {r.repeat + 1}: stopped after {n} tokens")
        else:
            out.append(f"repeat {r.repeat + 1}: error: {r.error or r.status}")
    return out


# -- one column ------------------------------------------------------------------------------------
class DiffView(MessageView):
    """A MessageView that can tint one span of its text: the first differing token."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.highlight: tuple[int, int] | None = None  # (start, length) in UTF-16 units

    def show_spans(self, spans: Spans, highlight: tuple[int, int] | None = None) -> None:
        self.highlight = highlight
        self.set_spans(spans)
        self._tint()

    def highlighted_text(self) -> str:
        if self.highlight is None:
            return ""
        start, length = self.highlight
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        cursor.setPosition(start + length, QTextCursor.MoveMode.KeepAnchor)
        return cursor.selectedText()

    def _tint(self) -> None:
        if self.highlight is None:
            return
        start, length = self.highlight
        end = self.document().characterCount() - 1
        cursor = QTextCursor(self.document())
        cursor.setPosition(min(start, end))
        cursor.setPosition(min(start + length, end), QTextCursor.MoveMode.KeepAnchor)
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(DIFF_TINTS[is_dark(self)]))
        fmt.setFontUnderline(True)
        fmt.setToolTip("The first token where the runs differ")
        cursor.mergeCharFormat(fmt)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if getattr(self, "highlight", None) is not None:
            self._tint()  # a palette change re-renders the text


@dataclass
class LiveRun:
    """A run streaming now, as its column shows it."""

    repeat: int
    started: float = field(default_factory=time.monotonic)
    tokens: int = 0
    spans: Spans = field(default_factory=list)
    state: str = "streaming"
    rounds: list[Any] = field(default_factory=list)  # RoundStats, for the "on" side's live rate chart

    def add(self, pieces: Spans) -> None:
        for piece, origin in pieces:
            if self.spans and self.spans[-1][1] == origin:
                self.spans[-1] = (self.spans[-1][0] + piece, origin)
            elif piece:
                self.spans.append((piece, origin))


class SideColumn(QFrame):
    """One side: its name and tok/s, the run shown (live while it streams), its results per repeat."""

    def __init__(self, side: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.side = side
        title = SIDE_TITLES.get(side, side)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName(f"{title} column")
        self.title = QLabel(title)
        self.title.setStyleSheet("font-weight: 600;")
        self.title.setAccessibleName(f"{title}: side")
        self.speed = QLabel("–")
        self.speed.setAccessibleName(f"{title}: tokens per second")
        self.showing = QLabel("")
        self.showing.setAccessibleName(f"{title}: run shown")
        self.view = DiffView()
        self.view.setAccessibleName(f"{title}: text")
        self.stats = QLabel("")
        self.stats.setWordWrap(True)
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats.setAccessibleName(f"{title}: results")
        inner = QWidget()
        box = QVBoxLayout(inner)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self.view)
        box.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(inner)
        scroll.setAccessibleName(f"{title}: text area")
        head = QHBoxLayout()
        head.addWidget(self.title)
        head.addStretch(1)
        head.addWidget(self.speed)
        col = QVBoxLayout(self)
        col.addLayout(head)
        col.addWidget(self.showing)
        col.addWidget(scroll, 1)
        col.addWidget(self.stats)

    def set_results(self, runs: Sequence[Run]) -> None:
        lines = run_lines(runs)
        self.stats.setText("\n".join(lines))
        failed = any(r.status == "error" for r in runs)
        self.stats.setStyleSheet("color: #c62828;" if failed else "")


# -- the pane --------------------------------------------------------------------------------------


def past_label(c: Comparison) -> str:
    report = report_of(c)
    on = report.ratios().get("on")
    ratio = f" · on/off {on:.2f}×" if on is not None else ""
    equal = {None: "", True: " · token-equal", False: " · tokens differ"}[report.token_equal]
    prompt = str(c.messages[-1].get("content", "")) if c.messages else ""
    prompt = " ".join(prompt.split())
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.created_at))
    return f"#{c.id} · {when} · {prompt[:40]}{'…' if len(prompt) > 40 else ''}{ratio}{equal} · {c.status}"
