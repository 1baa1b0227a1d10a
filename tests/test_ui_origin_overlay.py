"""Colour by origin on the real (offscreen) Qt: the reply is still rendered as Markdown (headings, lists,
tables, highlighted code with its label) and each origin's tint lies over the text its spans became."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import (
    QColor,
    QPalette,
    QSyntaxHighlighter,
    QTextDocument,
    QTextFormat,
    QTextFragment,
    QTextTable,
)
from PySide6.QtWidgets import QScrollArea

from app.chat_view import MessageWidget
from app.message_view import MARKDOWN_FEATURES, MessageView
from app.origin_overlay import align
from app.theme import ORIGIN_LABELS, origin_background
from engine.store.markdown_text import with_line_breaks
from engine.store.records import Message
from tests.test_ui_message_view import stacked_view

REPLY = [
    ("# Heading\n\nSome **bold** words, then ", "model"),
    ("copied **strong** text", "context"),
    (".\n\n- first item\n- second item\n\n", "model"),
    ("| Name | Value |\n|------|------:|\n| alpha | 1 |\n", "context"),
    ("| beta | 2 |\n\n```python\ndef f(x):\n", "model"),
    ("    return x + 1  # 😀 recalled\n", "recall"),
    ("```\n\nThe end.", "model"),
]
SOURCE = "".join(piece for piece, _ in REPLY)
SPACES = " \t\n\xa0\u2028\u2029\ufdd0\ufdd1"


_AREAS: list[QScrollArea] = []  # each test's scroll areas, which own their views; dropped after it


@pytest.fixture(autouse=True)
def _drop_areas() -> Iterator[None]:
    yield
    for area in _AREAS:
        area.close()
    _AREAS.clear()


def make_view(qtbot) -> MessageView:
    """A view stacked in a scroll area, as the chat uses it, 420 px wide."""
    area, v = stacked_view(qtbot, 600)
    _AREAS.append(area)
    return v


@pytest.fixture
def view(qtbot) -> MessageView:
    return make_view(qtbot)


def blocks(doc: QTextDocument) -> list:
    out, block = [], doc.begin()
    while block.isValid():
        out.append(block)
        block = block.next()
    return out


def fragments(doc: QTextDocument) -> list[QTextFragment]:
    out = []
    for block in blocks(doc):
        it = block.begin()
        while not it.atEnd():
            out.append(it.fragment())
            it += 1
    return out


def tints(doc: QTextDocument) -> list[tuple[str, QColor | None]]:
    """Each fragment's text and its background colour (None: no background)."""
    return [(f.text(), None if f.charFormat().background().style() == Qt.BrushStyle.NoBrush
             else f.charFormat().background().color()) for f in fragments(doc)]


def tinted_text(doc: QTextDocument, origin: str, dark: bool = False) -> str:
    return "".join(text for text, colour in tints(doc) if colour == origin_background(origin, dark))


def structure(doc: QTextDocument) -> list[tuple[str, int, bool, bool]]:
    """Each block's text, heading level, whether it is in a list and whether it is fenced code."""
    return [(b.text(), b.blockFormat().headingLevel(), b.textList() is not None,
             b.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)) for b in blocks(doc)]


def tables(doc: QTextDocument) -> list[QTextTable]:
    return [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]


