"""Where each origin's text lands in a message once its Markdown is rendered (pure Python, no Qt).

With "Colour by origin" on, a reply is still rendered as Markdown, and each run of its source (a
``(piece, origin)`` span, see ``engine.service.spans``) is tinted where it ended up in the rendered
text. The rendered text is almost a subsequence of the source: markup (``**``, ``#``, fences,
backticks, list markers, table pipes, link targets) disappears and whitespace changes (paragraph and
cell separators, line separators). ``align`` walks the rendered text once and finds each character in
the source a little further on; ``origin_runs`` turns that into ranges of the rendered text per origin.

Worked example::

    spans    = [("Say ", "model"), ("**hi**", "context"), (" now", "model")]
    source   = "Say **hi** now"
    rendered = "Say hi now"
    align(source, rendered)    -> [0, 1, 2, 3, 6, 7, 10, 11, 12, 13]
    origin_runs(spans, rendered) -> [(0, 4, "model"), (4, 6, "context"), (6, 10, "model")]

Each rendered character that is not simply the next source character is looked for in the next
``LOOKAHEAD`` source characters, nearest first. A candidate is taken when only markup lies between the
previous match and it, and the next few rendered characters follow it in the source with only markup
between them; markup being punctuation, digits (list numbers), a fence's language, a link target, an
image, an entity, a task's ``[x]``, but no other text (a letter, an emoji): a rendering drops none.
Failing that, a candidate just ahead, past markup only, is taken. A character with no place (an entity such
as ``&copy;`` shown as ``©``, an image) is left unmapped without moving on, so one mismatch cannot
derail the rest. After ``RESYNC_MISSES`` misses in a row (past a link target longer than the
lookahead, a reference link's definition), the word starting there is searched for in the whole rest
of the source to catch up, and the missed text just before it is matched backwards from there.
Whitespace is placed last: a rendered space, line or paragraph break takes the first source
whitespace between the characters matched on either side of it.

Offsets in ``origin_runs`` are UTF-16 code units, as Qt counts document positions (an emoji is two).
"""

from __future__ import annotations

from collections.abc import Sequence

LOOKAHEAD = 400  # source characters searched for the next rendered one (a table's |---| row, a link target)
CONFIRM = 3  # rendered characters after a candidate that must follow it in the source
SLACK = 64  # markup characters the confirmation may step over (``**``, ``](``, a table's ``|---|---|`` row)
NEAR = 8  # an unconfirmed candidate this close, past markup only, is still taken
RESYNC_MISSES = 3  # rendered characters in a row with no place before the rest of the source is searched
RESYNC_WORD = 4  # shortest word searched for then

# Whitespace in either text, including Qt's paragraph and line separators, nbsp, and frame markers.
_SPACE = frozenset(" \t\n\r\f\v\xa0\u2028\u2029\ufdd0\ufdd1")
# Qt's block and frame boundaries: a run never crosses one, so each run lies inside one block (a
# selection across a table's edge would be widened by Qt to the whole table).
BREAKS = frozenset("\u2029\ufdd0\ufdd1")


def align(source: str, rendered: str) -> list[int]:
    """For each character of ``rendered``, the index of the ``source`` character it shows, or -1."""
    out = [-1] * len(rendered)
    i = j = 0  # the next rendered character to place; the next source character that can be matched
    spaces: list[int] = []  # rendered whitespace waiting for the next match
    misses = 0  # rendered characters in a row with no place
    while i < len(rendered):
        c = rendered[i]
        if c in _SPACE:
            spaces.append(i)
            i += 1
            continue
        k = j if j < len(source) and source[j] == c else _find(source, rendered, i, j)
        caught_up = k < 0 and misses >= RESYNC_MISSES
        if caught_up:
            k = _catch_up(source, rendered, i, j)
        if k < 0:
            misses += 1
            i += 1  # unmapped; j stays, so the next character is looked for from the same place
            continue
        misses = 0
        if spaces:
            _place_spaces(source, j, k, spaces, out)
            spaces = []
        if caught_up:  # the missed text just before is most likely the source just before
            t, u = i - 1, k - 1
            while t >= 0 and u >= j and (rendered[t] == source[u]
                                         or (rendered[t] in _SPACE and source[u] in _SPACE)):
                out[t] = u
                t, u = t - 1, u - 1
        n = _common(rendered, i, source, k)  # most text is copied through unchanged: take it in one go
        out[i:i + n] = range(k, k + n)
        i, j = i + n, k + n
    if spaces:
        _place_spaces(source, j, len(source), spaces, out)
    return out


def origin_runs(spans: Sequence[tuple[str, str]], rendered: str) -> list[tuple[int, int, str]]:
    """``rendered`` cut into ``(start, end, origin)`` runs by the origin of the source text each
    character shows, offsets in UTF-16 units; unmapped characters between two of one origin take it,
    and ``BREAKS`` characters belong to no run."""
    source = "".join(piece for piece, _ in spans)
    owner: list[str] = []
    for piece, origin in spans:
        owner.extend([origin] * len(piece))
    mapping = align(source, rendered)
    origins: list[str | None] = [None if k < 0 else owner[k] for k in mapping]
    last, gap = None, []  # fill gaps (a decoded entity, a line break) between two of one origin
    for i, origin in enumerate(origins):
        if origin is None:
            gap.append(i)
            continue
        if gap and origin == last:
            for g in gap:
                origins[g] = origin
        last, gap = origin, []
    for i, c in enumerate(rendered):
        if c in BREAKS:
            origins[i] = None
    offsets = _utf16_offsets(rendered)
    runs: list[tuple[int, int, str]] = []
    start = 0
    for i in range(1, len(rendered) + 1):
        if i == len(rendered) or origins[i] != origins[start]:
            if origins[start] is not None:
                runs.append((offsets[start], offsets[i], origins[start]))  # type: ignore[arg-type]
            start = i
    return runs


