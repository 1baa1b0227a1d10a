"""The result of an own-copy-rates A/B, as one report behind the comparison pane, ``lanes compare``
and transcripts: the same table, the same numbers, the same sentence and the same JSON everywhere.

Pure (no MLX, no Qt): runs in, as engine/service/compare.py runs them, as the store saves them
(``comparisons.report_of``) or as a transcript document holds them (``ABReport.from_document``);
the report out. A run's speed is its statistics' ``tokens_per_s`` (else generated / seconds); a
side's median and spread are over its complete runs that have one.

Worked example: off ran twice, on once and was stopped in round 2::

    >>> def done(side, repeat, rate):
    ...     return Run(side, repeat, 0, "complete", "x", (1, 2), stats={"tokens_per_s": rate})
    >>> report = ABReport.of([done("off", 0, 40.0), done("on", 0, 46.0), Run("on", 1, 0, "cancelled"),
    ...                       done("off", 1, 41.0)])
    >>> print(report.markdown(), end="")
    | side | round 1 | round 2 | median | spread |
    |---|---|---|---|---|
    | off | 40.0 | 41.0 | 40.5 | 2.5% |
    | on | 46.0 | cancelled | 46.0 | 0.0% |
    <BLANKLINE>
    - on / off: 1.14x (median tok/s)
    - all 3 complete runs token-equal
    - off rows: none tested
    - on rows: none tested
    >>> report.verdict()
    'Same text; own copy rates on was 1.14x as fast as off, more than the runs varied (up to 2%).'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.store.records import unpack_origins

SIDES: tuple[str, ...] = ("off", "on", "plain")  # in table order; plain: no drafts (the store's CHECK too)
MAX_PLANNED = 1000  # rounds a comparison's settings may plan beyond those run (an imported file may say anything)
Table = tuple[list[str], list[list[str]], list[str]]  # header, rows, notes


@dataclass
class Run:
    """One side's answer in one repeat."""

    side: str
    repeat: int
    position: int  # 0: ran first in its repeat
    status: str = "partial"  # complete / cancelled / error, like a message
    text: str = ""
    tokens: tuple[int, ...] | None = ()  # None: not saved (then token equality is unknown)
    origins: tuple[str, ...] = ()
    stats: dict[str, Any] | None = None  # as a chat reply's: engine.service.session.stats_dict
    error: str | None = None
    copy_history_after: Mapping[str, Any] | None = None
    rates: list[dict[str, Any]] = field(default_factory=list)  # per round with a window: the source's rate

    @property
    def tok_s(self) -> float | None:
        """Its speed; None where the statistics lack one (an imported comparison may hold anything)."""
        stats = self.stats if isinstance(self.stats, Mapping) else {}
        rate = _number(stats.get("tokens_per_s"))
        if rate is None:
            generated, seconds = _number(stats.get("generated")), _number(stats.get("seconds"))
            rate = generated / seconds if generated is not None and seconds else None
        return rate

    @property
    def where(self) -> str:
        return f"{self.side} round {self.repeat + 1}"


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


@dataclass(frozen=True)
class Difference:
    """Where two runs' tokens first differ (``position`` is 0-based; a missing token is None)."""

    side: str
    repeat: int
    position: int
    expected: int | None
    got: int | None


def first_difference(runs: Sequence[Run]) -> Difference | None:
    """The first token where a complete run differs from the first complete run; None if all are
    equal or it cannot be told (fewer than two complete runs, or token ids not saved)."""
    done = [r for r in runs if r.status == "complete"]
    if len(done) < 2 or any(r.tokens is None for r in done):
        return None
    ref = done[0].tokens or ()
    for run in done[1:]:
        toks = run.tokens or ()
        if toks == ref:
            continue
        n = next((i for i, (a, b) in enumerate(zip(ref, toks)) if a != b), min(len(ref), len(toks)))
        return Difference(run.side, run.repeat, n, ref[n] if n < len(ref) else None, toks[n] if n < len(toks) else None)
    return None


@dataclass(frozen=True)
class SideSummary:
    side: str
    tok_s: tuple[float, ...]  # of its complete runs that have a speed, in repeat order
    by_repeat: Mapping[int, float]  # the same, keyed by repeat (a failed repeat has none)
    median: float  # 0 when it has no speed
    spread: float  # (max - min) / median
    rows: Mapping[str, Mapping[str, int]]  # by source: tested, accepted, wasted (tested - accepted), granted