def test_colours_on_still_render_markdown_with_tints_over_it(qtbot, view: MessageView) -> None:
    view.set_spans(REPLY)
    doc = view.document()
    plain = view.toPlainText()
    assert "**" not in plain and "|" not in plain and "```" not in plain and "#" not in plain.split("\n")[0]
    assert blocks(doc)[0].text() == "Heading" and blocks(doc)[0].blockFormat().headingLevel() == 1
    assert "<table" in doc.toHtml() and len(tables(doc)) == 1
    table = tables(doc)[0]
    assert (table.rows(), table.columns()) == (3, 2)
    assert table.cellAt(1, 0).firstCursorPosition().block().text() == "alpha"
    assert [b.text() for b in blocks(doc) if b.textList() is not None] == ["first item", "second item"]

    # Exactly what colours off shows, block for block, and the same Copy links.
    plain_view = make_view(qtbot)
    plain_view.set_markdown(SOURCE)
    assert structure(doc) == structure(plain_view.document())
    assert view.code_blocks == plain_view.code_blocks == ["def f(x):\n    return x + 1  # 😀 recalled"]
    assert "python   Copy" in [b.text() for b in blocks(doc)]

    # The copied sentence, the copied table rows and the recalled line are tinted; the model's words not.
    assert tinted_text(doc, "context") == "copied strong textNameValuealpha1"
    assert tinted_text(doc, "recall") == "    return x + 1  # 😀 recalled"
    untinted = "".join(text for text, colour in tints(doc) if colour is None)
    for words in ("Heading", "Some ", "bold", "first item", "beta", "def f(x):", "The end.", "python   Copy"):
        assert words in untinted
    strong = next(f for f in fragments(doc) if f.text() == "strong")
    assert strong.charFormat().fontWeight() >= 600  # still bold under its tint
    assert strong.charFormat().toolTip() == ORIGIN_LABELS["context"]


def highlight_colours(block) -> set[str]:
    return {r.format.foreground().color().name() for r in block.layout().formats()
            if r.format.hasProperty(QTextFormat.Property.ForegroundBrush)}


def test_tint_shows_in_a_highlighted_code_block(view: MessageView) -> None:
    view.set_spans(REPLY)
    doc = view.document()
    code = [b for b in blocks(doc) if b.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)]
    assert [b.text() for b in code] == ["def f(x):", "    return x + 1  # 😀 recalled"]
    assert highlight_colours(code[0]) and highlight_colours(code[1])  # pygments' colours kept
    # And painted: the recalled line's tint is on screen, over the code block's own background.
    picture = view.viewport().grab().toImage()
    rect: QRectF = doc.documentLayout().blockBoundingRect(code[1])
    scale = picture.devicePixelRatio()
    tint = origin_background("recall", False)
    found = sum(picture.pixelColor(int(x * scale), int(rect.center().y() * scale)) == tint
                for x in range(int(rect.left()), int(rect.right())))
    assert found > 20


def test_model_only_spans_render_exactly_as_markdown(qtbot, view: MessageView) -> None:
    view.set_spans([(SOURCE, "model")])
    plain_view = make_view(qtbot)
    plain_view.set_markdown(SOURCE)
    assert view.toHtml() == plain_view.toHtml()
    assert all(colour is None for _, colour in tints(view.document()))


def test_streamed_spans_keep_the_highlighter_and_end_tinted(view: MessageView) -> None:
    highlighters = view.document().findChildren(QSyntaxHighlighter)
    for end in range(10, len(SOURCE) + 1, 9):
        pieces, n = [], end
        for piece, origin in REPLY:
            if n > 0:
                pieces.append((piece[:n], origin))
            n -= len(piece)
        view.set_spans(pieces)
    view.set_spans(REPLY)
    assert view.document().findChildren(QSyntaxHighlighter) == highlighters and len(highlighters) == 1
    assert tinted_text(view.document(), "recall") == "    return x + 1  # 😀 recalled"
    assert view.plain_text() == SOURCE


def test_dark_palette_uses_the_dark_tints(view: MessageView) -> None:
    palette = QPalette()
    for role, colour in [(QPalette.ColorRole.Window, "#202124"), (QPalette.ColorRole.Base, "#202124"),
                         (QPalette.ColorRole.Text, "#e8eaed"), (QPalette.ColorRole.WindowText, "#e8eaed")]:
        palette.setColor(role, QColor(colour))
    view.set_spans(REPLY)
    view.setPalette(palette)
    assert tinted_text(view.document(), "context", dark=True) == "copied strong textNameValuealpha1"
    assert tinted_text(view.document(), "context", dark=False) == ""


