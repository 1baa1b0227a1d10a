"""Learned copy edits (engine/drafts/edits.py) on literal tokens, and a stream that replays them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mlx_lm.tokenizer_utils import StreamingDetokenizer

from engine.drafts.allocator import MIN_FIRST_ROW
from engine.drafts.copy_index import Window
from engine.drafts.edits import MAX_EDIT_TOKENS, MAX_EDITS, Applied, EditBook, edit_between
from engine.events import Request
from engine.model.families import DEFAULT
from engine.rounds.stream import Stream

DASH, COMMA, NL, BAR, SBAR = 1, 2, 3, 4, 5  # "-", ",", "\n", "|", " |"


def test_edit_between_trims_the_common_tail() -> None:
    assert edit_between([COMMA, 11], [SBAR, 11]) == ((COMMA,), (SBAR,))
    assert edit_between([7, 8, 11, 12], [9, 11, 12]) == ((7, 8), (9,))


def test_an_insertion_keeps_the_token_it_comes_before() -> None:
    assert edit_between([NL], [SBAR, NL]) == ((NL,), (SBAR, NL))


def test_a_deletion_has_no_new_tokens() -> None:
    assert edit_between([30, 40], [40]) == ((30,), ())


def test_no_edit_when_nothing_changed_or_it_is_too_long() -> None:
    assert edit_between([5, 6], [5, 6]) is None
    assert edit_between(list(range(MAX_EDIT_TOKENS + 2)), [99, MAX_EDIT_TOKENS + 1]) is None
    assert edit_between([5], [*range(10, 11 + MAX_EDIT_TOKENS), 5]) is None


def table_book() -> EditBook:
    book = EditBook()
    book.learn((DASH,), (BAR,))
    book.learn((COMMA,), (SBAR,))
    book.learn((NL,), (SBAR, NL))
    return book


def test_apply_turns_a_list_row_into_a_table_row() -> None:
    text = [DASH, 10, COMMA, 11, NL, DASH, 12, COMMA, 13, NL]  # "- Maria, Berlin" / "- James, Paris"
    d = table_book().apply(text, start=5, stop=len(text), limit=16)
    assert d.tokens == (BAR, 12, SBAR, 13, SBAR, NL)
    assert d.sources == (5, 6, 7, 8, 9, 9, 10)
    assert d.applied == (Applied(0, (DASH,), 1), Applied(2, (COMMA,), 1), Applied(4, (NL,), 2))


def test_the_longest_old_text_wins() -> None:
    book = EditBook()
    book.learn((COMMA,), (SBAR,))
    book.learn((COMMA, 20), (SBAR,))  # ", started" -> " |"
    assert book.apply([COMMA, 20, 21, COMMA, 22], 0, 5, 8).tokens == (SBAR, 21, SBAR, 22)


def test_edits_stop_at_edit_until_and_the_limit_cuts_inside_an_edit() -> None:
    text = [COMMA, 11, NL, COMMA, 12]
    d = table_book().apply(text, 0, len(text), limit=8, edit_until=3)
    assert d.tokens == (SBAR, 11, SBAR, NL, COMMA, 12)  # the second comma is past edit_until
    cut = table_book().apply(text, 0, len(text), limit=3)
    assert cut.tokens == (SBAR, 11, SBAR)
    assert cut.sources == (0, 1, 2, 2)  # the cut edit's old text is where the source resumes


def test_extra_edit_is_tried_before_the_book() -> None:
    d = EditBook().apply([COMMA, 11], 0, 2, 4, extra=((COMMA,), (SBAR,)))
    assert d.tokens == (SBAR, 11)


def test_outcome_of_an_applied_edit() -> None:
    two = Applied(at=2, old=(NL,), length=2)
    assert two.outcome(granted=8, accepted=4) is True
    assert two.outcome(granted=8, accepted=3) is False  # its second token was rejected
    assert two.outcome(granted=8, accepted=1) is None  # the copy broke before it
    assert two.outcome(granted=3, accepted=3) is None  # the granted rows ran out inside it
    deletion = Applied(at=1, old=(20,), length=0)
    assert deletion.outcome(granted=4, accepted=2) is True
    assert deletion.outcome(granted=4, accepted=1) is False


def test_an_edit_that_fails_more_than_it_lands_is_not_applied() -> None:
    book = EditBook()
    book.learn((COMMA,), (SBAR,))  # landed 1
    failing = [Applied(0, (COMMA,), 1)]
    book.score(failing, granted=4, accepted=0)
    assert book.apply([COMMA], 0, 1, 4).tokens == (SBAR,)  # 1 failure, 1 landing: still on
    book.score(failing, granted=4, accepted=0)
    assert book.apply([COMMA], 0, 1, 4).tokens == (COMMA,)
    book.learn((COMMA,), (SBAR,))
    book.learn((COMMA,), (SBAR,))  # learned again: back on
    assert book.apply([COMMA], 0, 1, 4).tokens == (SBAR,)


def test_relearning_with_other_new_text_replaces_the_edit() -> None:
    book = EditBook()
    book.learn((COMMA,), (SBAR,))
    book.learn((COMMA,), (BAR,))
    assert book.apply([COMMA], 0, 1, 4).tokens == (BAR,)
    assert len(book) == 1


def test_the_oldest_edit_is_forgotten_past_max_edits() -> None:
    book = EditBook()
    for t in range(MAX_EDITS + 1):
        book.learn((100 + t,), (7,))
    assert len(book) == MAX_EDITS
    assert (100,) not in book and (101,) in book
    assert book.apply([100, 101], 0, 2, 4).tokens == (100, 7)


# -- a stream replaying edits, with a scripted model -----------------------------------------

class Tokenizer:
    eos_token_ids = {0}

    def decode(self, tokens: list[int]) -> str:
        return " ".join(map(str, tokens))

    @property
    def detokenizer(self) -> StreamingDetokenizer:
        return Detokenizer(self)


class Detokenizer(StreamingDetokenizer):
    """The whole reply decoded again each time: fine for the short scripted replies here."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.reset()

    def reset(self) -> None:
        self.offset, self.tokens = 0, []

    def add_token(self, token: int) -> None:
        self.tokens.append(token)

    def finalize(self) -> None:
        pass

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.tokens)


