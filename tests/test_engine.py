"""The engine thread on the real model: typed events, cancellation, faults, reuse."""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import PromptTooLongError
from engine.events import Failed, Finished, Request, RoundStats, Tokens
from engine.rounds.engine_thread import Engine
from engine.rounds.stream import Stream
from tests import prompts

pytestmark = pytest.mark.model


@pytest.fixture
def engine(loaded):
    eng = Engine(loader=lambda _spec: loaded, calibrate=False)
    eng.info(timeout=60)
    yield eng
    eng.close()


def ask(text: str, **kw) -> Request:
    return Request(messages=({"role": "user", "content": text},), **kw)


def test_capital_of_france_is_paris(engine) -> None:
    events = list(engine.submit(ask(prompts.FRANCE, max_tokens=20)))
    done = events[-1]
    assert isinstance(done, Finished)
    assert "Paris" in done.text
    assert done.reason == "eos"
    assert "".join(e.text for e in events if isinstance(e, Tokens)) == done.text
    assert any(isinstance(e, RoundStats) for e in events)


def test_async_iteration_and_concurrent_streams(engine, reference, chat_prompt) -> None:
    async def run() -> list[Finished | Failed]:
        handles = [engine.submit(ask(t, max_tokens=24)) for t in (prompts.FRANCE, prompts.COPY, prompts.OPEN)]

        async def last(h):
            result = None
            async for ev in h:
                result = ev
            return result

        return await asyncio.gather(*(last(h) for h in handles))

    results = asyncio.run(run())
    for text, res in zip((prompts.FRANCE, prompts.COPY, prompts.OPEN), results, strict=True):
        assert isinstance(res, Finished)
        assert list(res.tokens) == reference(chat_prompt(text), 24)


def test_cancel_mid_reply_leaves_engine_healthy(engine, reference, chat_prompt) -> None:
    handle = engine.submit(ask(prompts.OPEN, max_tokens=200))
    for ev in handle:
        if isinstance(ev, Tokens):
            handle.cancel()
            break
    done = handle.wait()
    assert isinstance(done, Finished) and done.reason == "cancelled"
    assert 0 < len(done.tokens) < 200
    again = engine.submit(ask(prompts.FRANCE, max_tokens=20)).wait()
    assert isinstance(again, Finished) and list(again.tokens) == reference(chat_prompt(prompts.FRANCE), 20)


def test_prompt_over_context_limit_is_refused_before_compute(engine, loaded) -> None:
    long = "word " * (loaded.context_length + 10)
    done = engine.submit(ask(long)).wait()
    assert isinstance(done, Failed)
    assert done.kind == PromptTooLongError.__name__
    assert str(loaded.context_length) in done.message and loaded.name in done.message


def test_fault_in_one_stream_leaves_others_running(engine, reference, chat_prompt, monkeypatch) -> None:
    original = Stream.accept

    def faulty(self, tokens, origins):
        if self.request.stop == ("<boom>",) and len(self.output) >= 3:
            raise RuntimeError("injected fault")
        return original(self, tokens, origins)

    monkeypatch.setattr(Stream, "accept", faulty)
    bad = engine.submit(ask(prompts.OPEN, max_tokens=30, stop=("<boom>",)))
    good = engine.submit(ask(prompts.COPY, max_tokens=30))
    bad_done, good_done = bad.wait(), good.wait()
    assert isinstance(bad_done, Failed) and "injected fault" in bad_done.message
    assert isinstance(good_done, Finished)
    assert list(good_done.tokens) == reference(chat_prompt(prompts.COPY), 30)


def test_stop_strings_and_max_tokens(engine) -> None:
    done = engine.submit(ask(prompts.FRANCE, max_tokens=20, stop=("France",))).wait()
    assert isinstance(done, Finished) and done.reason == "stop"
    assert "France" not in done.text and done.text.startswith("The capital of")
    short = engine.submit(ask(prompts.OPEN, max_tokens=5)).wait()
    assert isinstance(short, Finished) and short.reason == "length" and len(short.tokens) == 5


def test_follow_up_turn_reuses_kv_cache_and_matches(engine, loaded, reference) -> None:
    first = engine.submit(ask(prompts.FRANCE, max_tokens=20, conversation="c1")).wait()
    assert isinstance(first, Finished)
    history = (
        {"role": "user", "content": prompts.FRANCE},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And of Italy?"},
    )
    second = engine.submit(Request(messages=history, max_tokens=20, conversation="c1")).wait()
    assert isinstance(second, Finished)
    assert second.stats.prefill_reused > 20
    full = list(loaded.tokenizer.apply_chat_template(list(history), add_generation_prompt=True))
    assert list(second.tokens) == reference(full, 20)


def test_copy_history_round_trips(engine) -> None:
    done = engine.submit(ask(prompts.COPY, max_tokens=40, own_copy_rates=True)).wait()
    assert isinstance(done, Finished)
    hist = done.copy_history  # which keys depends on the windows the reply found (engine.drafts.copy_rates)
    assert hist and sum(h["tested"] for h in hist.values()) > 0
    again = engine.submit(ask(prompts.COPY, max_tokens=5, own_copy_rates=True, copy_history=hist)).wait()
    assert isinstance(again, Finished)
    for key, h in hist.items():  # carried over: kept, or decayed by at most a few windows (0.9 each)
        assert again.copy_history[key]["tested"] >= h["tested"] * 0.5, key


def test_close_joins_thread_and_fails_pending(loaded) -> None:
    eng = Engine(loader=lambda _spec: loaded, calibrate=False)
    handle = eng.submit(ask(prompts.OPEN, max_tokens=400))
    next(iter(handle))
    eng.close()
    assert not eng._thread.is_alive()
    assert isinstance(handle.result, Finished | Failed)


def test_recall_copies_from_another_conversation(engine, reference, chat_prompt) -> None:
    """A question answered in another conversation is answered again by copying that reply
    through Recall; the tokens stay exactly mlx-lm's."""
    ref = reference(chat_prompt(prompts.OPEN), 64)
    engine.add_recall("other-conversation", ref)
    done = engine.submit(ask(prompts.OPEN, max_tokens=64, conversation="this-one")).wait()
    assert isinstance(done, Finished)
    assert list(done.tokens) == ref
    assert done.stats.rows["recall"].accepted > 10
    assert "recall" in done.origins


def test_cancel_before_the_first_token(engine, reference, chat_prompt) -> None:
    handle = engine.submit(ask(prompts.CODE * 8, max_tokens=50))
    handle.cancel()  # most likely still prefilling
    done = handle.wait()
    assert isinstance(done, Finished) and done.reason == "cancelled"
    again = engine.submit(ask(prompts.FRANCE, max_tokens=20)).wait()
    assert isinstance(again, Finished) and list(again.tokens) == reference(chat_prompt(prompts.FRANCE), 20)
