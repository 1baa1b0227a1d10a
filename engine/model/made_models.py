"""Model folders made here, without downloads, for tests and benchmarks (``lanes make-model``).

- ``embedded-as-llama``: the embedded SmolLM2 as an mlx-lm folder of its own architecture, for
  programs that cannot read GGUF (``mlx_lm.server`` beside ``lanes serve`` in ``make bench-server``).
- ``embedded-as-qwen2``: the embedded SmolLM2's real weights in mlx-lm's *qwen2* module (zero
  q/k/v biases, the same interleaved rope): another architecture's code path with a model that
  really copies, so its benchmark means something.
- any key of ``RANDOM``: random weights of that architecture, tiny, one per cache kind Lanes rolls
  back (plain KV, sliding windows, short convolutions, gated delta nets, Mamba2 SSMs).
- ``embedded-8bit``: the embedded SmolLM2's weights as mlx-community ships its models (mlx-lm's
  llama module, bfloat16, 8-bit in groups of 64): a model that really copies, in the dtype a GPU
  user's models compute in (the GGUF and the folders above compute in float32, which a GPU's
  attention kernels treat apart from bfloat16). 8-bit, since the GGUF's weights are 4-bit already:
  quantized to 4 bits again, this 135M model's replies change (and degrade), at 8 they stay its own.
- any key of ``SHAPED``: random weights in the shape of a model people run, in its dtype and
  quantized as they run it, for benchmarks of speed only (``lanes bench --model``): what a larger
  model's passes cost, without a download. Its text is noise, so its copy rates say nothing.

Every folder is what mlx-lm writes (``config.json``, safetensors, the embedded tokenizer), so it
loads through ``lanes --model FOLDER`` like any downloaded model.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

VOCAB = 49152  # the embedded SmolLM2 tokenizer's

RANDOM: dict[str, dict[str, Any]] = {
    "qwen3": dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=VOCAB, max_position_embeddings=4096,
        rope_theta=10000.0, tie_word_embeddings=True,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text", hidden_size=64, num_hidden_layers=3, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, sliding_window=16, sliding_window_pattern=3,
        query_pre_attn_scalar=16, max_position_embeddings=4096,
    ),
    "gpt_oss": dict(
        model_type="gpt_oss", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB,
        hidden_size=64, intermediate_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096,
    ),
    "lfm2": dict(
        model_type="lfm2", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, norm_eps=1e-5, conv_bias=False, conv_L_cache=3,
        block_dim=64, block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
        block_ff_dim=96, full_attn_idxs=[1],
    ),
    "qwen3_next": dict(
        model_type="qwen3_next", hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=4,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
        shared_expert_intermediate_size=64, mlp_only_layers=[], moe_intermediate_size=32, rms_norm_eps=1e-6,
        vocab_size=VOCAB, num_key_value_heads=2, rope_theta=10000.0, partial_rotary_factor=0.5,
        max_position_embeddings=4096, head_dim=16, full_attention_interval=2,
    ),
    "nemotron_h": dict(
        model_type="nemotron_h", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, max_position_embeddings=4096,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=False, mamba_num_heads=4,
        mamba_head_dim=16, mamba_proj_bias=False, ssm_state_size=16, conv_kernel=4, n_groups=1, mlp_bias=False,
        layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True, hybrid_override_pattern=["M", "*", "-", "M"],
        time_step_limit=(0.0, float("inf")),
    ),
    "mamba2": dict(
        model_type="mamba2", num_heads=4, head_dim=16, vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
        state_size=16, num_hidden_layers=2, layer_norm_epsilon=1e-5, conv_kernel=4, n_groups=1, use_bias=False,
        use_conv_bias=True, tie_word_embeddings=True, time_step_limit=(0.0, float("inf")), time_step_rank="auto",
    ),
}
# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 query and 8 KV heads, MLP 8192, tied embeddings),
# bfloat16 and 4-bit as mlx-community ships it; the vocabulary is the embedded tokenizer's (128,256 in
# Llama's own).
SHAPED: dict[str, tuple[dict[str, Any], int]] = {
    "llama-1b-4bit": (dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, vocab_size=VOCAB, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True, torch_dtype="bfloat16",
    ), 4),
}
EMBEDDED_AS = ("llama", "qwen2")
KINDS = (*(f"embedded-as-{a}" for a in EMBEDDED_AS), "embedded-8bit", *RANDOM, *SHAPED)
GROUP_SIZE = 64  # mlx-lm's default quantization groups


def _save(folder: Path, model: Any, config: dict[str, Any], tokenizer: Any) -> Path:
    from mlx_lm.utils import save_config, save_model

    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model)
    save_config(config, folder / "config.json")
    tokenizer._tokenizer.save_pretrained(folder)
    return folder


def _as_shipped(model: Any, config: dict[str, Any], bits: int | None) -> tuple[Any, dict[str, Any]]:
    """``model`` cast to its config's ``torch_dtype`` (where it names one) and quantized to ``bits``
    as mlx-lm quantizes (where given)."""
    from mlx_lm.utils import quantize_model

    if "torch_dtype" in config:
        model.set_dtype(getattr(mx, config["torch_dtype"]))
    if bits is not None:
        model, config = quantize_model(model, config, GROUP_SIZE, bits)
    return model, config


def random_model(config: dict[str, Any], folder: Path, tokenizer: Any, bits: int | None = None, seed: int = 0) -> Path:
    """A model of ``config`` (``RANDOM``, ``SHAPED``) with seeded random weights, in the config's
    ``torch_dtype`` and quantized to ``bits`` where given, saved to ``folder``."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    config = dict(config)
    mx.random.seed(seed)
    model, config = _as_shipped(module.Model(module.ModelArgs.from_dict(config)), config, bits)
    mx.eval(model.parameters())
    return _save(folder, model, config, tokenizer)