def list_and_table(rows: int) -> tuple[list[int], list[int]]:
    """A list of ``rows`` rows ("- name, role, city, started month year") and the table the model
    writes from it ("| name | role | city | month year |"). Roles are four tokens, so that a copy can
    start (the context index needs four matching tokens). Cities, months and years repeat, as in a
    real staff list, so the reply's own earlier rows offer matches that continue with the wrong row."""
    started = 6
    prompt, table = [90, 91, 92], []  # "Convert to a table:"
    for r in range(rows):
        name = [200 + 2 * r, 201 + 2 * r]
        role = [300 + 4 * r, 301 + 4 * r, 302 + 4 * r, 303 + 4 * r]
        city = [400, 401] if r % 2 else [402, 403]
        date = [500 + r % 3, 510 + r // 3]
        prompt += [DASH, *name, COMMA, *role, COMMA, *city, COMMA, started, *date, NL]
        table += [BAR, *name, SBAR, *role, SBAR, *city, SBAR, *date, SBAR, NL]
    return prompt, table


def run_scripted(prompt: list[int], target: list[int], family=DEFAULT, rows: int = 8) -> tuple[Stream, int]:
    """Generate ``target`` as a model would under greedy verification: each round a stream's window
    gets up to ``rows`` rows, keeps what equals the target and adds the target's next token."""
    s = Stream.start(Request(max_tokens=len(target) + 1), prompt, family, Tokenizer())  # type: ignore[arg-type]
    rounds = 0
    while len(s.output) < len(target):
        rounds += 1
        pos = len(s.output)
        w = s.propose(None, None)
        drafts = list(w.tokens[:rows]) if w is not None else []
        accepted = 0
        while accepted < len(drafts) and pos + accepted < len(target) and drafts[accepted] == target[pos + accepted]:
            accepted += 1
        if w is not None and drafts:
            s.record_window(w, len(drafts), accepted)
        s.accept(target[pos : pos + accepted + 1], ["model"] * (accepted + 1))
    return s, rounds


def test_a_stream_learns_the_table_edits_and_copies_whole_rows() -> None:
    prompt, table = list_and_table(rows=8)
    with_edits, rounds = run_scripted(prompt, table)
    without, rounds_plain = run_scripted(prompt, table, replace(DEFAULT, copy_edits=False))
    assert with_edits.output == without.output == table
    learned = {old: with_edits.edits.get(old) for old in [(DASH,), (COMMA,), (6,), (NL,)]}
    assert {old: e.new for old, e in learned.items() if e} == {
        (DASH,): (BAR,), (COMMA,): (SBAR,), (6,): (), (NL,): (SBAR, NL)}  # 6 is "started": deleted
    assert len(without.edits) == 0
    # 128 tokens; once the edits are known a row (16 tokens) takes about two rounds of 8 rows.
    # Without them every separator breaks the copy (100 rounds); without picking the edited copy up
    # where it stopped, matches in earlier rows derail it (57).
    assert rounds <= 35 < 50 <= rounds_plain, (rounds, rounds_plain)


def test_edits_apply_only_to_the_prompt() -> None:
    prompt = [90, 91, 92, 93, COMMA]
    s = Stream.start(Request(max_tokens=64), prompt, DEFAULT, Tokenizer())  # type: ignore[arg-type]
    s.edits.learn((COMMA,), (SBAR,))
    s.accept([COMMA, 90, 91, 92, 93], ["model"] * 5)  # the reply repeats the prompt, comma first
    w = s.propose(None, None)
    assert w is not None and w.start == 4
    # The prompt's comma is edited; the reply's own comma, copied after it, is not.
    assert w.tokens == (SBAR, COMMA, 90, 91, 92, 93)


@pytest.mark.parametrize("accepted, anchor", [(0, 10), (1, 10), (2, 11)])
def test_a_copy_that_stops_inside_an_edit_resumes_from_its_old_text(accepted: int, anchor: int) -> None:
    prompt, _ = list_and_table(rows=2)
    s = Stream.start(Request(max_tokens=64), prompt, DEFAULT, Tokenizer())  # type: ignore[arg-type]
    w = Window("context", (SBAR, NL, 5), 4, start=10, sources=(10, 10, 11, 12),
               applied=(Applied(0, (NL,), 2),))
    s.record_window(w, granted=3, accepted=accepted)
    assert s.anchor == anchor
    assert s.broke_at == len(prompt) + (0 if accepted < 2 else 2)


@pytest.mark.model
def test_edits_on_the_real_model_keep_its_tokens_and_save_rounds(loaded, reference, chat_prompt, monkeypatch) -> None:
    from engine.drafts.cost_model import CostModel
    from engine.events import Event, Finished
    from engine.rounds.scheduler import Scheduler
    from tests import prompts
    from tests.test_seed_check import CPU_MS

    prompt = chat_prompt(prompts.TABLE)
    ref = reference(prompt, 140)
    rounds = {}
    for edits in (True, False):
        monkeypatch.setattr(loaded, "family", replace(loaded.family, copy_edits=edits))
        events: list[Event] = []
        sched = Scheduler(loaded, events.append)
        sched.submit(Request(prompt_tokens=tuple(prompt), max_tokens=140))
        while sched.busy:
            sched.costs = CostModel({k: v / 1000 for k, v in CPU_MS.items()})  # fixed prices: same rows every run
            sched.step()
        done = next(e for e in events if isinstance(e, Finished))
        assert list(done.tokens) == ref, f"copy_edits={edits} changed the tokens"
        rounds[edits] = done.stats.rounds
    # Measured: 76 rounds with edits, 102 without (the model adds a country to every office, which
    # no edit predicts).
    assert rounds[True] < 0.85 * rounds[False], rounds


def test_short_copies_start_once_one_lands_and_stop_when_one_breaks_but_long_and_edited_ones_do_not_wait() -> None:
    s = Stream.start(Request(max_tokens=64, own_copy_rates=True), [90, 91, 92], DEFAULT, Tokenizer())  # type: ignore[arg-type]
    short = Window("context", (7, 8, 9), match_len=4, start=0)
    long = Window("context", (7, 8, 9), match_len=12, start=0)
    edited = replace(short, applied=(Applied(0, (COMMA,), 1),))
    assert s.price(short) == (0.94, 0.45)  # doubtful: the 0.45 prior, under MIN_FIRST_ROW: not started
    assert s.price(short)[1] < MIN_FIRST_ROW <= s.price(long)[1]
    assert s.price(long) == s.price(edited) == (0.94, 0.94)
    s.record_window(short, granted=1, accepted=1)  # a probe's first row landed
    _, first = s.price(short)
    assert first == pytest.approx(2.8 / 5) and first >= MIN_FIRST_ROW  # short copies start now
    s.record_window(short, granted=3, accepted=0)  # the next one's first row broke
    _, first = s.price(short)
    assert first == pytest.approx(2.7 / 5.9) and first < MIN_FIRST_ROW  # stopped until a probe lands
    assert s.price(long) == s.price(edited) == (0.94, 0.94)  # sure copies are priced as before
    # With own copy rates off every window is priced at the family's fixed rate.
    off = Stream.start(Request(max_tokens=64, own_copy_rates=False), [90, 91, 92], DEFAULT, Tokenizer())  # type: ignore[arg-type]
    assert off.price(short) == (0.94, None)
