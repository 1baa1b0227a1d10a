"""Preferences: the JSON file round-trips, damage never crashes or overwrites, limits are named."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from app import preferences as prefs_mod
from app.preferences import (
    Preferences,
    config_dir,
    data_dir_problem,
    load_preferences,
    looks_like_path,
    model_kind,
    save_preferences,
)
from engine.service.session import ReplySettings


def test_saved_preferences_load_back_equal(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    prefs = Preferences(model=str(model), system_prompt="Be brief.\nÜnïcode ok.", temperature=0.7, top_p=0.9,
                        max_tokens=2048, own_copy_rates="off", recall_other_conversations=False,
                        data_dir=str(tmp_path / "data"), show_origins=True, window_geometry="AdnQywAD")
    path = tmp_path / "nested" / "folder" / "preferences.json"
    save_preferences(prefs, path)
    assert load_preferences(path) == (prefs, [])
    assert json.loads(path.read_text("utf-8"))["version"] == prefs_mod.FORMAT_VERSION
    assert [p.name for p in path.parent.iterdir()] == ["preferences.json"]  # no temp file left behind


def test_the_default_path_is_in_the_config_folder(settings_dir: Path) -> None:
    save_preferences(Preferences(max_tokens=64))
    assert (settings_dir / "preferences.json").is_file()
    assert load_preferences()[0].max_tokens == 64


def test_saving_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "preferences.json"
    save_preferences(Preferences(system_prompt="x" * 10_000), path)
    save_preferences(Preferences(system_prompt="short"), path)
    assert load_preferences(path)[0].system_prompt == "short"


def test_a_missing_file_gives_the_defaults_quietly(tmp_path: Path) -> None:
    assert load_preferences(tmp_path / "absent.json") == (Preferences(), [])
    assert not (tmp_path / "absent.json").exists()


@pytest.mark.parametrize("raw", [b"{\"temperature\": 0.5,", b"\xff\xfe\x00garbage", b"", b"[1, 2]", b"null"])
def test_a_damaged_file_gives_defaults_a_warning_and_stays_untouched(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "preferences.json"
    path.write_bytes(raw)
    prefs, warnings = load_preferences(path)
    assert prefs == Preferences()
    assert len(warnings) == 1 and str(path) in warnings[0] and "defaults" in warnings[0]
    assert path.read_bytes() == raw


def test_an_unreadable_file_gives_defaults_and_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "preferences.json"
    path.mkdir()  # reading a folder fails even for root
    prefs, warnings = load_preferences(path)
    assert prefs == Preferences()
    assert len(warnings) == 1 and "Could not read" in warnings[0] and str(path) in warnings[0]


BAD_VALUES = {
    "model": 3,
    "system_prompt": ["a"],
    "temperature": "hot",
    "top_p": True,
    "max_tokens": 12.5,
    "own_copy_rates": False,
    "recall_other_conversations": "yes",
    "data_dir": {"a": 1},
    "show_origins": 1,
    "window_geometry": 7,
    "export_dir": 1.5,
    "theme": 0,
    "text_scale": "big",
    "show_sidebar": "no",
}


def test_every_field_has_a_wrong_type_case() -> None:
    assert set(BAD_VALUES) == {f.name for f in dataclasses.fields(Preferences)}


@pytest.mark.parametrize(("name", "bad"), BAD_VALUES.items())
def test_a_wrong_typed_field_gets_its_default_and_the_others_survive(tmp_path: Path, name: str, bad: object) -> None:
    good = {"system_prompt": "kept", "max_tokens": 99, "show_origins": True}
    good.pop(name, None)
    path = tmp_path / "preferences.json"
    path.write_text(json.dumps({**good, name: bad}))
    prefs, warnings = load_preferences(path)
    assert getattr(prefs, name) == getattr(Preferences(), name)
    assert all(getattr(prefs, k) == v for k, v in good.items())
    assert len(warnings) == 1 and name in warnings[0] and "default" in warnings[0]


@pytest.mark.parametrize(("name", "bad"), [("temperature", 9), ("top_p", 0), ("max_tokens", 0),
                                           ("max_tokens", 100_000), ("own_copy_rates", "sometimes")])
def test_an_out_of_range_field_gets_its_default_with_the_limit_named(tmp_path: Path, name: str, bad: object) -> None:
    path = tmp_path / "preferences.json"
    path.write_text(json.dumps({name: bad}))
    prefs, warnings = load_preferences(path)
    assert prefs == Preferences()
    assert len(warnings) == 1 and "must be" in warnings[0]


def test_loading_accepts_whole_numbers_for_floats_and_ignores_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "preferences.json"
    path.write_text(json.dumps({"temperature": 1, "top_p": 1, "future_setting": [1], "version": 99}))
    prefs, warnings = load_preferences(path)
    assert (prefs.temperature, prefs.top_p, warnings) == (1.0, 1.0, [])
    assert isinstance(prefs.temperature, float)


def test_defaults_are_valid() -> None:
    assert Preferences().validate() == []


@pytest.mark.parametrize(("change", "words"), [
    ({"temperature": -0.1}, ["Temperature", "0", "2"]),
    ({"temperature": 2.5}, ["Temperature", "2.5"]),
    ({"top_p": 0.0}, ["Top-p", "more than 0", "at most 1"]),
    ({"top_p": 1.01}, ["Top-p", "1.01"]),
    ({"max_tokens": 0}, ["Max tokens", "1", "8192"]),
    ({"max_tokens": 8193}, ["Max tokens", "8193"]),
    ({"own_copy_rates": "always"}, ["Own copy rates", "family", "on", "off", "always"]),
    ({"model": "~/no/such/model"}, ["Model", "~/no/such/model", "not found"]),
    ({"model": "missing.gguf"}, ["Model", "missing.gguf", "not found"]),
    ({"model": "nobody/does-not-exist"}, ["Model", "nobody/does-not-exist", "Hugging Face cache", "never downloads"]),
    ({"data_dir": "relative/folder"}, ["Data folder", "relative/folder", "absolute"]),
])
def test_validate_names_the_setting_and_its_limit(change: dict[str, object], words: list[str]) -> None:
    problems = dataclasses.replace(Preferences(), **change).validate()
    assert len(problems) == 1
    assert all(w in problems[0] for w in words), problems[0]


def test_the_limits_themselves_are_valid() -> None:
    for change in ({"temperature": 0.0}, {"temperature": 2.0}, {"top_p": 0.01}, {"max_tokens": 1},
                   {"max_tokens": 8192}, {"own_copy_rates": "on"}):
        assert dataclasses.replace(Preferences(), **change).validate() == [], change


def test_a_hugging_face_repo_id_is_not_a_path() -> None:
    assert not looks_like_path("HuggingFaceTB/SmolLM2-360M-Instruct")
    assert all(looks_like_path(s) for s in ("./m", "~/m", "/abs/m", "a/b/c", "x.gguf", "owner/x.gguf"))
    assert model_kind(None) == model_kind("embedded") == "embedded"
    assert model_kind("/models/x") == "path"
    assert model_kind("owner/name") == "hub"


def test_existing_model_paths_are_fine_and_folders_without_a_model_are_not(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert Preferences(model=str(tmp_path / "m.gguf")).validate() == []
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04")
    assert "not a GGUF file" in Preferences(model=str(tmp_path / "not.gguf")).validate()[0]
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "no config.json" in Preferences(model=str(folder)).validate()[0]
    (folder / "config.json").write_text("{}")
    assert "no weights" in Preferences(model=str(folder)).validate()[0]
    (folder / "model.safetensors").write_bytes(b"")
    assert Preferences(model=str(folder)).validate() == []


def test_the_data_folder_must_be_creatable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert data_dir_problem(str(tmp_path / "new" / "deeper")) is None
    assert data_dir_problem(str(tmp_path)) is None
    assert "is a file" in (data_dir_problem(str(blocker)) or "")
    problem = data_dir_problem(str(blocker / "below"))
    assert problem and "cannot be created" in problem and str(blocker) in problem
    assert not (tmp_path / "new").exists()  # checking creates nothing
    problems = Preferences(data_dir=str(blocker / "below")).validate()
    assert len(problems) == 1 and "Data folder" in problems[0]


def test_the_config_folder_follows_environment_then_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LANES_CONFIG_DIR", str(tmp_path / "env"))
    assert config_dir() == tmp_path / "env"
    monkeypatch.delenv("LANES_CONFIG_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert config_dir() == tmp_path / "home" / "Library" / "Preferences" / "Lanes"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("APPDATA", str(tmp_path / "appdata"))
    assert config_dir() == tmp_path / "appdata" / "Lanes"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "lanes"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")
    assert config_dir() == tmp_path / "home" / ".config" / "lanes"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_dir() == tmp_path / "home" / ".config" / "lanes"


@pytest.mark.parametrize(("own", "flag"), [("family", None), ("on", True), ("off", False)])
def test_reply_settings_carry_the_reply_fields(own: str, flag: bool | None) -> None:
    prefs = Preferences(temperature=0.8, top_p=0.95, max_tokens=300, own_copy_rates=own)
    assert prefs.reply_settings() == ReplySettings(max_tokens=300, temperature=0.8, top_p=0.95, own_copy_rates=flag)


def test_reply_settings_refuse_an_unknown_own_copy_rates() -> None:
    with pytest.raises(ValueError, match="Own copy rates"):
        Preferences(own_copy_rates="maybe").reply_settings()
