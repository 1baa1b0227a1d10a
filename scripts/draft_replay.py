"""What the draft policy copies of replies already written: a bench result's reference tokens replayed
through a stream's proposer, copy rates and allocator, with no forward pass (the tokens are known),
so a policy question costs no device time.

    .venv/bin/python scripts/draft_replay.py docs/bench/gpu-alone-1-copy-heavy.json [--stream ID] [--ahead]
        [--kept-ms MS] [--probes wait|drop|after-copy] [--together]
        [--round-ms ahead=A,sync=S,draft=D,dropped=P] [--cell on:doubt_prior=0.6]

Per stream it prints the rounds, the tokens that came from copies, and per kind of window (its
rate key): how often it was drafted, and how often it was priced out though its first row would
have landed. Modelled: each stream alone (batch 1), or with ``--together`` all of them in shared rounds
as the result's run had them (a round drafts when any stream does), greedy verification against the
reference (exact for a sampled result too: a copy lands when it equals the token drawn there),
the cost model the result was calibrated with, own copy rates as the stream's request sets them,
and with ``--ahead`` an accelerator's rounds: every draft-free round's successor runs ahead, so a
round that drafts after one drops a pass (priced as ``CostModel.cost(batch, 1)``; ``--kept-ms`` is
what a round run ahead takes, by default that cost too) and probes wait, as the allocator does
(``--probes drop`` lets them go anyway, ``after-copy`` once the reply has landed a copy: what
either would copy), and a drafting round's successor runs ahead with the copies' continuations
(``--no-continue``: it does not), and starts the windows granted no rows that pay
(``--no-starts``: it does not), a lone stream that has copied one row of those due a probe
(``--no-probe-starts``: it does not). Not modelled: Recall, the cost model's updates from timings,
streams joining at different times. ``--cell`` replays a ``lanes bench`` cell's copy pricing instead
of ``on``'s: ``off`` (the fixed rate) or family settings (``on:doubt_prior=0.6``;
``engine/bench/cell_specs.py``).

With ``--ahead`` each replayed round also gets the kind ``scripts/round_trace.py`` sorts real rounds
into: ``ahead`` (draft-free, its pass run ahead), ``continued`` (run ahead with a copy's
continuation or a start: wider and masked), ``sync`` (draft-free after a drafting round, so not run
ahead), ``draft`` and ``dropped`` (drafting, and dropping a pass run ahead). Rounds alone mislead
on an accelerator, where the last three cost about twice the first: ``--round-ms`` takes a trace's
median milliseconds per kind and prints the run's modelled time, so a policy can be judged by time
before it costs device time (``continued`` priced as ``ahead`` unless given: traces before
2026-12-07 counted those rounds as ``ahead``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from engine.bench.cell_specs import ENGINE_SETTINGS, Cell, parse_cell
from engine.bench.runner import prompts_for
from engine.bench.workloads import load_workload
from engine.drafts.allocator import Offer, allocate
from engine.drafts.cost_model import CostModel
from engine.errors import LanesError
from engine.events import Request
from engine.model.families import Family
from engine.model.loading import load_model
from engine.rounds.run_ahead import agreeing, continuations, priced_starts, starts_a_probe, widened
from engine.rounds.stream import Stream


@dataclass
class Replay:
    """One stream's replay."""

    stream: str
    tokens: int
    rounds: int = 0
    copied: int = 0
    kinds: Counter[str] = field(default_factory=Counter)  # "drafted K", "priced out K", "would land K"


@dataclass
class Run:
    """Streams replayed in shared rounds (one stream: alone)."""

    streams: list[Replay]
    round_kinds: Counter[str] = field(default_factory=Counter)  # with ahead: round_trace's kinds

    def seconds(self, round_ms: dict[str, float]) -> float:
        """The run's time, each round priced at ``round_ms`` of its kind."""
        return sum(n * round_ms[kind] for kind, n in self.round_kinds.items()) / 1e3


