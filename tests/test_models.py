"""Model loading: the embedded GGUF, and clear errors for bad models before any compute."""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import pytest

from engine.errors import ModelLoadError
from engine.model.families import Family, family_for
from engine.model.gguf import load_gguf
from engine.model.loading import load_model
from engine.model.locate import embedded_model_path


def _llama_meta(arch: str = "llama") -> dict:
    return {
        "general.architecture": arch,
        "llama.attention.head_count": mx.array(2, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(2, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        "llama.block_count": mx.array(1, dtype=mx.uint32),
        "llama.context_length": mx.array(64, dtype=mx.uint32),
        "llama.embedding_length": mx.array(32, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(64, dtype=mx.uint32),
        "tokenizer.ggml.tokens": ["a", "b", "c", "d"],
    }


def test_embedded_model_file_is_found() -> None:
    path = embedded_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_unsupported_gguf_architecture_names_file_and_arch(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((4, 32))}, _llama_meta("mamba"))
    with pytest.raises(ModelLoadError, match=r"mamba.*not supported") as err:
        load_gguf(path, quantized=False)
    assert str(path) in str(err.value)


def test_unsupported_quantisation_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    # Integer weights without scales: a quantisation MLX's GGUF reader hands over raw.
    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((4, 32), dtype=mx.int8)}, _llama_meta())
    with pytest.raises(ModelLoadError, match="unsupported quantisation"):
        load_gguf(path, quantized=False)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("hello")
    with pytest.raises(ModelLoadError, match=re.escape(str(path))):
        load_gguf(path, quantized=False)


def test_missing_model_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="no-such-model"):
        load_model(str(missing))


def test_hugging_face_name_not_in_cache_never_downloads(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"mlx-community/not-a-real-model.*Hugging Face cache"):
        load_model("mlx-community/not-a-real-model")


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(str(tmp_path))


def test_family_registry() -> None:
    fam = family_for("SmolLM2-135M-Instruct", "llama")
    assert fam.name == "smollm2" and fam.copy_rate == 0.94
    assert fam.min_match["recall"] >= fam.min_match["context"]
    assert family_for("something-else", "mystery").name == "mystery"


def test_a_family_takes_its_settings_for_the_device_it_runs_on() -> None:
    fam = Family("x", own_copy_rates=True, on_device={"cuda": {"own_copy_rates": False, "min_row_value": 0.2}})
    assert fam.for_device("cpu") is fam and fam.for_device("metal") is fam
    cuda = fam.for_device("cuda")
    assert (cuda.own_copy_rates, cuda.min_row_value, cuda.name) == (False, 0.2, "x")
    assert family_for("SmolLM2-135M-Instruct", "llama", "cuda").name == "smollm2"
    with pytest.raises(ValueError, match="unknown device kind 'tpu'"):
        family_for("SmolLM2", "llama", "tpu")


@pytest.mark.model
def test_embedded_model_loads_float32_on_cpu(loaded) -> None:
    assert loaded.device == "cpu"
    assert loaded.model.model.embed_tokens.weight.dtype == mx.float32
    assert loaded.context_length == 8192
    text = "def f(x):\n    return x * 12345  # héllo"
    assert loaded.tokenizer.decode(loaded.tokenizer.encode(text, add_special_tokens=False)) == text
