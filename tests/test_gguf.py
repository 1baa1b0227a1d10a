"""GGUF files are read by what their metadata says: the pre-tokenizer, rope scaling and Llama 3.1's
``rope_freqs``; what Lanes cannot honour is refused, naming the file and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import llama

from engine.errors import ModelLoadError
from engine.model.gguf import pre_tokenizer
from engine.model.loading import load_model
from engine.model.locate import embedded_model_path

HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def pieces(name: str, text: str) -> list[str]:
    return [p for p, _ in pre_tokenizer(name).pre_tokenize_str(text)]


def test_pre_tokenizers_split_as_their_models_do() -> None:
    text = "I'll pay 12345"
    assert pieces("smollm", text) == ["I", "'ll", "Ġpay", "Ġ", "1", "2", "3", "4", "5"]
    assert pieces("llama-bpe", text) == ["I", "'ll", "Ġpay", "Ġ", "123", "45"]
    assert pieces("qwen2", text) == ["I", "'ll", "Ġpay", "Ġ", "1", "2", "3", "4", "5"]
    assert pieces("gpt2", text) == ["I", "'ll", "Ġpay", "Ġ12345"]


@pytest.fixture(scope="module")
def tokenizer_meta() -> dict[str, Any]:
    _, meta = mx.load(str(embedded_model_path()), return_metadata=True)
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def tiny_llama_gguf(path: Path, tokenizer_meta: dict[str, Any], rope_scaling: dict | None = None,
                    **meta: Any) -> llama.Model:
    """A random 2-layer llama written as GGUF (rope as GGUF expects: interleaved pairs); returns the
    mlx-lm model it was written from."""
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=49152,
                           max_position_embeddings=4096, rope_theta=10000.0, rope_traditional=True,
                           rope_scaling=rope_scaling, tie_word_embeddings=True)
    mx.random.seed(3)
    model = llama.Model(args)
    tensors = {}
    for name, value in dict(_flat(model.parameters())).items():
        parts = name.split(".")
        if parts[1] == "layers":
            base = ".".join(parts[3:-1])
            tensors[f"blk.{parts[2]}.{HF_TO_GGUF[base]}.{parts[-1]}"] = value
        else:
            tensors[{"embed_tokens": "token_embd", "norm": "output_norm"}[parts[1]] + ".weight"] = value
    if rope_scaling is not None:
        rope = model.model.layers[0].self_attn.rope
        base_periods = 10000.0 ** (mx.arange(0, 16, 2, dtype=mx.float32) / 16)
        tensors["rope_freqs.weight"] = rope._freqs / base_periods  # llama.cpp's factors
    metadata = {
        "general.architecture": "llama", "llama.attention.head_count": mx.array(4, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(2, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5), "llama.block_count": mx.array(2, dtype=mx.uint32),
        "llama.context_length": mx.array(4096, dtype=mx.uint32), "llama.embedding_length": mx.array(64, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(96, dtype=mx.uint32), "llama.rope.freq_base": mx.array(10000.0),
        **tokenizer_meta, **meta,
    }
    mx.save_gguf(str(path), tensors, metadata)
    return model


def _flat(tree: Any, prefix: str = "") -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return tree_flatten(tree, prefix)


def test_rope_freqs_give_llama_31_scaling(tmp_path: Path, tokenizer_meta) -> None:
    """A GGUF with ``rope_freqs`` answers as mlx-lm's llama with the Llama 3 rope those factors
    came from, and differs from the same weights without them."""
    path = tmp_path / "llama31.gguf"
    reference = tiny_llama_gguf(path, tokenizer_meta, rope_scaling=LLAMA3)
    lanes = load_model(str(path))
    tokens = mx.array([list(range(100, 180))])
    assert mx.allclose(lanes.model(tokens), reference(tokens), atol=1e-4).item()
    plain = tmp_path / "plain.gguf"
    tiny_llama_gguf(plain, tokenizer_meta)
    assert not mx.allclose(load_model(str(plain)).model(tokens), reference(tokens), atol=1e-4).item()


@pytest.mark.parametrize(("meta", "what"), [
    ({"tokenizer.ggml.pre": "deepseek-coder"}, "pre-tokenizer 'deepseek-coder'"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": mx.array(4.0)}, "rope scaling 'yarn'"),
])
def test_what_cannot_be_honoured_is_refused_naming_file_and_value(tmp_path: Path, tokenizer_meta, meta, what) -> None:
    path = tmp_path / "odd.gguf"
    tiny_llama_gguf(path, tokenizer_meta, **meta)
    with pytest.raises(ModelLoadError, match=what) as err:
        load_model(str(path))
    assert str(path) in str(err.value)
