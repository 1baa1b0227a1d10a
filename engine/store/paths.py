"""Where Lanes keeps its database: ``--data-dir``, else ``$LANES_DATA_DIR``, else the platform's folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "LANES_DATA_DIR"
DB_NAME = "lanes.db"


def default_data_dir() -> Path:
    """The platform's application data folder for Lanes.

    macOS ``~/Library/Application Support/Lanes``; Windows ``%APPDATA%\\Lanes``; elsewhere
    ``$XDG_DATA_HOME/lanes`` (``~/.local/share/lanes`` when unset or not absolute, as the XDG spec says).
    """
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Lanes"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming") / "Lanes"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "share"
    return base / "lanes"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The folder to use: an explicit override, then ``$LANES_DATA_DIR``, then the default."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(ENV_VAR, "")
    return Path(env).expanduser() if env else default_data_dir()


def database_path(override: str | os.PathLike[str] | None = None) -> Path:
    return data_dir(override) / DB_NAME
