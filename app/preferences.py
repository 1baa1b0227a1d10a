"""The user's settings, kept as JSON in the platform's config folder (no Qt here, so the CLI and tests
can read them too).

Loading never fails and never writes: a missing file gives the defaults; a damaged file, or a field of
the wrong type or out of range, gives the defaults for what could not be used plus a warning to show
the user. The file is only replaced, atomically, when the user saves settings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import reprlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.errors import ModelLoadError
from engine.model.locate import EMBEDDED, locate_model
from engine.service.session import ReplySettings
from engine.store.paths import platform_folder

CONFIG_ENV_VAR = "LANES_CONFIG_DIR"
FILE_NAME = "preferences.json"
FORMAT_VERSION = 1

TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.0, 1.0)  # exclusive below, inclusive above: top-p 0 would keep no token
MAX_TOKENS_RANGE = (1, 8192)
OWN_COPY_RATES = ("family", "on", "off")
THEMES = ("system", "light", "dark")
TEXT_SCALE_RANGE = (0.6, 2.5)
_OWN_COPY_RATES_FLAG: dict[str, bool | None] = {"family": None, "on": True, "off": False}

# "owner/name" as Hugging Face spells repo ids: what engine.model.loading looks up in the cache, not a path.
_REPO_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")

ModelKind = Literal["embedded", "path", "hub"]


@dataclass
class Preferences:
    """What the settings dialog edits; ``None`` means "the built-in default" where allowed."""

    model: str | None = None  # None: the embedded SmolLM2; else a path or a Hugging Face repo id
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    own_copy_rates: str = "family"  # "family" | "on" | "off"
    recall_other_conversations: bool = True
    data_dir: str | None = None  # None: engine.store.paths decides ($LANES_DATA_DIR or the platform's)
    show_origins: bool = False
    window_geometry: str | None = None  # base64 of the window's saveGeometry(), opaque here
    export_dir: str | None = None  # the folder of the last export: the next one starts there
    theme: str = "system"  # "system" | "light" | "dark" (app/appearance.py)
    text_scale: float = 1.0  # the chat's text size, View > Zoom In / Out
    show_sidebar: bool = True  # View > Show Sidebar

    def reply_settings(self) -> ReplySettings:
        """The engine's settings for a new reply ("family" leaves own copy rates to the model family)."""
        if self.own_copy_rates not in _OWN_COPY_RATES_FLAG:
            raise ValueError(_own_copy_rates_problem(self.own_copy_rates))
        return ReplySettings(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                             own_copy_rates=_OWN_COPY_RATES_FLAG[self.own_copy_rates])

    def validate(self) -> list[str]:
        """Problems to show the user, one sentence each naming the setting and its limit; [] when fine."""
        problems = [p for name, check in _VALUE_CHECKS.items() if (p := check(getattr(self, name)))]
        if self.model and (p := model_problem(self.model)):
            problems.append(p)
        if self.data_dir and (p := data_dir_problem(self.data_dir)):
            problems.append(p)
        return problems


# -- single-setting checks (shared by validate, load and the dialog) ---------------------------------

def _temperature_problem(t: float) -> str | None:
    lo, hi = TEMPERATURE_RANGE
    return None if lo <= t <= hi else f"Temperature must be between {lo:g} and {hi:g} (it is {t:g})."


def _top_p_problem(p: float) -> str | None:
    lo, hi = TOP_P_RANGE
    return None if lo < p <= hi else f"Top-p must be more than {lo:g} and at most {hi:g} (it is {p:g})."


def _max_tokens_problem(n: int) -> str | None:
    lo, hi = MAX_TOKENS_RANGE
    return None if lo <= n <= hi else f"Max tokens must be between {lo} and {hi} (it is {n})."


def _own_copy_rates_problem(v: str) -> str | None:
    if v in OWN_COPY_RATES:
        return None
    return f"Own copy rates must be 'family', 'on' or 'off' (it is {reprlib.repr(v)})."


def _theme_problem(theme: str) -> str | None:
    return None if theme in THEMES else f"Theme must be one of {', '.join(THEMES)} (it is {theme!r})."


def _text_scale_problem(scale: float) -> str | None:
    lo, hi = TEXT_SCALE_RANGE
    return None if lo <= scale <= hi else f"Text size must be between {lo:g}x and {hi:g}x (it is {scale:g}x)."


_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "theme": _theme_problem,
    "text_scale": _text_scale_problem,
    "temperature": _temperature_problem,
    "top_p": _top_p_problem,
    "max_tokens": _max_tokens_problem,
    "own_copy_rates": _own_copy_rates_problem,
}


def looks_like_path(spec: str) -> bool:
    """Whether a model spec names a file or folder rather than a Hugging Face repo id.

    A .gguf name, or one with a separator or a leading ``.``/``~``, is a path; ``owner/name`` is a
    repo id even though ``/`` is the separator, as ``engine.model.loading`` reads it.
    """
    if spec.endswith(".gguf"):
        return True
    if _REPO_ID.fullmatch(spec):
        return False
    seps = {"/", os.sep, os.altsep or os.sep}
    return spec.startswith((".", "~")) or any(s in spec for s in seps)


