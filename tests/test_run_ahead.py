"""engine.rounds.run_ahead's choices on literal data: what a round run ahead after a drafting one
drafts, and which window its rows are recorded as."""

from __future__ import annotations

from engine.drafts.copy_index import Window
from engine.rounds.run_ahead import agreeing, continuations


def test_a_copy_continues_past_the_token_after_its_drafts_up_to_a_rounds_rows() -> None:
    long = Window("context", tuple(range(100, 140)), 12)
    windows = [Window("context", (1, 2, 3, 4, 5), 9), None, long, Window("recall", (7, 8), 9)]
    drafts = [[1, 2], [], [100], []]
    # The worked example; no window; the rest of a long one, capped; a window granted no rows.
    assert continuations(windows, drafts, 32) == [[4, 5], [], list(range(102, 134)), []]
    assert continuations([Window("context", (1, 2), 9)], [[1, 2]], 32) == [[]]  # nothing past it


def test_continued_drafts_count_as_the_window_proposed_then_only_where_it_starts_with_them() -> None:
    went_on, moved = Window("context", (4, 5, 6), 9), Window("context", (9, 9), 3)
    assert agreeing([went_on, moved, None], [[4, 5], [4, 5], [4]]) == [went_on, None, None]