def replay(prompts: list[list[int]], references: list[list[int]], family: Family, tokenizer: Any,
           costs: CostModel, ahead: bool, kept: float | None = None, probes: str = "wait",
           ids: list[str] | None = None, cont: bool = True, starts: bool = True,
           own_copy_rates: bool | None = None, probe_starts: bool = True) -> Run:
    """Replay ``references`` (replies to ``prompts``) in shared rounds, as a run of that many streams
    does; see the module docstring. ``kept``: what a round run ahead takes (default the cost model's
    draft-free pass at the round's batch). ``cont``: with ``ahead``, a drafting round's successor runs
    ahead with the copies' continuations (``engine.rounds.run_ahead.continue_copies``); ``starts``:
    a round run ahead also starts the windows granted no rows that pay (``run_ahead.starts``),
    and with ``probe_starts`` one row of those due a probe; ``own_copy_rates``: the request's
    setting (None: the family's)."""
    streams = [Stream.start(Request(prompt_tokens=tuple(p), max_tokens=len(ref) + 1,
                                          own_copy_rates=own_copy_rates), list(p), family, tokenizer)
               for p, ref in zip(prompts, references, strict=True)]
    run = Run([Replay(sid, len(ref)) for sid, ref in zip(ids or [""] * len(streams), references, strict=True)])
    active = [i for i, ref in enumerate(references) if ref]
    pending = False  # a pass run ahead is on the device
    continued: dict[int, list[int]] | None = None  # a round run ahead after a drafting one: its drafts
    while active:
        batch = len(active)
        windows, offers, probing = [], [], []
        probing_start: dict[int, bool] = {}
        for j, i in enumerate(active):
            s = streams[i]
            s.rates.tick()
            w = s.propose(None, None)
            windows.append(w)
            if w is not None:
                probe = s.own_rates and s.rates.probe_due(w.rate_key)
                probing_start[j] = starts_a_probe(s, w, batch)  # if granted no rows: run_ahead.starts
                rate, first = s.price(w)
                offers.append(Offer(j, rate, min(len(w.tokens), family.max_window), probe, first))
                if probe and (probes == "drop" or (probes == "after-copy" and run.streams[i].copied > 0)):
                    probing.append(j)
        rows = [0] * batch
        priced = {o.stream: o for o in offers}  # a start is offered at this round's price of its window
        if continued is not None:  # it verifies the continuations, as the window proposed now where they agree
            rows = [len(continued.get(i, [])) for i in active]
            windows = agreeing(windows, [continued.get(i, []) for i in active])
            offers, probing = [], []
        if offers:
            rows = list(allocate(offers, batch, partial(costs.cost, keys=0), costs.overhead,
                                 min_row_value=family.min_row_value,
                                 keep_seconds=(kept or costs.cost(batch, 1)) if ahead else None,
                                 dropping=costs.cost(batch, 1) if pending else 0.0).rows)
        for j in probing:  # the probe's one row, as the allocator gives it with nothing to drop
            rows[j] = max(rows[j], 1)
        for j, i in enumerate(active):
            s, out, w, reference = streams[i], run.streams[i], windows[j], references[i]
            pos = len(s.output)
            drafts = continued.get(i, []) if continued is not None else list(w.tokens[: rows[j]]) if w is not None else []
            accepted = 0
            while (accepted < len(drafts) and pos + accepted < len(reference)
                   and drafts[accepted] == reference[pos + accepted]):
                accepted += 1
            if w is not None and rows[j]:
                s.record_window(w, rows[j], accepted)
                out.kinds[f"drafted {w.rate_key}"] += 1
            elif w is not None and continued is None:
                out.kinds[f"priced out {w.rate_key}"] += 1
                out.kinds[f"would land {w.rate_key}"] += pos < len(reference) and w.tokens[0] == reference[pos]
            nxt = reference[pos + accepted : pos + accepted + 1]  # none when the drafts reached the end
            s.accept([*drafts[:accepted], *nxt], [*(["context"] * accepted), *(["model"] * len(nxt))])
            out.rounds += 1
            out.copied += accepted
        if ahead:
            run.round_kinds["continued" if continued is not None else "ahead" if pending and not any(rows) else
                            ("dropped" if pending else "draft") if any(rows) else "sync"] += 1
        drafted = [list(w.tokens[:k]) if w is not None else [] for w, k in zip(windows, rows, strict=True)]
        tails: list[list[int]] = []
        if ahead and cont:
            tails = continuations(windows, drafted, family.max_window)
            this = [continued.get(i, []) for i in active] if continued is not None else drafted  # as the engine's r.drafts
            opening = [Offer(j, o.rate, len(tails[j]), probe_starts and probing_start[j],
                             first_rate=(o.rate if o.first_rate is None else o.first_rate) * o.rate)
                       for j, o in priced.items() if starts and tails[j] and not this[j]]
            tails = priced_starts(tails, this, opening, widened(costs, batch, kept or costs.cost(batch, 1)),
                                  family.max_window + 1, family.min_row_value)
        continued = dict(zip(active, tails, strict=True)) if any(tails) else None
        pending = ahead and not any(rows)
        active = [i for i in active if len(streams[i].output) < len(references[i])]
    return run


ROUND_KINDS = ("ahead", "continued", "sync", "draft", "dropped")


