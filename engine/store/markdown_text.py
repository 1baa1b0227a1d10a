"""Chat text as Markdown, the way the window shows it, for the window and for HTML transcripts.

``with_line_breaks`` keeps a chat's single line breaks (the window applies it before Qt's Markdown
importer); ``to_html`` renders a message for a transcript the same way: GitHub tables and
strikethrough, fenced code coloured by pygments (inline styles: the page stays self-contained), raw
HTML shown as text, links only to web and mail addresses.
"""

from __future__ import annotations

from functools import lru_cache

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

SAFE_LINKS = ("http:", "https:", "mailto:")


def with_line_breaks(text: str) -> str:
    """Markdown where each single line break of ``text`` stays a line break, as people mean it in a
    chat (a poem, an address), where CommonMark would join the lines into one paragraph: a line
    followed by another non-blank line gets a hard break (two trailing spaces). Fenced code and
    table rows are left as they are.

    Worked example: "Roses\\nViolets\\n\\nNew paragraph" becomes "Roses  \\nViolets\\n\\nNew paragraph".
    """
    lines = text.split("\n")
    fence = ""
    for i, line in enumerate(lines[:-1]):
        bare = line.strip()
        if fence:
            if bare.startswith(fence):
                fence = ""
            continue
        if bare.startswith(("```", "~~~")):
            fence = bare[:3]
            continue
        following = lines[i + 1].strip()
        if bare and following and "|" not in line and not line.endswith(("  ", "\\")):
            lines[i] = line + "  "
    return "\n".join(lines)


def _code(code: str, language: str, _attrs: str) -> str:
    try:
        lexer = get_lexer_by_name(language.split()[0]) if language.strip() else None
    except ClassNotFound:
        lexer = None
    if lexer is None:
        return ""  # markdown-it escapes it as plain code
    return highlight(code, lexer, HtmlFormatter(nowrap=True, noclasses=True))


@lru_cache(maxsize=1)
def _renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "highlight": _code}).enable(["table", "strikethrough"])
    md.validateLink = lambda url: url.strip().lower().startswith(SAFE_LINKS)  # type: ignore[method-assign]
    return md


def to_html(text: str) -> str:
    """A message's Markdown as an HTML fragment: every piece of its text escaped, no raw HTML."""
    return _renderer().render(with_line_breaks(text))