def model_kind(spec: str | None) -> ModelKind:
    """Which of the three ways to name a model ``spec`` is (what the dialog's combo shows)."""
    if not spec or spec == EMBEDDED:
        return "embedded"
    if looks_like_path(spec) or Path(spec).expanduser().exists():
        return "path"
    return "hub"


def model_problem(spec: str) -> str | None:
    """Why the model ``spec`` names cannot be loaded (a missing file or folder, a folder with no model,
    a repo id not in the Hugging Face cache), or None: checked before anything is unloaded."""
    if not spec.strip():
        return "Model path is empty: choose a model folder or a .gguf file."
    try:
        locate_model(spec.strip())
    except ModelLoadError as exc:
        return f"Model {spec.strip()} cannot be used: {exc}."
    return None


def data_dir_problem(folder: str) -> str | None:
    """Why ``folder`` cannot hold the database, or None; checks without creating anything."""
    path = Path(folder).expanduser()
    if not path.is_absolute():
        return f"Data folder {folder} must be an absolute path."
    if path.exists():
        if not path.is_dir():
            return f"Data folder {folder} is a file, not a folder."
        if not os.access(path, os.W_OK | os.X_OK):
            return f"Data folder {folder} is not writable."
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"Data folder {folder} cannot be created: {parent} is a file."
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"Data folder {folder} cannot be created: {parent} is not writable."
    return None


# -- where and how they are stored ---------------------------------------------------------------------

def config_dir() -> Path:
    """``$LANES_CONFIG_DIR``, else the platform's folder for settings.

    macOS ``~/Library/Preferences/Lanes``; Windows ``%APPDATA%\\Lanes``; elsewhere
    ``$XDG_CONFIG_HOME/lanes`` (``~/.config/lanes`` when unset or not absolute, as the XDG spec says).
    """
    env = os.environ.get(CONFIG_ENV_VAR, "")
    if env:
        return Path(env).expanduser()
    return platform_folder("Preferences", "XDG_CONFIG_HOME", ".config")


def preferences_path() -> Path:
    return config_dir() / FILE_NAME


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# field -> (accepts the JSON value, converts it, what the warning says it should be)
_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any], str]] = {
    "model": (lambda v: v is None or isinstance(v, str), lambda v: v or None, "text or null"),
    "system_prompt": (lambda v: isinstance(v, str), str, "text"),
    "temperature": (_is_number, float, "a number"),
    "top_p": (_is_number, float, "a number"),
    "max_tokens": (lambda v: isinstance(v, int) and not isinstance(v, bool), int, "a whole number"),
    "own_copy_rates": (lambda v: isinstance(v, str), str, "text"),
    "recall_other_conversations": (lambda v: isinstance(v, bool), bool, "true or false"),
    "data_dir": (lambda v: v is None or isinstance(v, str), lambda v: v or None, "text or null"),
    "show_origins": (lambda v: isinstance(v, bool), bool, "true or false"),
    "window_geometry": (lambda v: v is None or isinstance(v, str), lambda v: v or None, "text or null"),
    "export_dir": (lambda v: v is None or isinstance(v, str), lambda v: v or None, "text or null"),
    "theme": (lambda v: isinstance(v, str), str, "text"),
    "text_scale": (_is_number, float, "a number"),
    "show_sidebar": (lambda v: isinstance(v, bool), bool, "true or false"),
}


def load_preferences(path: Path | None = None) -> tuple[Preferences, list[str]]:
    """The saved preferences and warnings about anything that could not be used (defaults instead).

    Never raises and never touches the file: a damaged file stays as it is until the user saves.
    """
    path = path or preferences_path()
    defaults = Preferences()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return defaults, []
    except OSError as exc:
        return defaults, [f"Could not read the preferences file {path} ({exc.strerror or exc}); "
                          "using the defaults."]
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return defaults, [f"The preferences file {path} is damaged ({exc}); using the defaults. "
                          "It is left as it is until you save settings."]
    if not isinstance(data, dict):
        return defaults, [f"The preferences file {path} holds {type(data).__name__}, not settings; "
                          "using the defaults. It is left as it is until you save settings."]
    values: dict[str, Any] = {}
    warnings: list[str] = []
    for name, (accepts, convert, kind) in _FIELD_TYPES.items():
        if name not in data:
            continue
        value = data[name]
        default = getattr(defaults, name)
        if not accepts(value):
            warnings.append(f"Preferences: {name} should be {kind}, not {reprlib.repr(value)}; "
                            f"using the default ({default!r}).")
            continue
        value = convert(value)
        check = _VALUE_CHECKS.get(name)
        if check and (problem := check(value)):
            warnings.append(f"Preferences: {problem[:-1]}; using the default ({default!r}).")
            continue
        values[name] = value
    return dataclasses.replace(defaults, **values), warnings


def save_preferences(prefs: Preferences, path: Path | None = None) -> None:
    """Write ``prefs`` to a temporary file beside ``path`` and rename it over, so a crash mid-write
    leaves the old file whole; creates the folder."""
    path = path or preferences_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"version": FORMAT_VERSION, **dataclasses.asdict(prefs)}, indent=2, ensure_ascii=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
