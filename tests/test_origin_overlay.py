"""app.origin_overlay on literal data: where each source character ends up once Markdown is rendered.
The rendered strings are what Qt's Markdown importer makes of the sources (its raw text: U+2029
between blocks, U+FDD0/U+FDD1 around table cells), copied from a run of it."""

from __future__ import annotations

from app.origin_overlay import BREAKS, LOOKAHEAD, align, origin_runs

P, CELL, END = "\u2029", "\ufdd0", "\ufdd1"


def shown(source: str, rendered: str) -> str:
    """The source characters each rendered one was matched to ("?" for unmapped)."""
    return "".join(source[k] if k >= 0 else "?" for k in align(source, rendered))


def tinted(spans: list[tuple[str, str]], rendered: str, origin: str) -> str:
    """The rendered text of ``origin``'s runs, run by run; offsets taken as UTF-16 units."""
    units = rendered.encode("utf-16-le")
    return "|".join(units[2 * a:2 * b].decode("utf-16-le") for a, b, o in origin_runs(spans, rendered) if o == origin)


def test_the_worked_example() -> None:
    spans = [("Say ", "model"), ("**hi**", "context"), (" now", "model")]
    assert align("Say **hi** now", "Say hi now") == [0, 1, 2, 3, 6, 7, 10, 11, 12, 13]
    assert origin_runs(spans, "Say hi now") == [(0, 4, "model"), (4, 6, "context"), (6, 10, "model")]


def test_bold_heading_and_inline_code_markup_is_skipped() -> None:
    source = "# Title\n\nSome **bold** and `code`."
    rendered = f"Title{P}Some bold and code."
    assert shown(source, rendered) == "Title\nSome bold and code."
    spans = [("# Title\n\nSome ", "model"), ("**bold**", "context"), (" and `code`.", "model")]
    assert tinted(spans, rendered, "context") == "bold"


def test_a_list() -> None:
    source = "Steps:\n\n- first step\n- second **step**\n1. numbered\n"
    rendered = f"Steps:{P}first step{P}second step{P}numbered"
    assert shown(source, rendered) == "Steps:\nfirst step\nsecond step\nnumbered"
    spans = [("Steps:\n\n- first step\n- ", "model"), ("second **step**\n1. numbered\n", "context")]
    assert tinted(spans, rendered, "context") == "second step|numbered"  # the separator between is no one's


def test_a_table_and_its_cells() -> None:
    source = "| Name | Value |\n|------|------:|\n| a    | 1     |\n|b|2|\n"
    rendered = f"{CELL}Name{CELL}Value{CELL}a{CELL}1{CELL}b{CELL}2{END}"
    assert [c for c in shown(source, rendered) if c not in " \n|?"] == list("NameValuea1b2")
    spans = [("| Name | Value |\n|------|------:|\n", "model"), ("| a    | 1     |\n", "context"), ("|b|2|\n", "model")]
    assert tinted(spans, rendered, "context") == "a|1"
    assert all(rendered[i] not in BREAKS for a, b, _ in origin_runs(spans, rendered) for i in range(a, b))


def test_a_code_fence_keeps_its_indentation_and_drops_the_fences() -> None:
    source = "Look:\n\n```python\ndef f(x):\n    return x + 1\n```\n\nDone."
    rendered = f"Look:{P}def f(x):{P}    return x + 1{P}Done."
    assert shown(source, rendered) == "Look:\ndef f(x):\n    return x + 1\nDone."
    spans = [("Look:\n\n```python\ndef f(x):\n", "model"), ("    return x + 1\n", "recall"), ("```\n\nDone.", "model")]
    assert tinted(spans, rendered, "recall") == "    return x + 1"


def test_emoji_offsets_are_utf16_units() -> None:
    source = "Hi 😀 **there** 👍🏽 friend"
    rendered = "Hi 😀 there 👍🏽 friend"
    assert shown(source, rendered) == rendered
    spans = [("Hi 😀 ", "model"), ("**there** 👍🏽", "context"), (" friend", "model")]
    runs = origin_runs(spans, rendered)
    assert runs == [(0, 6, "model"), (6, 16, "context"), (16, 23, "model")]  # 😀 is 2 units, 👍🏽 is 4
    assert tinted(spans, rendered, "context") == "there 👍🏽"


def test_a_link_target_and_an_entity_do_not_derail_the_rest() -> None:
    source = "See [the docs](https://example.org/docs) &copy; 2024 and **more** text."
    rendered = "See the docs © 2024 and more text."
    assert shown(source, rendered) == "See the docs ? 2024 and more text."
    spans = [("See [the docs](https://example.org/docs) &copy; 2024 and ", "context"), ("**more** text.", "model")]
    assert tinted(spans, rendered, "context") == "See the docs © 2024 and "  # © sits between two copied chars


def test_a_link_target_longer_than_the_lookahead_is_caught_up_with() -> None:
    url = "https://example.org/" + "x" * (LOOKAHEAD + 50)
    source = f"A [link]({url}) then plain words follow here."
    rendered = "A link then plain words follow here."
    assert shown(source, rendered) == rendered


def test_a_rendered_character_missing_from_the_source_is_left_unmapped() -> None:
    # The "•" is nowhere in the source; the "a" after it must still be the first "a", not a later one.
    assert shown("abc abc", "•abc abc") == "?abc abc"
    assert shown("one two", "one Z two") == "one ??two"  # one source space for two rendered ones


def test_repeated_words_match_in_order() -> None:
    source = "**yes** yes _yes_ yes"
    assert align(source, "yes yes yes yes") == [2, 3, 4, 7, 8, 9, 10, 11, 13, 14, 15, 17, 18, 19, 20]


def test_empty_and_all_model() -> None:
    assert align("", "") == [] and origin_runs([], "") == []
    assert align("**", "") == []
    assert origin_runs([("plain", "model")], "plain") == [(0, 5, "model")]
    assert align("abc", "xyz") == [-1, -1, -1]


def test_text_with_no_source_in_repetitive_text_does_not_derail_the_rest() -> None:
    # A line the rendering added (here a code block's label) between blocks that look alike: each
    # block must still find its own source, not the next block's.
    source = "## S 0\n\n```python\ndef f0(x):\n    return 0\n```\n\n## S 1\n\n```python\ndef f1(x):\n    return 1\n```\n"
    rendered = f"S 0{P}python   Copy{P}def f0(x):{P}    return 0{P}S 1{P}python   Copy{P}def f1(x):{P}    return 1"
    assert shown(source, rendered) == "S 0\npython\n???????def f0(x):\n    return 0\nS 1\npython\n???????def f1(x):\n    return 1"


def test_markup_letters_are_skipped_but_text_is_not() -> None:
    # An image's alt text and target, an entity's name, a task's box: gone from the rendering.
    source = "Logo ![the logo](https://e.org/l.png) here &mdash; - [x] done"
    rendered = "Logo \ufffc here \u2014 done"
    assert shown(source, rendered) == "Logo ? here ? done"
    # A reference link's definition is text to this module: it is caught up with after a few misses,
    # and the words missed on the way are matched backwards from there.
    source = "See [it][1].\n\n[1]: https://example.org/x\n\nAfter the definition."
    rendered = f"See it.{P}After the definition."
    assert shown(source, rendered) == "See it.\nAfter the definition."
