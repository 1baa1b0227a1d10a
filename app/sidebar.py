"""The sidebar: conversations newest first (fetched a page at a time), search, new, rename, delete."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QEvent,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import questions
from app.controller import ChatController
from app.conversation_delegate import ConversationDelegate, plain_title, when_label
from engine.store.records import ConversationSummary

PAGE = 200
IdRole = Qt.ItemDataRole.UserRole + 1
GeneratingRole = Qt.ItemDataRole.UserRole + 2
WhenRole = Qt.ItemDataRole.UserRole + 3  # when it was last used, short ("14:02", "Tue", "28 Nov")
SnippetRole = Qt.ItemDataRole.UserRole + 4  # while searching: the matching text
Index = QModelIndex | QPersistentModelIndex


class ConversationListModel(QAbstractListModel):
    """Conversations newest first; pages of 200 are fetched from the store as the view scrolls, so
    10,000 conversations cost what is on screen. With a search text, the store's search results."""

    answered = Signal()  # the store answered a fetch or a reload (the list may have stayed empty)

    def __init__(self, controller: ChatController) -> None:
        super().__init__()
        self.controller = controller
        self.rows: list[ConversationSummary] = []
        self.query = ""
        self._more = True
        self._fetching = False
        self._generation = 0  # answers to an older reload or search are dropped
        self.generating: set[int] = set()
        controller.generatingChanged.connect(self._generating_changed)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self.rows):
            return None
        row = self.rows[index.row()]
        generating = row.id in self.generating
        if role == Qt.ItemDataRole.DisplayRole:
            title = plain_title(row.title) if row.title else "New conversation"
            return f"● {title}" if generating else title
        if role == WhenRole:
            return when_label(row.updated_at)
        if role == SnippetRole:
            return " ".join(row.snippet.split()) if self.query and row.snippet else ""
        if role == Qt.ItemDataRole.ToolTipRole:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.updated_at))
            extra = f"\n{' '.join(row.snippet.split())}" if row.snippet else ""
            return f"{row.title or 'New conversation'}\n{row.messages} messages · {when}" + (
                "\nGenerating now" if generating else "") + extra
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return (row.title or "New conversation") + (", generating" if generating else "")
        if role == IdRole:
            return row.id
        if role == GeneratingRole:
            return generating
        return None

    def canFetchMore(self, parent: Index = QModelIndex()) -> bool:  # noqa: B008
        return not parent.isValid() and not self.query and self._more and not self._fetching

    def fetchMore(self, parent: Index = QModelIndex()) -> None:  # noqa: B008
        if not self.canFetchMore(parent):
            return
        self._fetching = True
        gen = self._generation
        self.controller.list_conversations(len(self.rows), PAGE, lambda rows: self._append(gen, rows))

    def _append(self, gen: int, rows: list[ConversationSummary]) -> None:
        if gen != self._generation:
            return
        self._fetching = False
        self._more = len(rows) == PAGE
        if rows:
            self.beginInsertRows(QModelIndex(), len(self.rows), len(self.rows) + len(rows) - 1)
            self.rows.extend(rows)
            self.endInsertRows()
        self.answered.emit()

    def reload(self) -> None:
        """Fetch again from the top (the order changed), keeping as many rows as were loaded."""
        self._generation += 1  # supersedes any fetch in flight
        self._fetching = False
        gen = self._generation
        if self.query:
            self.controller.search(self.query, lambda rows: self._replace(gen, rows, more=False))
        else:
            n = max(PAGE, len(self.rows))
            self.controller.list_conversations(0, n, lambda rows: self._replace(gen, rows, more=len(rows) == n))

    def set_query(self, text: str) -> None:
        self.query = text.strip()
        self.reload()

    def _replace(self, gen: int, rows: list[ConversationSummary], more: bool) -> None:
        if gen != self._generation:
            return
        self.beginResetModel()
        self.rows = rows
        self._more = more
        self._fetching = False
        self.endResetModel()
        self.answered.emit()

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, r in enumerate(self.rows) if r.id == conversation_id), -1)

    def _generating_changed(self, ids: set[int]) -> None:
        changed = self.generating ^ set(ids)
        self.generating = set(ids)
        for cid in changed:
            i = self.row_of(cid)
            if i >= 0:
                self.dataChanged.emit(self.index(i), self.index(i))