def test_a_reply_widget_with_colours_on_shows_markdown(qtbot) -> None:
    message = Message(1, 1, "assistant", SOURCE)
    w = MessageWidget(message, lambda m: REPLY, True)
    qtbot.addWidget(w)
    doc = w.view.document()
    assert len(tables(doc)) == 1 and "**" not in w.view.toPlainText()
    assert tinted_text(doc, "context") == "copied strong textNameValuealpha1"
    w.set_show_origins(False)
    assert tinted_text(doc, "context") == "" and len(tables(doc)) == 1


SAMPLES = [
    SOURCE,
    "Plain words only, nothing else.",
    "1. a\n2. b\n3. c\n\n* x\n* y\n  * nested *z*\n\n> quoted **text**\n> more",
    "A [link](https://example.org/a/very/long/path?q=1&r=2) then ~~struck~~ and <https://auto.link/x>.",
    "Setext heading\n==============\n\nText &amp; entities &copy; 2024, escaped \\*stars\\*.\n\n---\n\nAfter a rule.",
    "| Key | Value | Notes |\n|:----|:-----:|------:|\n| 1 | 2 | 3 |\n| four | **five** | `six` |\n\ntext after",
    "~~~js\nconst a = 1;\n~~~\n\n    indented code\n\n```\nbare fence\n```\n\n- [ ] task\n- [x] done",
    "Emoji 😀 in **bold 👍🏽** and a line  \nbreak and `code 😀`.",
    "## Closed heading ##\n\n***both*** and _under_ and <b>raw</b> tag, hard\\\nbreak, 中文 text.\n\n"
    "See [the spec][1] and www.example.com.\n\n[1]: https://spec.example.org/a/b\n\nAfter the definition.",
    "| Cmd | Use |\n|---|---|\n| `a \\| b` | pipe |\n\n2024.\n\n1. one\n\n\tcode\twith tabs",
    "".join(f"## Part {n}\n\nText **{n}** with [l](https://e.org/{n}).\n\n| a | b |\n|---|---|\n| {n} | x |\n\n"
            f"```python\nx = {n}\n```\n\n" for n in range(12)),
]


@pytest.mark.parametrize("text", SAMPLES, ids=range(len(SAMPLES)))
def test_every_character_qt_renders_is_found_in_its_source(text: str) -> None:
    """On what Qt's importer really makes of a reply (as the view imports it, before the code labels
    go in): every rendered character maps to that same source character, in order; only what the
    source spells differently (entities, a task's box) is left out."""
    doc = QTextDocument()
    doc.setMarkdown(with_line_breaks(text), MARKDOWN_FEATURES)
    rendered = doc.toRawText()
    mapping = align(text, rendered)
    placed = [(c, k) for c, k in zip(rendered, mapping, strict=True) if k >= 0]
    assert all(text[k] == c or (c in SPACES and text[k] in SPACES) for c, k in placed)
    assert [k for _, k in placed] == sorted(k for _, k in placed)
    missed = "".join(c for c, k in zip(rendered, mapping, strict=True) if k < 0 and c not in SPACES)
    assert missed == ("©" if "&copy;" in text else "")


def test_every_streamed_prefix_aligns(qtbot) -> None:
    """While a reply streams in, its Markdown is cut anywhere (an open fence, half a table, ``**bo``):
    each prefix must still align, every rendered character placed on that same source character."""
    text = SOURCE + "\n\n" + SAMPLES[3] + "\n\n" + SAMPLES[5]
    doc = QTextDocument()
    for end in range(1, len(text) + 1, 5):
        prefix = text[:end]
        doc.setMarkdown(with_line_breaks(prefix), MARKDOWN_FEATURES)
        rendered = doc.toRawText()
        mapping = align(prefix, rendered)
        wrong = [(c, prefix[k]) for c, k in zip(rendered, mapping, strict=True)
                 if k >= 0 and prefix[k] != c and not (c in SPACES and prefix[k] in SPACES)]
        missed = "".join(c for c, k in zip(rendered, mapping, strict=True) if k < 0 and c not in SPACES)
        assert (wrong, missed) == ([], ""), repr(prefix)
