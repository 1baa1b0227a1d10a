"""Brief matches (engine.rounds.stream, family.brief_match): copies found by fewer tokens than min_match,
offered only when nothing longer is, priced from a doubtful history of their own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.drafts.copy_index import Window
from engine.events import Request, RoundStats
from engine.model.families import DEFAULT
from engine.rounds.stream import Stream
from tests.test_edits import BAR, COMMA, DASH, NL, SBAR, Tokenizer, run_scripted

ON = replace(DEFAULT, own_copy_rates=True)  # brief matches are priced by their own history: flag on
STARTED = 6


def short_fields(rows: int) -> tuple[list[int], list[int]]:
    """A list whose fields are all two tokens ("- name, role, city, started month year") and the table
    written from it: no four tokens of a table row follow each other in the list, so a copy of the
    list never starts from a min_match (4) match."""
    prompt, table = [90, 91, 92], []
    for r in range(rows):
        name, role = [200 + 2 * r, 201 + 2 * r], [300 + 2 * r, 301 + 2 * r]
        city = [400, 401] if r % 2 else [402, 403]
        date = [500 + r % 3, 510 + r // 3]
        prompt += [DASH, *name, COMMA, *role, COMMA, *city, COMMA, STARTED, *date, NL]
        table += [BAR, *name, SBAR, *role, SBAR, *city, SBAR, *date, SBAR, NL]
    return prompt, table


def start(prompt: list[int], family=ON) -> Stream:
    return Stream.start(Request(max_tokens=64), prompt, family, Tokenizer())  # type: ignore[arg-type]


def test_brief_matches_start_the_copy_that_teaches_the_edits() -> None:
    prompt, table = short_fields(rows=8)
    brief, rounds = run_scripted(prompt, table, ON)
    plain, rounds_plain = run_scripted(prompt, table, replace(ON, brief_match=0))
    assert brief.output == plain.output == table
    assert {old: brief.edits.get(old).new for old in [(COMMA,), (STARTED,)]} == {  # type: ignore[union-attr]
        (COMMA,): (SBAR,), (STARTED,): ()}
    assert len(plain.edits) == 0  # no copy ever started, so no edit was learned
    # 112 tokens. Measured: 23 rounds with brief matches, 90 without (only city-comma-started runs
    # of the list match four tokens).
    assert rounds <= 50 and rounds_plain >= 80, (rounds, rounds_plain)


def test_a_brief_window_is_offered_only_when_no_longer_match_is() -> None:
    s = start([10, 11, 12, 13, 14, 20, 21, 22])
    s.accept([11, 12], ["model"] * 2)  # "11 12" matches two tokens of the prompt
    w = s.propose(None, None)
    assert w is not None and w.brief and w.match_len == 2 and w.start == 3
    assert w.tokens[:3] == (13, 14, 20) and w.rate_key == "context.brief"
    s.accept([13, 14], ["model"] * 2)  # now "11 12 13 14" matches four: an ordinary window
    w = s.propose(None, None)
    assert w is not None and not w.brief and w.match_len == 4 and w.rate_key == "context.short"
    assert not s.surely_draft_free_next(None)


def test_a_brief_match_must_be_the_only_one_and_copy_the_prompt() -> None:
    s = start([10, 11, 12, 13, 14, 20, 11, 12, 15])
    s.accept([11, 12], ["model"] * 2)  # "11 12" is in the prompt twice: which copy goes on is chance
    assert s.propose(None, None) is None
    s = start([10, 11, 12, 13, 14])
    s.accept([30, 31, 32, 40, 30, 31], ["model"] * 6)  # "30 31" only in the reply's own text
    assert s.propose(None, None) is None
    s.accept([11, 12], ["model"] * 2)  # "11 12": once, in the prompt
    w = s.propose(None, None)
    assert w is not None and w.brief and w.tokens[:2] == (13, 14)


def test_brief_matches_need_own_copy_rates_and_a_minimum_under_min_match() -> None:
    prompt = [10, 11, 12, 13, 14]
    assert start(prompt).brief is not None
    assert start(prompt, DEFAULT).brief is None  # fixed rate: it would start them whatever their record
    assert start(prompt, replace(ON, brief_match=0)).brief is None
    assert start(prompt, replace(ON, brief_match=4)).brief is None  # not briefer than min_match (4)
    off = start(prompt, DEFAULT)
    off.accept([11, 12], ["model"] * 2)
    assert off.propose(None, None) is None


def test_a_brief_window_that_breaks_at_once_keeps_a_landed_copys_anchor() -> None:
    s = start(list(range(10, 40)))
    s.record_window(Window("context", (20, 21, 22), 6, start=10), granted=3, accepted=2)
    assert (s.anchor, s.broke_at) == (12, 32)
    s.record_window(Window("context", (30, 31), 2, start=20, brief=True), granted=2, accepted=0)
    assert (s.anchor, s.broke_at) == (12, 32)  # chance: the landed copy may still be picked up
    s.record_window(Window("context", (30, 31), 2, start=20, brief=True), granted=2, accepted=1)
    assert (s.anchor, s.broke_at) == (21, 31)  # it landed: the reply copies from here now
    s.record_window(Window("context", (15, 16), 6, start=5), granted=2, accepted=0)
    s.record_window(Window("context", (25, 26), 2, start=15, brief=True), granted=2, accepted=0)
    assert s.anchor == 15  # the copy before it landed nothing: nothing to keep


@pytest.mark.model
def test_brief_matches_on_the_real_model_keep_its_tokens(loaded, reference, chat_prompt, monkeypatch) -> None:
    from engine.drafts.cost_model import CostModel
    from engine.events import Event, Finished
    from engine.rounds.scheduler import Scheduler
    from tests import prompts
    from tests.test_seed_check import CPU_MS

    prompt = chat_prompt(prompts.TABLE)
    ref = reference(prompt, 140)
    found: dict[int, tuple[int, int]] = {}
    for brief_match in (2, 0):
        monkeypatch.setattr(loaded, "family", replace(loaded.family, brief_match=brief_match))
        events: list[Event] = []
        sched = Scheduler(loaded, events.append)
        sched.submit(Request(prompt_tokens=tuple(prompt), max_tokens=140, own_copy_rates=True))
        while sched.busy:
            sched.costs = CostModel({k: v / 1000 for k, v in CPU_MS.items()})  # fixed prices: same rows every run
            sched.step()
        done = next(e for e in events if isinstance(e, Finished))
        assert list(done.tokens) == ref, f"brief_match={brief_match} changed the tokens"
        verified = [e for e in events if isinstance(e, RoundStats) and e.rate_key == "context.brief" and e.draft_rows]
        found[brief_match] = (len(verified), done.stats.rounds)
    assert found[2][0] > 0 and found[0][0] == 0, found
    assert found[2][1] <= found[0][1], found
