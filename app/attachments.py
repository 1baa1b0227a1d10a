"""Text files put into a message (dropped on the composer, or File > Attach File…): each becomes a
fenced code block under its name, the form a model reads and copy drafts reuse when it edits them."""

from __future__ import annotations

from pathlib import Path

from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

from engine.errors import LanesError

MAX_BYTES = 256 * 1024  # a file of this size is already ~60,000 tokens: more than most contexts hold


def fenced(name: str, text: str) -> str:
    """``text`` as a fenced block labelled with the file's language, under its name; the fence is
    longer than any backtick run inside, so the text cannot close it."""
    try:
        language = get_lexer_for_filename(name, text[:4096]).aliases[0]
    except (ClassNotFound, IndexError):
        language = ""
    run, longest = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"`{name}`:\n{fence}{language}\n{text.rstrip(chr(10))}\n{fence}\n"


def read_text_file(path: Path) -> str:
    """A file's text for a message; a LanesError naming the file says why not (not a file, too big,
    not text)."""
    if not path.is_file():
        raise LanesError(f"{path} is not a file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise LanesError(f"{path.name} is {size / 2**20:.1f} MiB; Lanes attaches text files up to "
                         f"{MAX_BYTES // 1024} KiB")
    data = path.read_bytes()
    if b"\0" in data:
        raise LanesError(f"{path.name} is not a text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LanesError(f"{path.name} is not UTF-8 text (byte {exc.start})") from exc