def embedded_as(arch: str, embedded: Any, folder: Path, dtype: str | None = None, bits: int | None = None) -> Path:
    """The embedded model's weights in mlx-lm's ``arch`` module, llama or qwen2 (dequantized first
    where they were loaded quantized, as on a GPU: ``embedded`` is changed in place then), cast to
    ``dtype`` and quantized to ``bits`` where given."""
    from mlx_lm.utils import dequantize_model

    if any(name.endswith(".scales") for name, _ in tree_flatten(embedded.model.parameters())):
        dequantize_model(embedded.model)

    args = embedded.model.args
    config = dict(
        model_type=arch, hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
        intermediate_size=args.intermediate_size, num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_key_value_heads, rms_norm_eps=args.rms_norm_eps, vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings, rope_theta=args.rope_theta,
        rope_traditional=args.rope_traditional, tie_word_embeddings=args.tie_word_embeddings,
        **({"torch_dtype": dtype} if dtype else {}),
    )
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(embedded.model.parameters()))
    for name, value in tree_flatten(model.parameters()):
        if name.endswith(".bias"):  # qwen2's q/k/v biases: zero, so the same arithmetic as llama
            weights[name] = mx.zeros_like(value)
    model.update(tree_unflatten(list(weights.items())))
    model, config = _as_shipped(model, config, bits)
    mx.eval(model.parameters())
    return _save(folder, model, config, embedded.tokenizer)


def make(kind: str, folder: Path, embedded: Any) -> Path:
    """Write the model ``kind`` (one of ``KINDS``) to ``folder``; ``embedded`` is the loaded default
    model (its tokenizer, and for ``embedded-*`` its weights)."""
    if kind.startswith("embedded-as-") and kind.removeprefix("embedded-as-") in EMBEDDED_AS:
        return embedded_as(kind.removeprefix("embedded-as-"), embedded, folder)
    if kind == "embedded-8bit":
        return embedded_as("llama", embedded, folder, dtype="bfloat16", bits=8)
    if kind in SHAPED:
        return random_model(SHAPED[kind][0], folder, embedded.tokenizer, bits=SHAPED[kind][1])
    if kind not in RANDOM:
        raise ValueError(f"unknown model kind '{kind}' (known: {', '.join(KINDS)})")
    return random_model(RANDOM[kind], folder, embedded.tokenizer)

