"""The list of past chats beside the transcript: New chat, search, rename in place (F2), delete with undo
(Del, the context menu), and which chats are earlier versions of which (reached from their chat, not listed).

It shows what the chat panel reads from the history and says what the user did by signals; the panel writes
the history.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QSizePolicy,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.storage.history_rows import ChatSummary
from ui.plain_text import plain_tooltip

HISTORY_MIN_WIDTH = 120
API_ROLE = Qt.ItemDataRole.UserRole + 1  # a chat list row's mark: the chat came through the API
UNDO_DELETE_MS = 60_000  # a deleted chat can be brought back this long (or until the next delete)


class ChatList(QWidget):
    chat_chosen = Signal(int)  # a row became the current one: a click, a right-click, the arrow keys
    rename_requested = Signal(int, str)  # a row renamed in place: the chat, its new title ("" for none)
    delete_requested = Signal(int)  # Del, or Delete in the context menu
    search_changed = Signal()
    delete_due = Signal()  # the chat hidden for undo is to be deleted for good now

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.new_chat_button = QPushButton("New chat", self)
        self.search_edit = QLineEdit(self)
        self.search_edit.setPlaceholderText("Search chats")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        self.history_list = QListWidget(self)
        self.labels: dict[int, tuple[str, int]] = {}  # chat id: (title, messages) its row shows
        self.rows_written = 0  # rows whose text was (re)written by a refresh
        self.versions: dict[int, int | None] = {}  # chat id: the chat it is an earlier version of
        self.context_menu: QMenu | None = None
        self.pending_delete: int | None = None  # hidden, and deleted for good unless undone in time
        self.history_list.setMinimumWidth(HISTORY_MIN_WIDTH)
        self.history_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.history_list.setUniformItemSizes(True)  # one line each: the view need not measure every row
        self.history_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # elide instead
        self.history_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.history_list.customContextMenuRequested.connect(self._on_history_list_context_menu_requested)
        self.history_list.currentItemChanged.connect(self._on_history_list_current_item_changed)
        self.history_list.itemChanged.connect(self._on_history_list_item_changed)
        self.undo_delete_button = QPushButton("Undo delete", self)
        # Its text names the chat, elided to the list's width: a long title must never widen the window.
        self.undo_delete_button.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.undo_delete_button.setVisible(False)
        layout.addWidget(self.new_chat_button)
        layout.addWidget(self.search_edit)
        self.no_match_label = QLabel("No chat matches this search.", self)
        self.no_match_label.setWordWrap(True)
        self.no_match_label.setVisible(False)
        layout.addWidget(self.no_match_label)
        layout.addWidget(self.history_list)
        layout.addWidget(self.undo_delete_button)
        # F2 renames: the list's own edit key (EditKeyPressed is among its default edit triggers).
        delete = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.history_list)
        delete.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(self._on_delete_shortcut_activated)
        self._delete_timer = QTimer(self)
        self._delete_timer.setSingleShot(True)
        self._delete_timer.timeout.connect(self.delete_due)

    def query(self) -> str:
        return self.search_edit.text().strip()

    # --- filling ------------------------------------------------------------------------------------

    def fill(self, chats: list[ChatSummary], matching: set[int] | None, open_chat: int | None) -> None:
        """Show ``chats`` (those in ``matching`` when a search is on), the open chat's row current."""
        self.versions = {c.id: c.version_of for c in chats}
        if matching is not None:
            chats = [c for c in chats if c.id in matching]
        # A chat's earlier versions are reached from it (the version button), not listed beside it.
        chats = [c for c in chats if c.id != self.pending_delete and c.version_of is None]
        self.no_match_label.setVisible(matching is not None and not chats)  # an empty list alone says nothing
        listed = self.history_list
        listed.blockSignals(True)
        # Each chat keeps its row object, moved where the order says, and a row is written only when what it
        # shows changed: the list is refreshed after every answer, and a new chat on top shifted every row's
        # contents (hundreds of rows rewritten, 108 ms of the GUI thread in the soak).
        items: dict[int, QListWidgetItem] = {}
        for row in range(listed.count()):
            shown = listed.item(row)
            items[shown.data(Qt.ItemDataRole.UserRole)] = shown
        wanted = {chat.id for chat in chats}
        for chat_id, gone in items.items():
            if chat_id not in wanted:
                listed.takeItem(listed.row(gone))
                self.labels.pop(chat_id, None)
        current: QListWidgetItem | None = None
        for row, chat in enumerate(chats):
            item = items.get(chat.id)
            if item is None:
                item = QListWidgetItem()
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                item.setData(Qt.ItemDataRole.UserRole, chat.id)
                if chat.origin == "api":  # a request to `specdeck serve`, not typed here: marked, not renamed
                    item.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_DriveNetIcon))
                    item.setData(API_ROLE, True)
                listed.insertItem(row, item)
            elif listed.item(row) is not item:
                listed.insertItem(row, listed.takeItem(listed.row(item)))
            title = chat.title or "Untitled chat"
            # The text is compared too: a row renamed in place, or hidden and brought back by undo or a search,
            # may show other text than the label last written.
            if self.labels.get(chat.id) != (title, chat.message_count) or item.text() != title:
                self.labels[chat.id] = (title, chat.message_count)
                self.rows_written += 1
                item.setText(title)
                via = "\nasked through the API (Model → Serve)" if chat.origin == "api" else ""
                item.setToolTip(plain_tooltip(f"{title}\n{chat.message_count} messages{via}"))
            if chat.id == open_chat:
                current = item
        if current is not None:
            listed.setCurrentItem(current)
        else:
            listed.setCurrentRow(-1)
        listed.blockSignals(False)

    def _row_of(self, chat_id: int | None) -> int | None:
        for row in range(self.history_list.count()):
            if self.history_list.item(row).data(Qt.ItemDataRole.UserRole) == chat_id:
                return row
        return None

    def select(self, chat_id: int | None) -> None:
        """The chat's row becomes the current one (no chat is chosen by it); none for a chat not listed."""
        row = self._row_of(chat_id)
        if row is not None:
            self.history_list.blockSignals(True)
            self.history_list.setCurrentRow(row)
            self.history_list.blockSignals(False)

    def clear_selection(self) -> None:
        self.history_list.blockSignals(True)
        self.history_list.clearSelection()
        self.history_list.setCurrentRow(-1)
        self.history_list.blockSignals(False)

    def title(self, chat_id: int) -> str:
        return self.labels.get(chat_id, ("", 0))[0]

    # --- versions -----------------------------------------------------------------------------------

    def add_version(self, copy: int, of: int) -> None:
        self.versions = {copy: of, **self.versions}  # newest first, as the list orders them

    def previous_version(self, chat_id: int | None) -> int | None:
        """The newest chat kept as an earlier version of ``chat_id``."""
        older = [c for c, of in self.versions.items() if of is not None and of == chat_id]
        return older[0] if older else None  # the list's order: most recently updated first

    def newer_version(self, chat_id: int | None) -> int | None:
        """The chat ``chat_id`` is an earlier version of."""
        return None if chat_id is None else self.versions.get(chat_id)

    def with_versions(self, chat_id: int) -> list[int]:
        """The chat and its earlier versions (and theirs): deleted together."""
        out, todo = [], [chat_id]
        while todo:
            current = todo.pop()
            out.append(current)
            todo += [c for c, of in self.versions.items() if of == current and c not in out]
        return out

    # --- rename and delete --------------------------------------------------------------------------

    def rename(self, chat_id: int | None) -> bool:
        """Start renaming the chat's row (else the current one)."""
        row = self._row_of(chat_id) if chat_id is not None else None
        item = self.history_list.item(row) if row is not None else self.history_list.currentItem()
        if item is None or not self.history_list.isEnabled():
            return False
        self.history_list.setCurrentItem(item)
        self.history_list.setFocus()
        self.history_list.editItem(item)
        return True

    def hide_for_undo(self, chat_id: int) -> int | None:
        """Hide a chat being deleted, until it is deleted for good (``delete_due`` after UNDO_DELETE_MS) or
        taken back; the chat now in its row (or the one above, for the last row) is returned."""
        self.pending_delete = chat_id
        self._delete_timer.start(UNDO_DELETE_MS)
        title = ""
        neighbour: int | None = None
        row = self._row_of(chat_id)
        if row is not None:  # hidden now, before the refreshed list arrives
            title = self.history_list.item(row).text()
            self.history_list.blockSignals(True)
            self.history_list.takeItem(row)
            self.history_list.blockSignals(False)
            near = self.history_list.item(min(row, self.history_list.count() - 1))
            found = near.data(Qt.ItemDataRole.UserRole) if near is not None else None
            neighbour = found if isinstance(found, int) else None
        label = f"Undo delete of “{title}”" if title else "Undo delete"
        self.undo_delete_button.setText(self._fitted_undo_text(label, title))
        self.undo_delete_button.setToolTip(plain_tooltip(
            f"{label}: deleted for good in {UNDO_DELETE_MS // 1000} s, or at the next delete or when SpecDeck "
            "closes"))
        self.undo_delete_button.setVisible(True)
        return neighbour

    def _fitted_undo_text(self, label: str, title: str) -> str:
        """The longest of the undo button's wordings that fits the list's width, the title elided at last."""
        if not title:
            return label
        metrics = self.undo_delete_button.fontMetrics()
        room = max(self.history_list.width() - 16, 40)
        for text in (label, f"Undo: “{title}”"):
            if metrics.horizontalAdvance(text) <= room:
                return text
        short = metrics.elidedText(title, Qt.TextElideMode.ElideRight, room - metrics.horizontalAdvance("Undo: “”"))
        return f"Undo: “{short}”"

    def take_back(self) -> int | None:
        """Undo: the hidden chat (None when none is)."""
        chat_id, self.pending_delete = self.pending_delete, None
        self._delete_timer.stop()
        self.undo_delete_button.setVisible(False)
        return chat_id

    def take_due(self) -> list[int]:
        """The hidden chat and its earlier versions, to delete for good now (none when no chat is hidden)."""
        chat_id = self.take_back()
        return [] if chat_id is None else self.with_versions(chat_id)

    # --- slots --------------------------------------------------------------------------------------

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_history_list_current_item_changed(self, current: QListWidgetItem | None,
                                              _previous: QListWidgetItem | None) -> None:
        chat_id = current.data(Qt.ItemDataRole.UserRole) if current is not None else None
        if isinstance(chat_id, int):
            self.chat_chosen.emit(chat_id)

    @Slot(str)
    def _on_search_edit_text_changed(self, _text: str) -> None:
        self.search_changed.emit()

    @Slot(QListWidgetItem)
    def _on_history_list_item_changed(self, item: QListWidgetItem) -> None:
        chat_id = item.data(Qt.ItemDataRole.UserRole)
        if isinstance(chat_id, int):
            self.rename_requested.emit(chat_id, " ".join(item.text().split()))

    @Slot()
    def _on_rename_action_triggered(self) -> None:
        item = self.history_list.currentItem()
        if item is not None:
            self.history_list.editItem(item)

    @Slot()
    def _on_delete_shortcut_activated(self) -> None:
        item = self.history_list.currentItem()
        if item is not None:
            self.delete_requested.emit(int(item.data(Qt.ItemDataRole.UserRole)))

    @Slot(QPoint)
    def _on_history_list_context_menu_requested(self, pos: QPoint) -> None:
        item = self.history_list.itemAt(pos)
        if item is None:
            return
        self.history_list.setCurrentItem(item)
        menu = QMenu(self)
        rename = menu.addAction("Rename\tF2")
        delete = menu.addAction("Delete\tDel")
        rename.triggered.connect(self._on_rename_action_triggered)
        delete.triggered.connect(self._on_delete_shortcut_activated)
        menu.popup(self.history_list.viewport().mapToGlobal(pos))
        self.context_menu = menu  # kept for tests; replaced by the next one
