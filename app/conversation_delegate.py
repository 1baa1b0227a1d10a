"""How the sidebar draws a conversation: its title without Markdown marks, elided, with when it was
last used on the right (a time today, a weekday this week, else a date); while searching, the best
matching text under it."""

from __future__ import annotations

import re
import time

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QPainter, QPalette
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

_MARKS = re.compile(r"[`*_~]+|^#+\s*")


def plain_title(title: str) -> str:
    """A title as words: Markdown's code, emphasis and heading marks taken out ("`ls -l` *now*" → "ls -l now")."""
    return " ".join(_MARKS.sub("", title).split()) or title.strip()


def when_label(ts: float, now: float | None = None) -> str:
    """When a conversation was last used, short: "14:02" today, "Tue" within the week, else "28 Nov"
    (with the year when it is another year's)."""
    now = time.time() if now is None else now
    then, today = time.localtime(ts), time.localtime(now)
    if then[:3] == today[:3]:
        return time.strftime("%H:%M", then)
    if 0 <= now - ts < 6 * 86400:
        return time.strftime("%a", then)
    day = f"{then.tm_mday} {time.strftime('%b', then)}"
    return day if then.tm_year == today.tm_year else f"{day} {then.tm_year}"


class ConversationDelegate(QStyledItemDelegate):
    """Paints a row of ``app.sidebar.ConversationListModel`` (its ``WhenRole`` and ``SnippetRole``)."""

    def __init__(self, when_role: int, snippet_role: int) -> None:
        super().__init__()
        self.when_role, self.snippet_role = when_role, snippet_role

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        size = super().sizeHint(option, index)
        line = option.fontMetrics.height()
        return QSize(size.width(), line * (2 if index.data(self.snippet_role) else 1) + 10)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        title, opt.text = opt.text, ""
        style = opt.widget.style() if opt.widget is not None else None
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        text_role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        dim_role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.PlaceholderText
        fm = opt.fontMetrics
        r = opt.rect.adjusted(6, 5, -6, -5)
        when = index.data(self.when_role) or ""
        when_width = fm.horizontalAdvance(when) + 8 if when else 0
        top = QRect(r.left(), r.top(), r.width(), fm.height())
        painter.save()
        painter.setPen(opt.palette.color(dim_role))
        painter.drawText(top, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, when)
        painter.setPen(opt.palette.color(text_role))
        painter.drawText(top.adjusted(0, 0, -when_width, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(title, Qt.TextElideMode.ElideRight, top.width() - when_width))
        snippet = index.data(self.snippet_role)
        if snippet:
            below = top.translated(0, fm.height())
            painter.setPen(opt.palette.color(dim_role))
            painter.drawText(below, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             fm.elidedText(snippet, Qt.TextElideMode.ElideRight, below.width()))
        painter.restore()
