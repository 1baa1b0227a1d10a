"""MessageView and the origin theme, on the real (offscreen) Qt: Markdown without raw HTML, pygments
colours in fenced code, and a height that follows the text (origin tints: test_ui_origin_overlay.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QPoint, Qt, QUrl, Slot
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QImage,
    QPalette,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from app.message_view import MessageView
from app.theme import (
    ORIGIN_LABELS,
    OriginLegend,
    code_background,
    code_font,
    origin_background,
)

CODE = '''Intro.

```python
def f(x):
    """A docstring
    over two lines."""
    return x + 1  # done
```
'''


def stacked_view(qtbot, height: int = 300) -> tuple[QScrollArea, MessageView]:
    """A view stacked in a scroll area 420 px wide, as the chat uses it; the area owns the view."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    holder = QWidget()
    layout = QVBoxLayout(holder)
    v = MessageView()
    layout.addWidget(v)
    layout.addStretch(1)
    area.setWidget(holder)
    qtbot.addWidget(area)
    area.resize(420, height)
    area.show()
    qtbot.waitExposed(area)
    return area, v


@pytest.fixture
def view(qtbot) -> Iterator[MessageView]:
    area, v = stacked_view(qtbot)
    yield v  # the scroll area must outlive the test: it owns the view
    area.close()


def blocks(doc: QTextDocument) -> list:
    out, block = [], doc.begin()
    while block.isValid():
        out.append(block)
        block = block.next()
    return out


def fragments(doc: QTextDocument) -> list[tuple[str, QTextCharFormat]]:
    out = []
    for block in blocks(doc):
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            out.append((fragment.text(), fragment.charFormat()))
            it += 1
    return out


def code_blocks(doc: QTextDocument) -> list:
    return [b for b in blocks(doc) if b.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)]


def highlight_colours(block) -> set[str]:
    """Foreground colours the highlighter put on a block (overlay formats of its layout)."""
    return {
        r.format.foreground().color().name()
        for r in block.layout().formats()
        if r.format.hasProperty(QTextFormat.Property.ForegroundBrush)
    }


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in [
        (QPalette.ColorRole.Window, "#202124"),
        (QPalette.ColorRole.Base, "#202124"),
        (QPalette.ColorRole.Text, "#e8eaed"),
        (QPalette.ColorRole.WindowText, "#e8eaed"),
    ]:
        palette.setColor(role, QColor(colour))
    return palette


