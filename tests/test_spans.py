"""Origin spans on literal data, and on the real tokenizer."""

from __future__ import annotations

import pytest

from engine.service.spans import origin_spans


def words(tokens: list[int]) -> str:
    vocab = {1: "a", 2: " b", 3: " c", 4: " d"}
    return "".join(vocab[t] for t in tokens)


def test_runs_of_one_origin_become_one_span() -> None:
    assert origin_spans(words, [1, 2, 3, 4], ["model", "context", "context", "model"], "a b c d") == [
        ("a", "model"), (" b c", "context"), (" d", "model")]


def test_text_cut_by_a_stop_string_is_clipped() -> None:
    assert origin_spans(words, [1, 2, 3], ["model", "recall", "recall"], "a b") == [("a", "model"), (" b", "recall")]


def test_runs_that_do_not_add_up_fall_back_to_one_model_span() -> None:
    assert origin_spans(words, [1, 2], ["model", "context"], "something else") == [("something else", "model")]
    assert origin_spans(words, [1], ["model", "context"], "a") == [("a", "model")]
    assert origin_spans(words, [], [], "") == []


@pytest.mark.model
def test_the_real_tokenizer_joins_runs_back_into_the_text(loaded) -> None:
    text = "Déjà vu: the quick brown fox — naïve café, 東京 and emoji 🎉 too."
    tokens = loaded.tokenizer.encode(text, add_special_tokens=False)
    origins = ["model" if i % 3 else "context" for i in range(len(tokens))]
    spans = origin_spans(loaded.tokenizer.decode, tokens, origins, text)
    assert "".join(p for p, _ in spans) == text
