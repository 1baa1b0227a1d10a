"""Settings' list of the models on this machine beyond the Hugging Face cache: mlx-lm folders and GGUF
files in local model folders ($LANES_MODELS_DIR, LM Studio's, the folder chosen before), read from
their files (a GGUF's architecture from its header) without loading anything."""

from __future__ import annotations

import struct
from pathlib import Path

from PySide6.QtCore import Qt

from app.preferences import Preferences
from engine.model.gguf_header import architecture
from engine.model.local_models import local_models
from engine.model.locate import embedded_model_path
from tests.test_ui_settings import make


def gguf(path: Path, arch: str | None, keys_before: int = 0) -> Path:
    """A GGUF header: ``keys_before`` other keys (an array among them), then general.architecture."""
    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    body = b""
    for i in range(keys_before):  # an array of strings and a uint32, to be stepped over
        body += key(f"x.tokens{i}") + struct.pack("<IIQ", 9, 8, 2) + b"".join(
            struct.pack("<Q", 1) + b"a" for _ in range(2))
        body += key(f"x.count{i}") + struct.pack("<II", 4, 7)
    if arch is not None:
        body += key("general.architecture") + struct.pack("<I", 8) + struct.pack("<Q", len(arch)) + arch.encode()
    n = keys_before * 2 + (arch is not None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, n) + body + b"\0" * 64)
    return path


def mlx_folder(path: Path, model_type: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(f'{{"model_type": "{model_type}"}}')
    (path / "model.safetensors").write_bytes(b"\0" * 4096)
    return path


def test_a_gguf_files_architecture_comes_from_its_header(tmp_path: Path) -> None:
    assert architecture(embedded_model_path()) == "llama"
    assert architecture(gguf(tmp_path / "a.gguf", "qwen2", keys_before=3)) == "qwen2"
    assert architecture(gguf(tmp_path / "b.gguf", None)) is None
    (tmp_path / "c.gguf").write_bytes(b"GGUF\x03\0\0")  # cut short
    assert architecture(tmp_path / "c.gguf") is None
    (tmp_path / "d.gguf").write_text("not a model")
    assert architecture(tmp_path / "d.gguf") is None


def test_models_in_local_folders_are_listed_with_family_size_and_support(qtbot, hf_cache, tmp_path: Path,
                                                                          monkeypatch) -> None:
    shelf = tmp_path / "shelf"
    mlx_folder(shelf / "mlx-community" / "Qwen3-0.6B-4bit", "qwen3")
    gguf(shelf / "bartowski" / "Llama-3.2-1B-GGUF" / "Llama-3.2-1B-Q4_K_M.gguf", "llama", keys_before=2)
    gguf(shelf / "someone" / "Phi-GGUF" / "phi.gguf", "phi3")
    (shelf / "notes").mkdir()
    (shelf / "notes" / "readme.txt").write_text("no model here")
    studio = mlx_folder(Path.home() / ".lmstudio" / "models" / "lmstudio-community" / "Gemma", "gemma3_text")
    chosen = mlx_folder(tmp_path / "elsewhere" / "my-model", "llama")
    monkeypatch.setenv("LANES_MODELS_DIR", str(shelf))

    found = {m.spec: m for m in local_models([chosen])}
    assert list(found) == ["embedded", str(chosen),
                           str(shelf / "bartowski" / "Llama-3.2-1B-GGUF" / "Llama-3.2-1B-Q4_K_M.gguf"),
                           str(shelf / "mlx-community" / "Qwen3-0.6B-4bit"),
                           str(shelf / "someone" / "Phi-GGUF" / "phi.gguf"), str(studio)]
    qwen = found[str(shelf / "mlx-community" / "Qwen3-0.6B-4bit")]
    assert (qwen.family, qwen.supported, qwen.size) == ("qwen3", True, 4096 + len('{"model_type": "qwen3"}'))
    llama = found[str(shelf / "bartowski" / "Llama-3.2-1B-GGUF" / "Llama-3.2-1B-Q4_K_M.gguf")]
    assert (llama.family, llama.supported) == ("llama", True)
    phi = found[str(shelf / "someone" / "Phi-GGUF" / "phi.gguf")]
    assert (phi.family, phi.supported, phi.why) == ("phi3", False, "Lanes loads GGUF files of llama only")
    assert found[str(studio)].family == "gemma3_text"  # LM Studio's folder, found without being named

    d = make(qtbot, Preferences(model=str(chosen)))
    items = {d.on_machine.item(i).data(Qt.ItemDataRole.UserRole): d.on_machine.item(i)
             for i in range(d.on_machine.count())}
    assert list(items) == list(found)
    assert items[str(studio)].text().startswith("Gemma — gemma3_text")
    assert items[str(studio)].text().endswith(" · in ~/.lmstudio/models/lmstudio-community")
    assert items[str(studio)].toolTip() == "~/.lmstudio/models/lmstudio-community/Gemma\nLanes runs it"
    assert not items[str(phi.spec)].flags() & Qt.ItemFlag.ItemIsEnabled
    d.on_machine.itemClicked.emit(items[qwen.spec])
    assert d.model_kind.currentData() == "path" and d.model_path.text() == qwen.spec
    assert d.preferences().model == qwen.spec
