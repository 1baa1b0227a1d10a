"""The A/B of own copy rates: one request answered with the flag off and on (and optionally with no
drafts), repeated with the order alternated, then summarised as the seed's A/B table.

Fair by construction: every run is a fresh stream (no conversation KV reuse, so no run inherits
another's prefill), starts from the same copy history (the conversation's stored one or the family
prior) and the same Recall (nothing a run produces is added to Recall), and runs one after another,
so no two runs share a round. Repeat r runs the sides in order when r is even and reversed when odd.

Worked example of the table (``ab_table``), tok/s by repeat::

    side   round 1  round 2  round 3  median
    off    40.1     39.8     40.4     40.1
    on     46.0     45.7     46.3     46.0
    on / off: 1.15x (median)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.drafts.copy_rates import DOUBT_PRIOR, CopyRates, first_key, rest_key
from engine.events import Event, Failed, Finished, Request, RoundStats

SIDES: tuple[str, ...] = ("off", "on", "plain")  # plain: no drafts at all


@dataclass(frozen=True)
class CompareSpec:
    messages: tuple[Mapping[str, str], ...]
    max_tokens: int = 256
    repeats: int = 3
    sides: tuple[str, ...] = ("off", "on")
    copy_history: Mapping[str, Mapping[str, float]] | None = None  # None: the family prior
    temperature: float = 0.0
    top_p: float = 1.0
    recall: bool = True  # Recall from other conversations, as the user's setting says
    exclude: str | None = None  # the conversation's own Recall document, skipped as a chat reply would

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        bad = [s for s in self.sides if s not in SIDES]
        if bad or not self.sides or len(set(self.sides)) != len(self.sides):
            raise ValueError(f"sides must be distinct names from {SIDES}, got {self.sides}")

    def order(self, repeat: int) -> tuple[str, ...]:
        """The sides in the order repeat ``repeat`` (0-based) runs them: alternating."""
        return self.sides if repeat % 2 == 0 else tuple(reversed(self.sides))

    def request(self, side: str) -> Request:
        return Request(
            messages=self.messages, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
            own_copy_rates=side == "on", drafts=side != "plain", copy_history=self.copy_history,
            conversation=None,  # no KV reuse between runs: each one prefills from scratch
            recall=self.recall, recall_exclude=self.exclude,
        )

    def settings(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "repeats": self.repeats, "sides": list(self.sides),
                "temperature": self.temperature, "top_p": self.top_p}


@dataclass
class Run:
    """One side's answer in one repeat."""

    side: str
    repeat: int
    position: int  # 0: ran first in its repeat
    status: str = "partial"  # complete / cancelled / error, like a message
    text: str = ""
    tokens: tuple[int, ...] = ()
    origins: tuple[str, ...] = ()
    stats: dict[str, Any] | None = None
    error: str | None = None
    copy_history_after: Mapping[str, Any] | None = None
    rates: list[dict[str, Any]] = field(default_factory=list)  # per round with a window: the source's rate

    @property
    def tok_s(self) -> float:
        """Its speed; 0 where the statistics lack one (an imported comparison may hold anything)."""
        return _number((self.stats or {}).get("tokens_per_s"))


