"""The A/B of own copy rates: one request answered with the flag off and on (and optionally with no
drafts), repeated with the order alternated; engine/store/ab_report.py reports the runs (the A/B
table, the verdict, the JSON).

Fair by construction: every run is a fresh stream (no conversation KV reuse, so no run inherits
another's prefill), starts from the same copy history (the conversation's stored one or the family
prior) and the same Recall (nothing a run produces is added to Recall), and runs one after another,
so no two runs share a round. Repeat r runs the sides in order when r is even and reversed when odd.
Each run's statistics are those a chat reply stores (``session.stats_dict``), its side's flag included.

Worked example: ``CompareSpec(messages, repeats=3)`` runs off then on, on then off, off then on (six
fresh streams); ``ABReport.of(runs).markdown()`` then gives, tok/s by round::

    | side | round 1 | round 2 | round 3 | median | spread |
    |---|---|---|---|---|---|
    | off | 40.1 | 39.8 | 40.4 | 40.1 | 1.5% |
    | on | 46.0 | 45.7 | 46.3 | 46.0 | 1.3% |
    - on / off: 1.15x (median tok/s)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.drafts.copy_rates import DOUBT_PRIOR, CopyRates, first_key, rest_key
from engine.events import Event, Failed, Finished, Request, RoundStats
from engine.service.session import ReplySettings, stats_dict
from engine.store.ab_report import SIDES, Run


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

    def reply_settings(self, side: str) -> ReplySettings:
        """The settings a chat reply with this side's flag would have (stored in its statistics)."""
        return ReplySettings(self.max_tokens, self.temperature, self.top_p, own_copy_rates=side == "on")

    def settings(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "repeats": self.repeats, "sides": list(self.sides),
                "temperature": self.temperature, "top_p": self.top_p}


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
            run.stats = stats_dict(ev.stats, ev.reason, spec.reply_settings(side), spec.copy_history)
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