def summarise(runs: Sequence[Run], sides: Sequence[str]) -> list[SideSummary]:
    out = []
    for side in sides:
        done = sorted((r for r in runs if r.side == side and r.status == "complete"), key=lambda r: r.repeat)
        by_repeat = {r.repeat: rate for r in done if (rate := r.tok_s) is not None}
        speeds = tuple(by_repeat.values())
        med = statistics.median(speeds) if speeds else 0.0
        spread = (max(speeds) - min(speeds)) / med if speeds and med > 0 else 0.0
        rows: dict[str, dict[str, int]] = {}
        for r in done:
            by_source = (r.stats or {}).get("rows")
            for source, c in (by_source.items() if isinstance(by_source, Mapping) else ()):
                c = c if isinstance(c, Mapping) else {}
                acc = rows.setdefault(str(source), {"tested": 0, "accepted": 0, "wasted": 0, "granted": 0})
                for key in ("tested", "accepted", "granted"):
                    acc[key] += int(_number(c.get(key)) or 0)
                acc["wasted"] = acc["tested"] - acc["accepted"]
        out.append(SideSummary(side, speeds, by_repeat, med, spread, rows))
    return out


def verdict(summaries: Sequence[SideSummary], same_text: bool | None, unknown: str = "Not enough runs yet") -> str:
    """The comparison in one sentence a reader understands, warning when the runs varied more than
    the sides differ (then the ratio says little); ``unknown`` leads when ``same_text`` is None.

    Worked example: off at median 50 tok/s (spread 10%), on at 65 (spread 20%), the same text: "Same
    text; own copy rates on was 1.30x as fast as off, more than the runs varied (up to 20%)." With
    on at 52 instead: "... 1.04x as fast as off, within how much the runs varied (up to 20%): run
    more repeats before trusting the difference."
    """
    by = {s.side: s for s in summaries}
    off, on = by.get("off"), by.get("on")
    text = "Same text" if same_text else "The texts differ" if same_text is False else unknown
    if off is None or on is None or off.median <= 0 or not on.tok_s:
        return text + "."
    ratio = on.median / off.median
    noise = max(off.spread, on.spread)
    speed = f"own copy rates on was {ratio:.2f}x as fast as off"
    if abs(ratio - 1) > noise:
        return f"{text}; {speed}, more than the runs varied (up to {noise:.0%})."
    return (f"{text}; {speed}, within how much the runs varied (up to {noise:.0%}): run more repeats "
            "before trusting the difference.")


def _token(t: int | None) -> str:
    return "the end" if t is None else str(t)