def _number(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0


def rate_trajectory(start: Mapping[str, Mapping[str, float]] | None, prior: float,
                    rounds: Sequence[RoundStats], doubt_prior: float = DOUBT_PRIOR) -> list[dict[str, Any]]:
    """The copy rates after each window was verified, replayed from the run's round statistics: its
    first-row history's (``Window.rate_key``: "context.first", "context.short", "resync", ...) and the
    rate of its rows after the first (``rates.rest_key``: its source's, or a doubtful window's own).

    Each window is recorded as the engine did (``CopyRates.record_window``), so the rates are those the
    stream used next.
    """
    rates = CopyRates.from_snapshot(start, prior=prior, doubt_prior=doubt_prior)
    out = []
    first = rounds[0].round if rounds else 0
    for rs in rounds:
        if rs.source is None or rs.draft_rows == 0:
            continue
        key = rs.rate_key or first_key(rs.source)
        rates.record_window(rs.source, rs.draft_rows, min(rs.accepted, rs.draft_rows), key)
        n = rs.round - first + 1  # from the run's own start: the engine counts rounds across the session
        out.append({"round": n, "source": key, "rate": round(rates.rate(key), 4)})
        rest = round(rates.rest_rate(rs.source, key), 4)
        out.append({"round": n, "source": rest_key(rs.source, key), "rate": rest})
    return out


def run_one(submit: Callable[[Request], Any], spec: CompareSpec, side: str, repeat: int, position: int,
            prior: float, on_event: Callable[[Run, Event], None] | None = None,
            cancelled: Callable[[], bool] = lambda: False, doubt_prior: float = DOUBT_PRIOR) -> Run:
    """Run one side to its end through ``submit`` (``Engine.submit``), blocking this thread."""
    run = Run(side, repeat, position)
    handle = submit(spec.request(side))
    rounds: list[RoundStats] = []
    for ev in handle:
        if cancelled():
            handle.cancel()
        if isinstance(ev, RoundStats):
            rounds.append(ev)
        elif isinstance(ev, Finished):
            run.status = "cancelled" if ev.reason == "cancelled" else "complete"
            run.text, run.tokens, run.origins = ev.text, ev.tokens, tuple(ev.origins)
            run.stats = {"reason": ev.reason, **ev.stats.as_dict()}
            run.copy_history_after = ev.copy_history
        elif isinstance(ev, Failed):
            run.status, run.error, run.text = "error", ev.message, ev.text
            run.copy_history_after = ev.copy_history
        if on_event is not None:
            on_event(run, ev)
    if side == "on":
        run.rates = rate_trajectory(spec.copy_history, prior, rounds, doubt_prior)
    return run


def run_comparison(submit: Callable[[Request], Any], spec: CompareSpec, prior: float,
                   on_event: Callable[[Run, Event], None] | None = None,
                   on_run: Callable[[Run], None] | None = None,
                   cancelled: Callable[[], bool] = lambda: False, doubt_prior: float = DOUBT_PRIOR) -> list[Run]:
    """Every repeat of every side, one run at a time, order alternated; stops early when cancelled."""
    runs: list[Run] = []
    for r in range(spec.repeats):
        for position, side in enumerate(spec.order(r)):
            if cancelled():
                return runs
            run = run_one(submit, spec, side, r, position, prior, on_event, cancelled, doubt_prior)
            runs.append(run)
            if on_run is not None:
                on_run(run)
    return runs


# -- results -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """Where two runs' tokens first differ (``position`` is 0-based; a missing token is None)."""

    side: str
    repeat: int
    position: int
    expected: int | None
    got: int | None


def first_difference(runs: Sequence[Run]) -> Difference | None:
    """The first token where any finished run differs from the first finished run; None if all equal."""
    done = [r for r in runs if r.status == "complete"]
    if len(done) < 2:
        return None
    ref = done[0].tokens
    for run in done[1:]:
        if run.tokens == ref:
            continue
        n = next((i for i, (a, b) in enumerate(zip(ref, run.tokens)) if a != b), min(len(ref), len(run.tokens)))
        return Difference(run.side, run.repeat, n, ref[n] if n < len(ref) else None,
                          run.tokens[n] if n < len(run.tokens) else None)
    return None


@dataclass(frozen=True)
class SideSummary:
    side: str
    tok_s: tuple[float, ...]  # of its complete runs, in repeat order
    by_repeat: Mapping[int, float]  # the same, keyed by repeat (a failed repeat has none)
    median: float
    spread: float  # (max - min) / median
    rows: Mapping[str, Mapping[str, int]]  # by source: tested, accepted, wasted (tested - accepted), granted


def summarise(runs: Sequence[Run], sides: Sequence[str]) -> list[SideSummary]:
    out = []
    for side in sides:
        done = sorted((r for r in runs if r.side == side and r.status == "complete"), key=lambda r: r.repeat)
        speeds = tuple(r.tok_s for r in done)
        by_repeat = {r.repeat: r.tok_s for r in done}
        med = statistics.median(speeds) if speeds else 0.0
        spread = (max(speeds) - min(speeds)) / med if speeds and med > 0 else 0.0
        rows: dict[str, dict[str, int]] = {}
        for r in done:
            by_source = (r.stats or {}).get("rows")
            for source, c in (by_source.items() if isinstance(by_source, Mapping) else ()):
                c = c if isinstance(c, Mapping) else {}
                acc = rows.setdefault(str(source), {"tested": 0, "accepted": 0, "wasted": 0, "granted": 0})
                for key in ("tested", "accepted", "granted"):
                    acc[key] += int(_number(c.get(key)))
                acc["wasted"] = acc["tested"] - acc["accepted"]
        out.append(SideSummary(side, speeds, by_repeat, med, spread, rows))
    return out


def verdict(summaries: Sequence[SideSummary], same_text: bool | None) -> str:
    """The comparison in one sentence a reader understands, warning when the runs varied more than
    the sides differ (then the ratio says little).

    Worked example: off at median 50 tok/s (spread 10%), on at 65 (spread 20%), the same text: "Same
    text; own copy rates on was 1.30x as fast as off, more than the runs varied (up to 20%)." With
    on at 52 instead: "... 1.04x as fast as off, within how much the runs varied (up to 20%): run
    more repeats before trusting the difference."
    """
    by = {s.side: s for s in summaries}
    off, on = by.get("off"), by.get("on")
    text = "Same text" if same_text else "The texts differ" if same_text is False else "Not enough runs yet"
    if off is None or on is None or off.median <= 0 or not on.tok_s:
        return text + "."
    ratio = on.median / off.median
    noise = max(off.spread, on.spread)
    speed = f"own copy rates on was {ratio:.2f}x as fast as off"
    if abs(ratio - 1) > noise:
        return f"{text}; {speed}, more than the runs varied (up to {noise:.0%})."
    return (f"{text}; {speed}, within how much the runs varied (up to {noise:.0%}): run more repeats "
            "before trusting the difference.")


def ab_table(runs: Sequence[Run], sides: Sequence[str], repeats: int) -> str:
    """The seed's A/B table in Markdown: tok/s by round (repeat), the median, the ratio, equality."""
    summaries = summarise(runs, sides)
    head = "| side | " + " | ".join(f"round {i + 1}" for i in range(repeats)) + " | median | spread |"
    lines = [head, "|---" * (repeats + 3) + "|"]
    for s in summaries:
        cells = [f"{s.by_repeat[i]:.1f}" if i in s.by_repeat else "–" for i in range(repeats)]
        lines.append(f"| {s.side} | " + " | ".join(cells) + f" | {s.median:.1f} | {s.spread:.1%} |")
    by = {s.side: s for s in summaries}
    notes = []
    if "on" in by and "off" in by and by["off"].median > 0:
        notes.append(f"on / off: {by['on'].median / by['off'].median:.2f}x (median tok/s)")
    diff = first_difference(runs)
    notes.append("every run token-equal" if diff is None else
                 f"tokens differ: {diff.side} repeat {diff.repeat + 1} at token {diff.position} "
                 f"({diff.got} where the first run has {diff.expected})")
    for s in summaries:
        rows = ", ".join(f"{src} {c['accepted']}/{c['tested']} accepted, {c['wasted']} wasted"
                         for src, c in s.rows.items() if c["tested"])
        notes.append(f"{s.side} rows: {rows or 'none tested'}")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
