"""The settings dialog, driven through its real widgets offscreen: it shows what it is given, edits come
back out of preferences(), and OK stays off while a setting is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QWidget,
)

from app.preferences import Preferences
from app.settings_dialog import SettingsDialog
from engine.store import paths


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    return path


def make(qtbot, prefs: Preferences) -> SettingsDialog:
    dialog = SettingsDialog(prefs)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def test_the_dialog_shows_the_given_preferences(qtbot, model_file: Path, tmp_path: Path) -> None:
    prefs = Preferences(model=str(model_file), system_prompt="Answer in French.", temperature=0.7, top_p=0.9,
                        max_tokens=1024, own_copy_rates="on", recall_other_conversations=False,
                        data_dir=str(tmp_path / "data"), show_origins=True, window_geometry="AAAA")
    d = make(qtbot, prefs)
    assert d.model_kind.currentData() == "path"
    assert d.model_path.text() == str(model_file)
    assert d.model_path.isVisible() and not d.model_repo.isVisible()
    assert d.system_prompt.toPlainText() == "Answer in French."
    assert (d.temperature.value(), d.top_p.value(), d.max_tokens.value()) == (0.7, 0.9, 1024)
    assert d.own_copy_rates.currentText() == "On"
    assert not d.recall.isChecked()
    assert d.data_dir.text() == str(tmp_path / "data")
    assert d.ok_button.isEnabled() and not d.problems.isVisible()
    assert d.preferences() == prefs  # nothing edited: the same preferences, hidden fields included


def test_defaults_show_the_embedded_model_and_the_default_data_folder(qtbot) -> None:
    d = make(qtbot, Preferences())
    assert d.model_kind.currentText() == "Embedded SmolLM2-135M"
    assert not d.model_path.isVisible() and not d.model_repo.isVisible()
    assert d.own_copy_rates.currentText() == "Family default"
    assert "0.94" in d.own_copy_rates.toolTip()
    assert d.data_dir.text() == str(paths.data_dir())
    assert d.preferences() == Preferences()  # the default folder is not pinned into the preferences


def test_editing_fields_changes_preferences(qtbot, tmp_path: Path, hf_cache) -> None:
    hf_cache("HuggingFaceTB/SmolLM2-360M-Instruct", {"config.json": b"{}", "model.safetensors": b""})
    d = make(qtbot, Preferences())
    d.system_prompt.setFocus()
    qtbot.keyClicks(d.system_prompt, "Be terse.")
    for spin, text in ((d.temperature, "1.3"), (d.top_p, "0.5"), (d.max_tokens, "256")):
        spin.lineEdit().selectAll()
        qtbot.keyClicks(spin.lineEdit(), text)
    d.own_copy_rates.setCurrentIndex(d.own_copy_rates.findText("Off"))
    qtbot.mouseClick(d.recall, Qt.MouseButton.LeftButton)
    d.data_dir.selectAll()
    qtbot.keyClicks(d.data_dir, str(tmp_path / "elsewhere"))
    d.model_kind.setCurrentIndex(d.model_kind.findData("hub"))
    assert d.model_repo.isVisible()
    qtbot.keyClicks(d.model_repo, "HuggingFaceTB/SmolLM2-360M-Instruct")

    got = d.preferences()
    assert got.system_prompt == "Be terse."
    assert (got.temperature, got.top_p, got.max_tokens) == (1.3, 0.5, 256)
    assert got.own_copy_rates == "off"
    assert got.recall_other_conversations is False
    assert got.data_dir == str(tmp_path / "elsewhere")
    assert got.model == "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert d.ok_button.isEnabled()
    assert got.reply_settings().own_copy_rates is False


def test_a_missing_model_folder_disables_ok_and_names_the_path(qtbot, tmp_path: Path, model_file: Path) -> None:
    d = make(qtbot, Preferences())
    d.model_kind.setCurrentIndex(d.model_kind.findData("path"))
    assert not d.ok_button.isEnabled()  # an empty path is a problem too
    missing = str(tmp_path / "no-such-model")
    qtbot.keyClicks(d.model_path, missing)
    assert not d.ok_button.isEnabled()
    assert d.problems.isVisible() and missing in d.problems.text()
    d.model_path.setText(str(model_file))
    assert d.ok_button.isEnabled() and not d.problems.isVisible()
    assert d.preferences().model == str(model_file)
    d.model_kind.setCurrentIndex(d.model_kind.findData("embedded"))
    assert d.preferences().model is None


def test_an_empty_repository_disables_ok(qtbot) -> None:
    d = make(qtbot, Preferences())
    d.model_kind.setCurrentIndex(d.model_kind.findData("hub"))
    assert not d.ok_button.isEnabled() and "Hugging Face" in d.problems.text()


def test_a_data_folder_that_cannot_be_created_disables_ok(qtbot, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    d = make(qtbot, Preferences())
    assert d.show_data_dir.isEnabled() == Path(paths.data_dir()).is_dir()
    d.data_dir.setText(str(blocker / "data"))
    assert not d.ok_button.isEnabled() and "Data folder" in d.problems.text()
    assert not d.show_data_dir.isEnabled()  # nothing there to show
    d.data_dir.setText(str(tmp_path))
    assert d.ok_button.isEnabled()
    assert d.show_data_dir.isEnabled() and d.data_folder_url().toLocalFile() == str(tmp_path)


def test_max_tokens_out_of_range_cannot_be_typed(qtbot) -> None:
    d = make(qtbot, Preferences())
    edit = d.max_tokens.lineEdit()
    edit.selectAll()
    qtbot.keyClicks(edit, "9000")
    assert edit.text() == "900"  # the last digit would pass 8192 and is refused
    edit.selectAll()
    qtbot.keyClicks(edit, "99999")
    d.max_tokens.interpretText()
    assert d.max_tokens.value() <= 8192
    edit.selectAll()
    qtbot.keyClicks(edit, "0")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert d.max_tokens.value() >= 1
    assert d.preferences().validate() == []


def test_escape_cancels(qtbot) -> None:
    d = make(qtbot, Preferences())
    with qtbot.waitSignal(d.rejected, timeout=1000):
        qtbot.keyClick(d.model_kind, Qt.Key.Key_Escape)


def test_enter_accepts_when_the_settings_are_valid(qtbot) -> None:
    d = make(qtbot, Preferences())
    assert d.ok_button.isDefault()
    d.data_dir.setFocus()
    with qtbot.waitSignal(d.accepted, timeout=1000):
        qtbot.keyClick(d.data_dir, Qt.Key.Key_Return)


def test_every_control_has_an_accessible_name_and_labels_have_buddies(qtbot) -> None:
    d = make(qtbot, Preferences())
    d.model_kind.setCurrentIndex(d.model_kind.findData("path"))  # every row shown
    kinds = (QLineEdit, QPlainTextEdit, QAbstractSpinBox, QComboBox, QCheckBox, QAbstractButton)
    controls = [w for w in d.findChildren(QWidget)
                if isinstance(w, kinds) and not isinstance(w.parent(), QAbstractSpinBox | QComboBox)]
    assert len(controls) >= 14
    for w in controls:
        name = QAccessible.queryAccessibleInterface(w).text(QAccessible.Text.Name)
        assert name, f"{type(w).__name__} {w.objectName()!r} has no accessible name"
    inputs = [w for w in controls if not isinstance(w, QAbstractButton)]
    assert all(w.accessibleName() for w in inputs)
    buddies = {label.buddy() for label in d.findChildren(QLabel) if label.buddy() is not None}
    assert {d.model_kind, d.model_path, d.model_repo, d.system_prompt, d.temperature, d.top_p, d.max_tokens,
            d.own_copy_rates, d.data_dir} <= buddies
    assert d.buttons.button(QDialogButtonBox.StandardButton.Ok) is d.ok_button


def test_settings_lists_the_models_on_this_machine_and_which_lanes_runs(qtbot, hf_cache) -> None:
    from engine.model.local_models import local_models

    weights = {"model.safetensors": b"\0" * 2048}
    hf_cache("mlx-community/Qwen3-0.6B-4bit", {"config.json": b'{"model_type": "qwen3"}', **weights})
    hf_cache("someone/Future-Arch", {"config.json": b'{"model_type": "no_such_arch"}', **weights})
    hf_cache("someone/PyTorch-Only", {"config.json": b'{"model_type": "llama"}', "pytorch_model.bin": b"\0"})
    found = {m.spec: m for m in local_models()}
    assert list(found) == ["embedded", "mlx-community/Qwen3-0.6B-4bit", "someone/Future-Arch",
                           "someone/PyTorch-Only"]
    assert found["embedded"].supported and found["embedded"].size > 50 * 2**20
    assert (found["mlx-community/Qwen3-0.6B-4bit"].family, found["mlx-community/Qwen3-0.6B-4bit"].supported) == (
        "qwen3", True)
    assert found["mlx-community/Qwen3-0.6B-4bit"].size >= 2048
    assert found["someone/Future-Arch"].why == "mlx-lm has no 'no_such_arch' architecture"
    assert found["someone/PyTorch-Only"].why == "no .safetensors weights (not converted for MLX)"

    d = make(qtbot, Preferences())
    items = [d.on_machine.item(i) for i in range(d.on_machine.count())]
    assert [i.text().split(" — ")[0] for i in items] == ["SmolLM2-135M-Instruct (embedded)", *list(found)[1:]]
    assert items[1].text().endswith("qwen3 · 0 MB") and items[1].flags() & Qt.ItemFlag.ItemIsEnabled
    assert not items[2].flags() & Qt.ItemFlag.ItemIsEnabled and "no 'no_such_arch'" in items[2].toolTip()
    d.on_machine.itemClicked.emit(items[1])
    assert d.model_kind.currentData() == "hub" and d.model_repo.text() == "mlx-community/Qwen3-0.6B-4bit"
    assert d.preferences().model == "mlx-community/Qwen3-0.6B-4bit"
    d.on_machine.itemClicked.emit(items[0])
    assert d.preferences().model is None  # the embedded one


def test_download_fetches_a_model_by_name_with_progress_and_cancel(qtbot, hf_cache, monkeypatch) -> None:
    import os

    from tests.fake_hub import FakeHub

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # the person asked for it
    files = {"config.json": b'{"model_type": "qwen3"}',
             **{f"model-0000{i}-of-00003.safetensors": os.urandom(300_000) for i in (1, 2, 3)}}
    with FakeHub({"someone/Small-Model": files}, chunk=8192, delay=0.02) as hub:  # ~0.75 s a shard: time to cancel
        monkeypatch.setenv("HF_ENDPOINT", hub.url)  # how huggingface_hub is pointed at a mirror
        d = make(qtbot, Preferences())
        d.model_kind.setCurrentIndex(d.model_kind.findData("hub"))
        qtbot.keyClicks(d.model_repo, "someone/Small-Model")
        assert "not in the Hugging Face cache" in d.problems.text()  # nothing is fetched until asked
        assert not [r for r in hub.requests if "/resolve/" in r[1]]
        qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: d.download_progress is not None and d.download_progress.value() >= 300)  # a shard in
        cancel = next(b for b in d.download_progress.findChildren(QPushButton) if b.text() == "Cancel")
        qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)  # the progress dialog's Cancel
        qtbot.waitUntil(lambda: d.download is None)
        assert d.download_status.text().startswith("Download stopped")
        qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)  # again, to the end
        qtbot.waitUntil(lambda: d.download is None, timeout=30000)
    assert d.download_status.text() == "Downloaded someone/Small-Model"
    assert not d.problems.isVisible() and d.ok_button.isEnabled()  # now in the cache
    listed = [d.on_machine.item(i).data(Qt.ItemDataRole.UserRole) for i in range(d.on_machine.count())]
    assert "someone/Small-Model" in listed
