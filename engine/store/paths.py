"""Where Lanes keeps its database: ``--data-dir``, else ``$LANES_DATA_DIR``, else the platform's folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "LANES_DATA_DIR"
DB_NAME = "lanes.db"


def platform_folder(mac: str, xdg_var: str, xdg_default: str) -> Path:
    """Lanes' folder of one kind on this platform: macOS ``~/Library/<mac>/Lanes``; Windows
    ``%APPDATA%\\Lanes``; elsewhere ``$<xdg_var>/lanes``, or ``~/<xdg_default>/lanes`` when the variable is
    unset or not absolute (as the XDG spec says)."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / mac / "Lanes"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming") / "Lanes"
    xdg = os.environ.get(xdg_var, "")
    return (Path(xdg) if xdg and Path(xdg).is_absolute() else home / xdg_default) / "lanes"


def default_data_dir() -> Path:
    """``~/Library/Application Support/Lanes``, ``%APPDATA%\\Lanes`` or ``$XDG_DATA_HOME/lanes``."""
    return platform_folder("Application Support", "XDG_DATA_HOME", ".local/share")


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The folder to use: an explicit override, then ``$LANES_DATA_DIR``, then the default."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(ENV_VAR, "")
    return Path(env).expanduser() if env else default_data_dir()


def database_path(override: str | os.PathLike[str] | None = None) -> Path:
    return data_dir(override) / DB_NAME
