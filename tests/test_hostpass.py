"""numpy's pass (engine/passes/numpy_pass.py) against mlx-lm's own model: logits, and the keys it writes."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from engine.events import Failed, Finished, Request
from engine.model.lane_cache import LaneCache
from engine.passes.numpy_pass import HostPass, supports_host
from engine.rounds.scheduler import Scheduler
from tests import prompts


def lanes_for(model: nn.Module, n_layers: int, lengths: list[int], vocab: int = 5000) -> LaneCache:
    lanes = LaneCache(n_layers)
    for b, n in enumerate(lengths):
        caches = [KVCache() for _ in range(n_layers)]
        model(mx.array([[(7 * b + 13 * i) % vocab + 1 for i in range(n)]], dtype=mx.int32), cache=caches)
        lanes.add(caches)
    return lanes


def compare(model: nn.Module, n_layers: int, lengths: list[int], widths: list[int], vocab: int, tol: float) -> None:
    """The host pass and mlx-lm's padded pass over the same lanes: same argmax, logits and new keys
    to ``tol``; positions before each stream's length untouched."""
    rows = [[(31 * b + 5 * j) % vocab + 1 for j in range(w)] for b, w in enumerate(widths)]
    width = max(widths)
    theirs = lanes_for(model, n_layers, lengths, vocab)
    theirs.begin_round(width)
    padded = np.array(model(mx.array([r + [r[-1]] * (width - len(r)) for r in rows], dtype=mx.int32),
                            cache=theirs.views))
    mine = lanes_for(model, n_layers, lengths, vocab)
    before = [np.array(k) for k in mine.keys]
    mine.begin_host(widths)
    logits = HostPass(model).logits(mine, rows)
    mine.end_round()
    assert logits.shape == (sum(widths), padded.shape[-1])
    at = 0
    for b, w in enumerate(widths):
        ours = logits[at : at + w]
        at += w
        assert (ours.argmax(-1) == padded[b, :w].argmax(-1)).all()
        assert np.abs(ours - padded[b, :w]).max() < tol
        for layer in range(n_layers):
            # Written through numpy's view of the buffer: MLX reads the same memory.
            new = slice(lengths[b], lengths[b] + w)
            assert np.abs(np.array(mine.keys[layer][b, :, new]) - np.array(theirs.keys[layer][b, :, new])).max() < tol
            assert np.abs(np.array(mine.values[layer][b, :, new]) - np.array(theirs.values[layer][b, :, new])).max() < tol
            assert (np.array(mine.keys[layer][b, :, : lengths[b]]) == before[layer][b, :, : lengths[b]]).all()


def tiny_llama(**overrides: object) -> llama.Model:
    args = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=48,
                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=64,
                tie_word_embeddings=True)
    args.update(overrides)
    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs(**args))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("tied", [True, False])
def test_tiny_llama_matches_mlx_lm(traditional: bool, tied: bool) -> None:
    model = tiny_llama(rope_traditional=traditional, tie_word_embeddings=tied)
    assert supports_host(model)
    compare(model, 2, [5, 9, 3], [1, 4, 2], vocab=64, tol=1e-4)


def test_what_it_does_not_know_stays_on_mlx() -> None:
    assert not supports_host(nn.Linear(2, 2))
    assert not supports_host(tiny_llama(attention_bias=True))
    assert not supports_host(tiny_llama(mlp_bias=True))
    half = tiny_llama()
    half.set_dtype(mx.float16)
    assert not supports_host(half)
    quantized = tiny_llama(hidden_size=64, intermediate_size=128)
    nn.quantize(quantized, group_size=32)
    assert not supports_host(quantized)


def test_weights_are_read_in_place() -> None:
    """numpy reads the model's own weights: no second copy of a few hundred MB."""
    hp = HostPass(tiny_llama())
    assert not hp.embed.flags.owndata and not hp.layers[0].q.flags.owndata


@pytest.mark.model
@pytest.mark.parametrize("widths", [[1], [6], [1, 1, 1, 1], [9, 1, 4, 1], [2, 1]])
def test_embedded_model_matches_mlx_lm(loaded, widths: list[int]) -> None:
    assert supports_host(loaded.model)
    lengths = [300, 41, 77, 120][: len(widths)]
    compare(loaded.model, loaded.n_layers, lengths, widths, vocab=5000, tol=1e-3)


@pytest.mark.model
def test_a_pass_that_raises_leaves_the_engine_healthy(loaded, reference, chat_prompt, monkeypatch) -> None:
    """A fault half way through numpy's pass (keys already written for five layers) fails that
    round's streams; the next request's tokens still equal mlx-lm's."""
    real, calls = HostPass._attend, {"n": 0}

    def faulty(self, *args):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("injected")
        return real(self, *args)

    events: list = []
    sched = Scheduler(loaded, events.append)
    monkeypatch.setattr(HostPass, "_attend", faulty)
    doomed = Request(prompt_tokens=tuple(chat_prompt(prompts.OPEN)), max_tokens=8)
    sched.submit(doomed)
    while sched.busy:
        sched.step()
    assert [e.request_id for e in events if isinstance(e, Failed)] == [doomed.id]
    after = Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=24)
    sched.submit(after)
    while sched.busy:
        sched.step()
    done = next(e for e in events if isinstance(e, Finished))
    assert done.request_id == after.id and sched.rounds_host > 1
    assert list(done.tokens) == reference(list(after.prompt_tokens or ()), 24)