class Sidebar(QWidget):
    """Search box, New button and the conversation list, with rename and delete on a context menu."""

    conversationSelected = Signal(int)
    newRequested = Signal()
    conversationDeleted = Signal(int)

    def __init__(self, controller: ChatController) -> None:
        super().__init__()
        self.controller = controller
        self.model = ConversationListModel(controller)
        self.search = QLineEdit(placeholderText="Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search conversations")
        self.new_button = QPushButton("New")
        self.new_button.setAccessibleName("New conversation")
        self.new_button.setToolTip(f"New conversation ({QKeySequence(QKeySequence.StandardKey.New).toString()})")
        self.list = QListView()
        self.list.setAccessibleName("Conversations")
        self.list.setModel(self.model)
        self.list.setUniformItemSizes(True)  # cheap layout for thousands of rows (a search's rows are all two lines)
        self.list.setItemDelegate(ConversationDelegate(WhenRole, SnippetRole))
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles elide
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.selectionModel().currentChanged.connect(self._current_changed)
        self.shown_id: int | None = None  # the conversation the window shows: kept selected across reloads
        self.rename_dialog: QInputDialog | None = None
        self.model.modelReset.connect(self._reselect)
        self.model.rowsInserted.connect(lambda *_a: self._reselect())

        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(self.new_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 0, 8)
        self.no_results = QLabel()
        self.no_results.setAccessibleName("Search results")
        self.no_results.setWordWrap(True)
        self.no_results.setStyleSheet("color: palette(placeholder-text); padding: 8px;")
        self.no_results.hide()
        layout.addLayout(top)
        layout.addWidget(self.no_results)
        layout.addWidget(self.list, 1)
        self.model.answered.connect(self._show_no_results)

        self.search.installEventFilter(self)  # Esc clears the search (before the window's Stop takes it)
        self._debounce = QTimer(self, singleShot=True, interval=150)  # search as one types, not per key
        self._debounce.timeout.connect(lambda: self.model.set_query(self.search.text()))
        self.search.textChanged.connect(lambda _t: self._debounce.start())
        self.new_button.clicked.connect(self.newRequested)
        controller.conversationsChanged.connect(self.model.reload)
        self.delete_action = QAction("Delete Conversation…", self)
        self.delete_action.setShortcut(QKeySequence.StandardKey.Delete)
        self.delete_action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.delete_action.triggered.connect(self.delete_current)
        self.list.addAction(self.delete_action)
        self.model.fetchMore()

    def current_id(self) -> int | None:
        idx = self.list.currentIndex()
        return idx.data(IdRole) if idx.isValid() else None

    def select(self, conversation_id: int) -> None:
        """Select (and so open) a conversation."""
        self.shown_id = conversation_id
        i = self.model.row_of(conversation_id)
        if i >= 0:
            self.list.setCurrentIndex(self.model.index(i))

    def mark_shown(self, conversation_id: int | None) -> None:
        """The window shows this conversation (or a new, unsaved one): highlight it, open nothing."""
        self.shown_id = conversation_id
        self._reselect()

    def _reselect(self) -> None:
        i = self.model.row_of(self.shown_id) if self.shown_id is not None else -1
        current = self.list.currentIndex()
        if i < 0:
            if current.isValid():
                self.list.selectionModel().clearCurrentIndex()
                self.list.clearSelection()
        elif current.row() != i:
            self.list.selectionModel().blockSignals(True)  # a reselection opens nothing
            self.list.setCurrentIndex(self.model.index(i))
            self.list.selectionModel().blockSignals(False)
            self.list.viewport().update()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.search and isinstance(event, QKeyEvent) and event.key() == Qt.Key.Key_Escape \
                and self.search.text():
            if event.type() == QEvent.Type.ShortcutOverride:
                event.accept()  # the key goes to the search box, not to a shortcut
                return True
            if event.type() == QEvent.Type.KeyPress:
                self.search.clear()
                return True
        return super().eventFilter(watched, event)

    def _show_no_results(self) -> None:
        """Say why the list is empty: a search that found nothing, or no conversation yet."""
        none = not self.model.rows
        if self.model.query:
            self.no_results.setText(f"No conversation mentions “{self.model.query}”." if none else "")
        else:
            self.no_results.setText("No conversations yet: your first message starts one." if none else "")
        self.no_results.setVisible(none)

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self.shown_id = current.data(IdRole)
            self.conversationSelected.emit(self.shown_id)

    def _menu(self, pos: Any) -> None:
        idx = self.list.indexAt(pos)
        if not idx.isValid():
            return
        cid = idx.data(IdRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(cid))
        menu.addAction("Delete…", lambda: self.delete(cid))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def rename(self, conversation_id: int) -> None:
        i = self.model.row_of(conversation_id)  # -1 when a search hides it: start from an empty title
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Rename Conversation")
        dialog.setLabelText("Title:")
        dialog.setTextValue(self.model.rows[i].title if i >= 0 else "")
        dialog.resize(max(480, dialog.sizeHint().width()), dialog.sizeHint().height())  # a long title fits
        self.rename_dialog = dialog  # for tests and accessibility tools: the open dialog
        try:
            if dialog.exec() and dialog.textValue().strip():
                self.controller.rename(conversation_id, dialog.textValue().strip())
        finally:
            self.rename_dialog = None

    def delete_current(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.delete(cid)

    def delete(self, conversation_id: int, confirm: bool = True) -> None:
        i = self.model.row_of(conversation_id)
        what = (f"“{self.model.rows[i].title or 'New conversation'}” and its {self.model.rows[i].messages} messages"
                if i >= 0 else "this conversation")
        if confirm and not questions.confirm(self, "Delete Conversation", f"Delete {what}? This cannot be undone.",
                                             "Delete"):
            return
        self.controller.delete(conversation_id, lambda: self.conversationDeleted.emit(conversation_id))