@dataclass(frozen=True)
class ABReport:
    """A comparison's runs with everything said about them; build it with ``of`` (or ``planned``,
    ``from_document``)."""

    runs: tuple[Run, ...]  # by repeat, then position: the order they ran
    sides: tuple[str, ...]
    repeats: int  # the table's rounds
    summaries: tuple[SideSummary, ...]  # one per side, in ``sides`` order
    difference: Difference | None
    token_equal: bool | None  # None: fewer than two complete runs, or token ids not saved

    @classmethod
    def of(cls, runs: Iterable[Run], sides: Sequence[str] | None = None, repeats: int | None = None) -> ABReport:
        """The report of ``runs``: a row for each of ``sides`` (default: those that ran) and any other side
        that ran, a column for each of ``repeats`` rounds (at least those that ran)."""
        ordered = tuple(sorted(runs, key=lambda r: (r.repeat, r.position)))
        present = list(dict.fromkeys(r.side for r in ordered))
        base = list(dict.fromkeys(sides)) if sides else [s for s in SIDES if s in present]
        all_sides = (*base, *sorted(set(present).difference(base)))
        rounds = max(max((r.repeat + 1 for r in ordered), default=0), repeats or 0)
        done = [r for r in ordered if r.status == "complete"]
        diff = first_difference(ordered)
        known = len(done) >= 2 and all(r.tokens is not None for r in done)
        return cls(ordered, all_sides, rounds, tuple(summarise(ordered, all_sides)), diff,
                   (diff is None) if known else None)

    @classmethod
    def planned(cls, runs: Iterable[Run], settings: Mapping[str, Any] | None) -> ABReport:
        """The report of a saved comparison: with the sides and rounds its settings planned (so a
        stopped one shows the rounds it did not reach), where those settings make sense."""
        s = settings if isinstance(settings, Mapping) else {}
        sides, repeats = s.get("sides"), s.get("repeats")
        named = [x for x in sides if x in SIDES] if isinstance(sides, list | tuple) else []
        ok = isinstance(repeats, int) and not isinstance(repeats, bool) and 1 <= repeats <= MAX_PLANNED
        return cls.of(runs, named or None, repeats if ok else None)

    @classmethod
    def from_document(cls, comparison: Mapping[str, Any]) -> ABReport:
        """The report of one of a transcript's comparisons (``transcript.conversation_to_json``)."""
        runs = [Run(r["side"], r["repeat"], r["position"], r["status"], r["content"] or "",
                    None if r["tokens"] is None else tuple(r["tokens"]), unpack_origins(r["origins"]) or (),
                    dict(r["stats"]) if isinstance(r["stats"], Mapping) else None, r["error"],
                    r["copy_history_after"], list(r["rates"] or ()))
                for r in comparison["runs"]]
        return cls.planned(runs, comparison.get("settings"))

    def ratios(self) -> dict[str, float]:
        """Each side's median tok/s over off's (off's own is 1), for the sides that have a speed."""
        off = next((s for s in self.summaries if s.side == "off"), None)
        if off is None or not off.tok_s or off.median <= 0:
            return {}
        return {s.side: s.median / off.median for s in self.summaries if s.tok_s}

    def token_check(self) -> str:
        done = [r for r in self.runs if r.status == "complete"]
        if len(done) < 2:
            return "fewer than two complete runs: nothing to check tokens against"
        if self.token_equal is None:
            return "token ids not saved for every complete run: token equality unknown"
        d = self.difference
        if d is None:
            return f"all {len(done)} complete runs token-equal"
        return (f"tokens differ: {d.side} round {d.repeat + 1} has {_token(d.got)} at token {d.position} "
                f"where {done[0].where} has {_token(d.expected)}")

    def table(self) -> Table:
        """The A/B table as (header, rows, notes): tok/s per round, a run that did not complete showing
        its status, a missing one "–", a speed missing from its statistics "?"; then the median and
        spread; notes on the ratio, the tokens, the draft rows by source and each run's error."""
        header = ["side", *(f"round {i + 1}" for i in range(self.repeats)), "median", "spread"]
        by = {(r.side, r.repeat): r for r in self.runs}
        rows = []
        for s in self.summaries:
            cells = [s.side]
            for i in range(self.repeats):
                run = by.get((s.side, i))
                rate = None if run is None else run.tok_s
                cells.append("–" if run is None else run.status if run.status != "complete"
                             else "?" if rate is None else f"{rate:.1f}")
            rows.append(cells + ([f"{s.median:.1f}", f"{s.spread:.1%}"] if s.tok_s else ["–", "–"]))
        if not self.runs:
            return header, rows, ["no runs"]
        notes = [f"{side} / off: {v:.2f}x (median tok/s)" for side, v in self.ratios().items() if side != "off"]
        notes.append(self.token_check())
        for s in self.summaries:
            tested = ", ".join(f"{src} {c['accepted']}/{c['tested']} accepted, {c['wasted']} wasted"
                               for src, c in s.rows.items() if c["tested"])
            notes.append(f"{s.side} rows: {tested or 'none tested'}")
        notes += [f"{r.where}: error: {r.error}" for r in self.runs if r.error]
        return header, rows, notes

    def markdown(self) -> str:
        """The table in Markdown, then its notes as a list."""
        header, rows, notes = self.table()
        lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|",
                 *("| " + " | ".join(r) + " |" for r in rows), ""] if rows else []
        return "\n".join([*lines, *(f"- {n}" for n in notes)]) + "\n"

    def verdict(self) -> str:
        done = sum(r.status == "complete" for r in self.runs)
        return verdict(self.summaries, self.token_equal, "Token ids not saved" if done >= 2 else "Not enough runs yet")

    def document(self, **head: Any) -> dict[str, Any]:
        """The comparison as JSON (``lanes compare --json`` and the pane's export): ``head`` (what ran,
        where), then the runs, each side's summary, the sentence and the token check."""
        return {**head, "runs": [asdict(r) for r in self.runs], "summary": [asdict(s) for s in self.summaries],
                "verdict": self.verdict(), "token_equal": self.token_equal,
                "first_difference": asdict(self.difference) if self.difference else None}
