"""A reply's text comes from mlx-lm's streaming detokenizer, not from decoding each round's tokens
alone: SentencePiece tokenizers (Mistral, Llama 2) mark a word's leading space inside the token,
and decoding one round's tokens on their own drops it at every round boundary."""

from __future__ import annotations

import itertools

import pytest
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    SPMStreamingDetokenizer,
    TokenizerWrapper,
)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.events import Request
from engine.model.families import DEFAULT
from engine.rounds.stream import Stream


def sentencepiece_like(detokenizer: type = NaiveStreamingDetokenizer) -> TokenizerWrapper:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁Hello": 3, "▁world": 4, "!": 5, "▁again": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                    unk_token="<unk>"), detokenizer)


def test_leading_spaces_survive_round_boundaries() -> None:
    tokenizer = sentencepiece_like()
    assert tokenizer.decode([4]) == "world"  # alone, the space is gone: what each round used to get
    stream = Stream.start(Request(prompt_tokens=(1, 3), max_tokens=8), [1, 3], DEFAULT, tokenizer)
    pieces = [stream.accept(tokens, ["model"] * len(tokens))[2] for tokens in ([3], [4, 5], [6], [2])]
    assert stream.text == "Hello world! again" == "".join(pieces)
    assert stream.stop_reason == "eos"


@pytest.mark.model
@pytest.mark.parametrize("text", [" A leading space, kept.", "émoji 🎉 split over bytes, 中文字符 too",
                                  "a long line " * 60, "\n\nnewlines, then a tab\tand `code = 1`"])
def test_a_gguf_reply_streams_exactly_what_its_tokens_decode_to(loaded, text: str) -> None:
    """The embedded GGUF's tokenizer streams with mlx-lm's byte-level detokenizer (linear in a line,
    where the default re-decodes the line per token), its leading space kept: in rounds of any size
    the text is ``tokenizer.decode`` of the tokens, as with mlx-lm's default."""
    tokenizer = loaded.tokenizer
    assert isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer)
    tokens = tokenizer.encode(text)
    stream = Stream.start(Request(prompt_tokens=(1,), max_tokens=len(tokens) + 1), [1], DEFAULT, tokenizer)
    pieces, at = [], 0
    for size in itertools.cycle((1, 3, 2, 5)):  # a round keeps one token, or a copy's several
        if at >= len(tokens):
            break
        pieces.append(stream.accept(tokens[at : at + size], ["model"] * len(tokens[at : at + size]))[2])
        at += size
    pieces.append(stream.accept([next(iter(tokenizer.eos_token_ids))], ["model"])[2])
    assert stream.stop_reason == "eos"
    assert stream.text == "".join(pieces) == tokenizer.decode(tokens)


@pytest.mark.parametrize("detokenizer", [NaiveStreamingDetokenizer, SPMStreamingDetokenizer])
def test_a_continued_reply_keeps_the_space_it_goes_on_after(detokenizer: type) -> None:
    """A SentencePiece reply's leading space is trimmed (by the decoder, or by mlx-lm's streaming
    detokenizer for such models); a continued reply (the prompt ends inside the assistant's message)
    goes on after its own last token, so its first word keeps the space before it, and a new reply
    still starts trimmed."""
    tokenizer = sentencepiece_like(detokenizer)
    texts = []
    for continued in (True, False):
        request = Request(prompt_tokens=(1, 3), max_tokens=8, continue_final=continued)
        stream = Stream.start(request, [1, 3], DEFAULT, tokenizer)
        pieces = [stream.accept(tokens, ["model"] * len(tokens))[2] for tokens in ([4, 5], [6], [2])]
        assert stream.text == "".join(pieces)
        texts.append(stream.text)
    assert texts == [" world! again", "world! again"]
