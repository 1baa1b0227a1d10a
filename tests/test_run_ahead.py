"""engine.rounds.run_ahead's choices on literal data: what a round run ahead after a drafting one
drafts, and which window its rows are recorded as."""

from __future__ import annotations

import doctest

import engine.rounds.run_ahead as run_ahead
from engine.drafts.allocator import Offer
from engine.drafts.copy_index import Window
from engine.rounds.run_ahead import agreeing, continuations, priced_starts


def test_a_copy_continues_past_the_token_after_its_drafts_up_to_a_rounds_rows() -> None:
    long = Window("context", tuple(range(100, 140)), 12)
    windows = [Window("context", (1, 2, 3, 4, 5), 9), None, long, Window("recall", (7, 8), 9)]
    drafts = [[1, 2], [], [100], []]
    # The worked example; no window; the rest of a long one, capped; a window granted no rows
    # starts past its first token (the model's own token this round).
    assert continuations(windows, drafts, 32) == [[4, 5], [], list(range(102, 134)), [8]]
    assert continuations([Window("context", (1, 2), 9)], [[1, 2]], 32) == [[]]  # nothing past it


def test_continued_drafts_count_as_the_window_proposed_then_only_where_it_starts_with_them() -> None:
    went_on, moved = Window("context", (4, 5, 6), 9), Window("context", (9, 9), 3)
    assert agreeing([went_on, moved, None], [[4, 5], [4, 5], [4]]) == [went_on, None, None]


def test_a_start_is_granted_the_rows_that_pay_for_the_width_they_add_and_a_copy_going_on_keeps_all() -> None:
    def ahead(width: int) -> float:  # a GPU round of these 4 streams: 12.9 ms, 1 ms more per 4 rows
        return 0.0129 + 0.00025 * (width - 1)

    conts = [list(range(10, 30)), list(range(40, 72)), [], [1, 2]]
    drafts = [[9], [], [], []]
    likely, unlikely = Offer(1, 0.94, 32, first_rate=0.94 * 0.94), Offer(3, 0.6, 2, first_rate=0.36)
    out = priced_starts(conts, drafts, [likely, unlikely], ahead, 33, 0.3)
    assert out[0] == conts[0]  # going on: whole, and it makes the round 21 wide for free
    assert out[2] == [] and out[3] == []  # first row less likely than not: no start
    # Row j is worth 0.94**(j + 1); rows up to the width the copy going on set cost nothing and the
    # rest little, so every row worth at least the family's 0.3 is granted: 0.94**19 = 0.31.
    assert out[1] == conts[1][:18]
    alone = [[], conts[1], [], []]  # no copy going on, and each row as dear as a round: no start
    assert priced_starts(alone, [[]] * 4, [likely], lambda w: 0.0129 * w, 33, 0.3) == [[]] * 4


def test_docstring_examples() -> None:
    assert doctest.testmod(run_ahead).failed == 0


def test_a_start_due_a_probe_gets_one_row_where_its_price_starts_none() -> None:
    def ahead(width: int) -> float:  # a lone stream's GPU round: 6.5 ms, each row as dear again
        return 0.0065 * width

    doubtful = Offer(0, 0.6, 3, first_rate=0.45)  # a short match's window: priced out
    assert priced_starts([[5, 6, 7]], [[]], [doubtful], ahead, 33, 0.3) == [[]]
    probe = Offer(0, 0.6, 3, probe=True, first_rate=0.45)
    assert priced_starts([[5, 6, 7]], [[]], [probe], ahead, 33, 0.3) == [[5]]