def _find(source: str, rendered: str, i: int, j: int) -> int:
    """Where in ``source`` (from ``j``) rendered character ``i`` comes from; -1 if nowhere clear."""
    c, end = rendered[i], min(len(source), j + LOOKAHEAD)
    first = k = source.find(c, j, end)
    clean = j  # source[j:clean] is known to be only markup; grows with the candidates
    while k >= 0:
        clean = _markup_to(source, clean, k)
        if clean < 0:
            break  # text would be skipped: so would it for any later candidate
        if _followed(source, rendered, i, k):
            return k
        k = source.find(c, k + 1, end)
    if 0 <= first - j < NEAR and _markup_to(source, j, first) >= 0:
        return first
    return -1


def _catch_up(source: str, rendered: str, i: int, j: int) -> int:
    """Where the word starting at rendered ``i`` is next found whole in ``source`` (from ``j``, past
    the lookahead); -1 for a word too short to be telling."""
    end = i
    while end < len(rendered) and rendered[end] not in _SPACE:
        end += 1
    return source.find(rendered[i:end], j) if end - i >= RESYNC_WORD else -1


def _common(a: str, i: int, b: str, j: int) -> int:
    """The length (at least 1) of the common prefix of ``a[i:]`` and ``b[j:]``, given ``a[i] == b[j]``,
    compared in slices that double while they agree and halve when they do not."""
    most = min(len(a) - i, len(b) - j)
    n, step = 1, 16
    while n < most:
        step = min(step, most - n)
        if a[i + n:i + n + step] == b[j + n:j + n + step]:
            n, step = n + step, step * 2
        elif step == 1:
            break
        else:
            step //= 2
    return n


def _followed(source: str, rendered: str, i: int, k: int) -> bool:
    """Whether the next ``CONFIRM`` non-space characters after rendered ``i`` follow source ``k`` in
    order, stepping over whitespace, at most ``SLACK`` markup characters (digits count: list numbers)
    and the letters of markup (a fence's language, a link target); never over other text, which the
    rendering would not have left out."""
    t, u, need, skipped = i + 1, k + 1, CONFIRM, 0
    while need and t < len(rendered):
        c = rendered[t]
        t += 1
        if c in _SPACE:
            continue
        while u < len(source) and source[u] != c:
            if _is_text(source[u]):
                u = _markup_end(source, u)
                if u < 0:
                    return False
                continue
            if source[u] not in _SPACE:
                skipped += 1
                if skipped > SLACK:
                    return False
            u += 1
        if u == len(source):
            return False
        u += 1
        need -= 1
    return True


def _markup_to(source: str, u: int, hi: int) -> int:
    """Where a scan of ``source`` from ``u`` over only markup (no text character outside it) gets to,
    at least ``hi``; -1 when it meets text first."""
    while u < hi:
        if _is_text(source[u]):
            u = _markup_end(source, u)
            if u < 0:
                return -1
        else:
            u += 1
    return u


def _is_text(c: str) -> bool:
    """A letter, or anything outside ASCII (an emoji, CJK) but space: never markup by itself."""
    return c.isalpha() or (c > "\x7f" and c not in _SPACE)


def _markup_end(source: str, u: int) -> int:
    """Where the markup holding text character ``source[u]`` ends: the end of a fence's opening line (its
    language), of a link target, of an image, of an entity (``&copy;``), a task's ``[x]``; -1 when it
    is text."""
    if u and source[u - 1:u + 2] in ("[x]", "[X]"):  # a done task's box
        return u + 2
    start = source.rfind("\n", 0, u) + 1
    if source[start:u].lstrip(" ").startswith(("```", "~~~")):
        end = source.find("\n", u)
        return len(source) if end < 0 else end
    amp = source.rfind("&", max(0, u - 32), u)
    if amp >= 0:
        semi = source.find(";", u, amp + 34)
        if semi >= 0 and source[amp + 1:semi].lstrip("#").isalnum():
            return semi + 1
    target = source.rfind("](", max(0, u - LOOKAHEAD), u)
    if target >= 0 and not any(ch in ") \n" for ch in source[target + 2:u]):
        end = source.find(")", u)
        return -1 if end < 0 else end + 1
    image = source.rfind("![", max(0, u - LOOKAHEAD), u)
    if image >= 0 and "]" not in source[image:u]:  # an image's alt text, shown as the image
        close = source.find("](", u)
        end = -1 if close < 0 else source.find(")", close)
        return -1 if end < 0 else end + 1
    return -1


def _place_spaces(source: str, lo: int, hi: int, spaces: list[int], out: list[int]) -> None:
    """Give each waiting rendered whitespace the next source whitespace in ``source[lo:hi]``, in order."""
    it = iter(spaces)
    i = next(it)
    for k in range(lo, hi):
        if source[k] in _SPACE:
            out[i] = k
            i = next(it, -1)
            if i < 0:
                return


def _utf16_offsets(text: str) -> list[int]:
    """The UTF-16 offset of each character of ``text``, and of its end."""
    if len(text.encode("utf-16-le")) == 2 * len(text):
        return list(range(len(text) + 1))  # no character outside the BMP: offsets are indices
    offsets = [0]
    for c in text:
        offsets.append(offsets[-1] + (2 if ord(c) > 0xFFFF else 1))
    return offsets
