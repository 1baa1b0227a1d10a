"""Leaving out a long chat's earliest turns (engine.model.context_fit), on literal data."""

from __future__ import annotations

from engine.model.context_fit import fit_turns


def msgs(*roles: str) -> list[dict[str, str]]:
    return [{"role": r, "content": f"{r}{i}"} for i, r in enumerate(roles)]


def hundred_each(ms: list) -> int:
    return 100 * len(ms)


def test_the_worked_example() -> None:
    chat = msgs("system", "user", "assistant", "user", "assistant", "user")
    kept, left = fit_turns(chat, hundred_each, 350)
    assert [m["content"] for m in kept] == ["system0", "user5"] and left == 4  # a2 alone cannot lead


def test_a_chat_that_fits_is_sent_whole() -> None:
    chat = msgs("system", "user", "assistant", "user")
    assert fit_turns(chat, hundred_each, 400) == (chat, 0)


def test_the_newest_turns_that_fit_are_kept_from_a_user_turn() -> None:
    chat = msgs("user", "assistant", "user", "assistant", "user", "assistant", "user")
    kept, left = fit_turns(chat, hundred_each, 500)
    assert [m["content"] for m in kept] == ["user2", "assistant3", "user4", "assistant5", "user6"] and left == 2


def test_the_last_message_is_kept_even_alone_too_long() -> None:
    chat = msgs("system", "user", "assistant", "user")
    kept, left = fit_turns(chat, hundred_each, 50)  # nothing fits: the caller's limit check says so
    assert [m["content"] for m in kept] == ["system0", "user3"] and left == 2


def test_the_template_renders_a_few_times_not_once_per_turn() -> None:
    calls: list[int] = []

    def count(ms: list) -> int:
        calls.append(len(ms))
        return 10 * len(ms)

    chat = msgs("system", *(["user", "assistant"] * 200), "user")
    kept, left = fit_turns(chat, count, 500)
    assert 10 * len(kept) <= 500 and kept[1]["role"] == "user" and left == len(chat) - len(kept)
    assert len(calls) <= 12
