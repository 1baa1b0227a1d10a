"""Long chats on the real model: a chat past the context leaves out its earliest turns (the system
prompt kept) and says so, and a long prompt reports how far it has been read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.errors import PromptTooLongError
from engine.events import Event, Finished, Notice, Reading, Request
from engine.rounds.scheduler import Scheduler

pytestmark = pytest.mark.model

SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def chat(turns: int) -> tuple[dict[str, str], ...]:
    out = [SYSTEM]
    for i in range(turns):
        out += [{"role": "user", "content": f"Tell me fact number {i} about lighthouses and their keepers."},
                {"role": "assistant", "content": f"Fact {i}: lighthouse keepers trimmed wicks and logged ships."}]
    return (*out, {"role": "user", "content": "Which fact was the last one?"})


def run(sched: Scheduler, request: Request, events: list[Event]) -> Finished:
    sched.submit(request)
    while sched.busy:
        sched.step()
    return next(e for e in events if isinstance(e, Finished) and e.request_id == request.id)


def test_a_chat_past_the_context_leaves_out_its_earliest_turns_and_says_so(loaded, reference) -> None:
    small = replace(loaded, context_length=512)  # a model of a 512-token context
    events: list[Event] = []
    sched = Scheduler(small, events.append)
    messages = chat(20)  # ~1,000 tokens
    with pytest.raises(PromptTooLongError, match="context limit of 512 tokens"):
        sched.submit(Request(messages=messages, max_tokens=32))
    done = run(sched, Request(messages=messages, max_tokens=32, fit_context=True), events)
    left = done.stats.left_out
    assert left > 0 and left % 2 == 0  # whole turns: the kept part starts at a user turn
    [notice] = [e for e in events if isinstance(e, Notice)]
    assert f"the {left} earliest messages were left out" in notice.message and "512 tokens" in notice.message
    kept = [SYSTEM, *messages[1 + left :]]
    prompt = list(loaded.tokenizer.apply_chat_template(kept, add_generation_prompt=True))
    assert done.stats.prompt_tokens == len(prompt) and len(prompt) + 32 <= 512
    assert list(done.tokens) == reference(prompt, 32)[: len(done.tokens)]  # mlx-lm's reply to what it saw


def test_a_long_prompt_reports_how_far_it_has_been_read(loaded) -> None:
    events: list[Event] = []
    sched = Scheduler(loaded, events.append)
    done = run(sched, Request(messages=chat(12), max_tokens=4), events)
    reads = [(e.done, e.total) for e in events if isinstance(e, Reading)]
    total = done.stats.prompt_tokens
    assert len(reads) >= 2 and all(t == total for _, t in reads)
    assert [d for d, _ in reads] == sorted(d for d, _ in reads) and reads[-1][0] == total - 1
    short: list[Event] = []
    sched = Scheduler(loaded, short.append)
    run(sched, Request(messages=({"role": "user", "content": "Hi"},), max_tokens=4), short)
    assert not any(isinstance(e, Reading) for e in short)  # a short prompt goes unreported