def contrast(a: QColor, b: QColor) -> float:
    def luminance(c: QColor) -> float:
        channels = [x / 255 for x in (c.red(), c.green(), c.blue())]
        r, g, b = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in channels]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    hi, lo = sorted([luminance(a), luminance(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_markdown_renders_headings_and_lists(view: MessageView) -> None:
    view.set_markdown("# Title\n\nSome *text*.\n\n- one\n- two\n\n1. first\n")
    bs = blocks(view.document())
    assert [b.text() for b in bs] == ["Title", "Some text.", "one", "two", "first"]
    assert bs[0].blockFormat().headingLevel() == 1
    assert all(b.textList() is not None for b in bs[2:])
    assert bs[1].textList() is None


def test_raw_html_stays_literal_text(view: MessageView) -> None:
    text = "<b>x</b><script>alert(1)</script> <img src=x onerror=alert(1)>"
    view.set_markdown(text)
    assert view.toPlainText() == text
    html = view.toHtml()
    assert "&lt;script" in html and "<script" not in html and "<img" not in html
    assert not any(fmt.isImageFormat() or fmt.fontWeight() > 400 for _, fmt in fragments(view.document()))


def test_python_fence_is_highlighted_with_the_code_font_and_tint(view: MessageView) -> None:
    view.set_markdown(CODE)
    code = code_blocks(view.document())
    assert [b.text() for b in code][:2] == ["def f(x):", '    """A docstring']
    text_colour = view.palette().color(QPalette.ColorRole.Text).name()
    assert highlight_colours(code[0]) - {text_colour}, "no token got a colour"
    # The whole fence is lexed at once: the docstring's second line is all string, like its first.
    (string_colour,) = highlight_colours(code[2])
    assert string_colour in highlight_colours(code[1]) and string_colour != text_colour
    assert [(r.start, r.length) for r in code[2].layout().formats()] == [(0, len(code[2].text()))]
    for block in code:
        assert block.blockFormat().background().color() == code_background(False)
        assert all(fmt.fontFamilies() == code_font().families() for _, fmt in fragments_of(block))


def fragments_of(block) -> list[tuple[str, QTextCharFormat]]:
    out, it = [], block.begin()
    while not it.atEnd():
        out.append((it.fragment().text(), it.fragment().charFormat()))
        it += 1
    return out


def test_unknown_language_and_bare_fences_stay_plain(view: MessageView) -> None:
    view.set_markdown("```nosuchlanguage\nx = 1\n```\n\n```\ny = 2\n```\n")
    code = code_blocks(view.document())
    assert [b.text() for b in code] == ["x = 1", "y = 2"]
    assert all(not highlight_colours(b) for b in code)


def test_plain_text_is_the_text_last_given(view: MessageView) -> None:
    view.set_markdown("**bold** [link](https://example.org)")
    assert view.plain_text() == "**bold** [link](https://example.org)"
    assert view.toPlainText() == "bold link"
    view.set_spans([("a", "model"), ("b", "recall")])
    assert view.plain_text() == "ab"
    view.set_markdown("")
    assert view.plain_text() == ""


def test_height_follows_the_text(view: MessageView, qtbot) -> None:
    view.set_markdown("One line.")
    short = view.height()
    view.set_markdown("One line.\n\n" + "A longer paragraph that has to wrap at this width. " * 20)
    tall = view.height()
    assert tall > short * 3
    assert view.verticalScrollBar().maximum() == 0  # everything shows; nothing scrolls inside
    assert view.sizeHint().height() == tall
    view.window().resize(220, 300)
    qtbot.waitUntil(lambda: view.height() > tall)


def test_streaming_keeps_the_highlighter_and_selection(view: MessageView) -> None:
    # How fast it renders is measured by `make bench-ui`, not asserted here.
    text = (CODE + "\n- a list item with `inline code`\n\n") * 8
    view.set_markdown(text[:40])
    cursor = view.textCursor()
    cursor.setPosition(0)
    cursor.setPosition(5, QTextCursor.MoveMode.KeepAnchor)
    view.setTextCursor(cursor)
    highlighters = view.document().findChildren(QSyntaxHighlighter)
    for end in range(40, len(text) + 1, 12):
        view.set_markdown(text[:end])
    assert view.document().findChildren(QSyntaxHighlighter) == highlighters and len(highlighters) == 1
    assert view.textCursor().selectedText() == "Intro"
    assert view.verticalScrollBar().value() == 0
    assert all(highlight_colours(b) for b in code_blocks(view.document()) if b.text().startswith("def"))


def test_dark_palette_switches_tints_and_code_colours(view: MessageView) -> None:
    view.set_markdown(CODE)
    light_keyword = highlight_colours(code_blocks(view.document())[0])
    view.setPalette(dark_palette())
    code = code_blocks(view.document())
    assert highlight_colours(code[0]) and highlight_colours(code[0]) != light_keyword
    assert code[0].blockFormat().background().color() == code_background(True)
    view.set_spans([("x", "context")])
    assert fragments(view.document())[0][1].background().color() == origin_background("context", True)


class Recorder(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url.toString())


def test_links_open_only_for_web_and_mail_and_the_message_stays(view: MessageView) -> None:
    recorder = Recorder()
    schemes = ["https", "mailto", "file", "ftp"]
    for scheme in schemes:
        QDesktopServices.setUrlHandler(scheme, recorder, "open")
    try:
        view.set_markdown("[a](https://example.org) [b](file:///etc/passwd)")
        for url in ["https://example.org", "mailto:a@example.org", "file:///etc/passwd", "ftp://x.org/f"]:
            view.anchorClicked.emit(QUrl(url))
    finally:
        for scheme in schemes:
            QDesktopServices.unsetUrlHandler(scheme)
    assert recorder.urls == ["https://example.org", "mailto:a@example.org"]
    assert view.toPlainText() == "a b"


def test_images_in_markdown_are_never_loaded(view: MessageView, tmp_path: Path) -> None:
    picture = tmp_path / "secret.png"
    image = QImage(8, 8, QImage.Format.Format_RGB32)
    image.fill(QColor("red"))
    assert image.save(str(picture))
    url = QUrl.fromLocalFile(str(picture))
    view.set_markdown(f"![secret]({url.toString()})")
    view.grab()  # lays out and paints, which is when Qt asks for image resources
    loaded = view.document().resource(QTextDocument.ResourceType.ImageResource, url)
    assert isinstance(loaded, QImage) and loaded.isNull()


def test_view_is_frameless_transparent_and_named(view: MessageView) -> None:
    assert view.isReadOnly() and view.frameShape() == view.Shape.NoFrame
    assert not view.viewport().autoFillBackground()
    assert view.verticalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    assert view.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAsNeeded  # a wide table only
    assert view.accessibleName() == "Message text" and view.accessibleDescription()
    assert not view.openLinks() and not view.openExternalLinks()
    assert view.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse


@pytest.mark.parametrize("origin", ["context", "recall"])
def test_origin_tints_read_well_in_light_and_dark(origin: str) -> None:
    light, dark = origin_background(origin, False), origin_background(origin, True)
    assert light is not None and dark is not None
    assert contrast(light, QColor("black")) >= 7 and contrast(dark, QColor("white")) >= 7
    assert light.lightness() >= 128 > dark.lightness()


def test_model_text_has_no_tint_and_the_two_tints_differ() -> None:
    assert origin_background("model", False) is None and origin_background("model", True) is None
    assert origin_background("unknown", False) is None
    for dark in (False, True):
        assert origin_background("context", dark) != origin_background("recall", dark)


def test_legend_shows_each_origin_as_its_tinted_text(qtbot) -> None:
    legend = OriginLegend()
    qtbot.addWidget(legend)
    legend.show()
    qtbot.waitExposed(legend)
    labels = legend.findChildren(QLabel)
    assert [label.text() for label in labels] == list(ORIGIN_LABELS.values())
    assert all(label.accessibleName() and label.isVisible() for label in labels)
    assert legend.accessibleName()
    picture = legend.grab().toImage()
    for origin in ("context", "recall"):
        corner = legend.labels[origin].geometry().topLeft() + QPoint(3, 3)  # inside the label, off its text
        assert picture.pixelColor(corner * picture.devicePixelRatio()) == origin_background(origin, False)
    model = legend.labels["model"].geometry().topLeft() + QPoint(3, 3)
    assert picture.pixelColor(model * picture.devicePixelRatio()) == legend.palette().color(QPalette.ColorRole.Window)


def test_a_yaml_block_with_token_types_the_style_does_not_list_renders(qtbot) -> None:
    # Pygments' YAML lexer yields Literal.Scalar.Plain, which the styles do not name: the format
    # comes from the nearest parent type instead of raising KeyError mid-stream.
    view = MessageView()
    qtbot.addWidget(view)
    view.set_markdown("```yaml\nserver:\n  host: 0.0.0.0\n  ports: [80, 443]\n```")
    assert "host: 0.0.0.0" in view.document().toPlainText()