def _round_ms(text: str) -> dict[str, float]:
    """``ahead=5.9,sync=14.3,draft=10.3,dropped=12.4`` -> milliseconds by round kind: all four, and
    ``continued`` (a round run ahead with draft rows), which costs what ``ahead`` does unless given.

    >>> _round_ms("ahead=5,sync=14,draft=10,dropped=12")["continued"]
    5.0
    >>> _round_ms("ahead=5,continued=9,sync=14,draft=10,dropped=12")["continued"]
    9.0
    """
    try:
        out = {k.strip(): float(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: want kind=ms pairs, e.g. ahead=5.9,sync=14.3,...") from exc
    if not set(ROUND_KINDS) - {"continued"} <= set(out) <= set(ROUND_KINDS):
        raise argparse.ArgumentTypeError(f"{text!r}: give ms for each of {', '.join(ROUND_KINDS)} (continued may go)")
    return {"continued": out["ahead"], **out}


def _cell(text: str) -> Cell:
    try:
        cell = parse_cell(text)
    except LanesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not cell.drafts:
        raise argparse.ArgumentTypeError(f"{text!r}: replay a drafting cell (off or on)")
    if set(cell.settings) & set(ENGINE_SETTINGS):
        raise argparse.ArgumentTypeError(f"{text!r}: engine settings have flags of their own here (--no-starts, ...)")
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path, help="a `lanes bench --json` result")
    ap.add_argument("--stream", default=None, help="only this stream (a workload line's id)")
    ap.add_argument("--ahead", action="store_true", help="an accelerator's rounds (see the module docstring)")
    ap.add_argument("--kept-ms", type=float, default=None, help="what a round run ahead takes (module docstring)")
    ap.add_argument("--probes", choices=("wait", "drop", "after-copy"), default="wait",
                    help="with --ahead, whether a due probe may drop a pass run ahead")
    ap.add_argument("--no-starts", action="store_true",
                    help="with --ahead, no copy started in a round run ahead (start_copies=false)")
    ap.add_argument("--no-probe-starts", action="store_true",
                    help="with --ahead, no probe started in a round run ahead (probe_starts=false)")
    ap.add_argument("--no-continue", action="store_true",
                    help="with --ahead, no round run ahead after a drafting round (continue_copies=false)")
    ap.add_argument("--together", action="store_true",
                    help="the streams in shared rounds, as the result's run had them (default: each alone)")
    ap.add_argument("--round-ms", type=_round_ms, default=None,
                    help="with --ahead, milliseconds per round kind, e.g. ahead=5.9,sync=14.3,draft=10.3,dropped=12.4")
    ap.add_argument("--cell", type=_cell, default=parse_cell("on"),
                    help="the drafting cell replayed: off, on, or either with family settings (on:doubt_prior=0.6)")
    args = ap.parse_args()
    if args.round_ms is not None and not args.ahead:
        ap.error("--round-ms prices an accelerator's rounds: give --ahead too")
    result = json.loads(args.result.read_text())
    loaded = load_model(None)
    items = load_workload(Path(result["workload"]))
    prompts = dict(zip((it.id for it in items), prompts_for(loaded, items), strict=True))
    costs = CostModel.from_snapshot({k: v / 1e3 for k, v in result["costs_ms"].items()})
    kept = args.kept_ms / 1e3 if args.kept_ms is not None else None
    references = {s["id"]: s["tokens"] for cell in result["cells"].values() for r in cell["rounds"][:1]
                  for s in r["streams"] if s["equal"]}
    chosen = [(sid, ref) for sid, ref in references.items()
              if args.stream in (None, sid) and sid.split("#")[0] in prompts]
    groups = [chosen] if args.together else [[c] for c in chosen]
    for group in groups:
        r = replay([prompts[sid.split("#")[0]] for sid, _ in group], [ref for _, ref in group],
                   args.cell.with_settings(loaded.family), loaded.tokenizer, costs, args.ahead, kept, args.probes,
                   [sid for sid, _ in group], not args.no_continue, not args.no_starts, args.cell.own_copy_rates,
                   not args.no_probe_starts)
        for s in r.streams:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(s.kinds.items()))
            print(f"{s.stream}: {s.tokens} tokens in {s.rounds} rounds, {s.copied} copied; {kinds}")
        rounds = ", ".join(f"{k} {r.round_kinds[k]}" for k in ROUND_KINDS if r.round_kinds[k])
        if rounds:
            timed = f", ~{1e3 * r.seconds(args.round_ms):.0f} ms" if args.round_ms else ""
            print(f"  {'shared ' if len(group) > 1 else ''}rounds: {rounds}{timed}")


if __name__ == "__main__":
    main()
