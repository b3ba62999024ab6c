"""The chat: past chats, the transcript, the input and its actions, and the history store's writes.

The user's message is saved before generation starts; the streaming answer is saved at least once a
second and when it ends, with why it ended. If saving fails (a full disk), the user is told and the chat
goes on in memory. Over 450 lines: the chat list's management (search, rename, delete with undo) shares
the panel's state (the open chat, generating) and lives here with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import ParamSpec, TypeVar

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, SignalInstance, Slot
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.engine.params import SamplingSettings
from app.errors import AppError, SettingsError, StorageError
from app.events import (
    EngineCrashed,
    EngineError,
    Finished,
    MessageStats,
    PromptProcessed,
    PromptProgress,
    Token,
    continued_stats,
    drafted_by,
    drafted_spans,
    message_stats,
    pieces_from_spans,
    speedup_over_plain,
)
from app.storage.chat_store import ChatStore, DraftedSpans
from app.storage.history import ChatSummary, StoredMessage
from app.storage.history_writer import HistoryThread
from ui.chat.engine import ChatEngine
from ui.chat.view import ChatMessage, ChatView, ColourKey
from ui.flow_layout import FlowLayout
from ui.history_reads import ReadDelivery, read_now
from ui.models.sampling_form import SamplingForm
from ui.plain_text import plain_tooltip

P = ParamSpec("P")
T = TypeVar("T")
FLUSH_INTERVAL_MS = 500  # well inside the one-second promise
TITLE_CHARS = 80  # the list elides to its width; the tooltip holds the whole title
HISTORY_MIN_WIDTH = 120
API_ROLE = Qt.ItemDataRole.UserRole + 1  # a chat list row's mark: the chat came through the API
UNDO_DELETE_MS = 60_000  # a deleted chat can be brought back this long (or until the next delete)
NEED_MODEL_MESSAGE = "Load a model first (Models, on the left)."
LOADING_MESSAGE = "The model is still loading; send again once it is loaded."
FINAL_STATUS = {"cancelled": "cancelled", "error": "error"}


def title_from(text: str) -> str:
    """A chat's title: its first message's first line, cut at a word near TITLE_CHARS."""
    line = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    if len(line) <= TITLE_CHARS:
        return line or "Untitled chat"
    cut = line.rfind(" ", 0, TITLE_CHARS)
    return line[:cut if cut > TITLE_CHARS // 2 else TITLE_CHARS].rstrip(" ,.;:") + "…"


class ChatPanel(QWidget):
    generation_state_changed = Signal(bool)
    error_raised = Signal(str)
    answer_finished = Signal(object)  # ChatMessage: the answer is final in the view and the store
    chat_opened = Signal(int)
    chat_deleted = Signal(int)  # hidden at once; deleted for good unless undone in time
    completion_mode_toggled = Signal(bool)  # by the user (not by set_completion_mode)
    history_refreshed = Signal()  # the chat list shows what the store held when it was last asked

    def __init__(
        self,
        bridge: ChatEngine,
        sampling_form: SamplingForm,
        store: ChatStore | None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.bridge: ChatEngine = bridge  # the engine answering: the window's own, or a remote server's model
        self.sampling_form = sampling_form
        self.store = store
        self.chat_id: int | None = None
        self.messages: list[ChatMessage] = []
        self.generating = False
        self._request_id: int | None = None
        self._awaiting_start = False
        self._answer: ChatMessage | None = None
        self.model_loading: Callable[[], bool] = lambda: False  # the window's: is a load under way?
        self.overflow_policy: Callable[[], str] = lambda: "stop"  # the window's: AppSettings.context_overflow
        self._left_out = 0  # turns (question and answer) left out of the prompt to fit the context
        self._request: tuple[SamplingSettings, bool] | None = None  # the answer's sampling and "continue"
        self.overflowed_request: int | None = None  # the request whose "too long" this panel reported itself
        self._resumed_text = ""  # Continue: the partial answer the engine goes on from
        self._resumed_stats: MessageStats | None = None  # and its figures, which the footer adds to
        self._dirty = False
        self._last_flush = 0.0
        self._pending_delete: int | None = None
        # Edit last: where the turn taken back began and its messages, kept (in the view's memory and in the
        # history) until the edited question is sent; Undo edit brings them back.
        self._pending_edit: tuple[int, list[ChatMessage]] | None = None
        # A message deleted from the transcript: hidden at once, deleted from the history at the next change
        # to the chat (or when SpecDeck closes), so Ctrl+Z can put it back where it was.
        self._pending_message_delete: tuple[int, ChatMessage] | None = None
        self._undo_order: list[str] = []  # "edit", "message", "chat": what Ctrl+Z takes back, newest last
        self._versions: dict[int, int | None] = {}  # chat id: the chat it is an earlier version of (the list's)
        self._chat_list_requests = 0  # only the newest request's answer is shown
        self._open_requests = 0  # likewise for opening a chat: the chat asked for last is the one shown
        self._reads = ReadDelivery(self)
        self.context_menu: QMenu | None = None
        self._delete_timer = QTimer(self)
        self._delete_timer.setSingleShot(True)
        self._delete_timer.timeout.connect(self._on_delete_timer_timeout)
        self._build()
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush_timer_timeout)
        for signal, slot in self._engine_links(bridge):
            signal.connect(slot)
        self.refresh_history()
        self._update_buttons()

    def _build(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.setObjectName("chat_splitter")
        self.splitter = splitter
        left = QWidget(splitter)
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        self.new_chat_button = QPushButton("New chat", left)
        self.new_chat_button.clicked.connect(self._on_new_chat_button_clicked)
        self.search_edit = QLineEdit(left)
        self.search_edit.setPlaceholderText("Search chats")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        self.history_list = QListWidget(left)
        self._history_labels: dict[int, tuple[str, int]] = {}  # chat id: (title, messages) its row shows
        self.history_rows_written = 0  # rows whose text was (re)written by a refresh
        self.history_list.setMinimumWidth(HISTORY_MIN_WIDTH)
        self.history_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.history_list.setUniformItemSizes(True)  # one line each: the view need not measure every row
        self.history_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # elide instead
        self.history_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.history_list.customContextMenuRequested.connect(self._on_history_list_context_menu_requested)
        self.history_list.currentItemChanged.connect(self._on_history_list_current_item_changed)
        self.history_list.itemChanged.connect(self._on_history_list_item_changed)
        self.undo_edit_button = QPushButton("Undo edit", self)
        self.undo_edit_button.setToolTip("Bring back the message taken back for editing, and its answer")
        self.undo_edit_button.setVisible(False)
        self.undo_edit_button.clicked.connect(self._on_undo_edit_button_clicked)
        self.new_chat_with_last_button = QPushButton("Continue in a new chat", self)
        self.new_chat_with_last_button.setToolTip("The chat no longer fits the context: start a new chat with "
                                                  "your last message")
        self.new_chat_with_last_button.setVisible(False)
        self.new_chat_with_last_button.clicked.connect(self._on_new_chat_with_last_button_clicked)
        self.version_button = QPushButton("Previous version", self)
        self.version_button.setVisible(False)
        self.version_button.clicked.connect(self._on_version_button_clicked)
        self.undo_delete_button = QPushButton("Undo delete", left)
        self.undo_delete_button.setVisible(False)
        self.undo_delete_button.clicked.connect(self._on_undo_delete_button_clicked)
        left_layout.addWidget(self.new_chat_button)
        left_layout.addWidget(self.search_edit)
        self.no_match_label = QLabel("No chat matches this search.", left)
        self.no_match_label.setWordWrap(True)
        self.no_match_label.setVisible(False)
        left_layout.addWidget(self.no_match_label)
        left_layout.addWidget(self.history_list)
        left_layout.addWidget(self.undo_delete_button)
        # F2 renames: the list's own edit key (EditKeyPressed is among its default edit triggers).
        delete = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.history_list)
        delete.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(self._on_delete_shortcut_activated)

        right = QWidget(splitter)
        layout = QVBoxLayout(right)
        layout.setContentsMargins(0, 0, 0, 0)
        prompt_row = QHBoxLayout()
        prompt_row.addWidget(QLabel("System prompt", right))
        self.system_prompt = QLineEdit(right)
        self.system_prompt.setPlaceholderText("Optional instructions for the model")
        prompt_row.addWidget(self.system_prompt)
        self.completion_check = QCheckBox("Completion", right)
        self.completion_check.setToolTip("No chat template: the text you send is the raw prompt the model "
                                         "continues (for base models). Remembered per model.")
        self.completion_check.toggled.connect(self._on_completion_check_toggled)
        prompt_row.addWidget(self.completion_check)
        layout.addLayout(prompt_row)
        self.view = ChatView(right)
        layout.addWidget(self.view, 1)
        self.progress_label = QLabel(right)
        self.progress_label.setObjectName("prompt_progress")
        self.progress_label.setVisible(False)
        self.progress_label.setWordWrap(True)  # one long line would widen the whole window
        layout.addWidget(self.progress_label)
        self.prompt_bar = QProgressBar(right)
        self.prompt_bar.setObjectName("prompt_bar")
        self.prompt_bar.setTextVisible(False)
        self.prompt_bar.setMaximumHeight(6)
        self.prompt_bar.setVisible(False)
        layout.addWidget(self.prompt_bar)
        self.input = QPlainTextEdit(right)
        self.input.setPlaceholderText("Message (Ctrl+Enter sends, Esc stops)")
        self.input.setMaximumHeight(120)
        self.input.setTabChangesFocus(True)  # Tab moves on to Send; a tab character is rarely meant in a message
        layout.addWidget(self.input)
        buttons_row = QWidget(right)
        buttons = FlowLayout(buttons_row, h_spacing=6, v_spacing=4)
        self.send_button = QPushButton("Send", right)
        self.stop_button = QPushButton("Stop", right)
        self.regenerate_button = QPushButton("Regenerate", right)
        self.edit_button = QPushButton("Edit last", right)
        self.highlight_check = QCheckBox("Highlight drafted tokens", right)
        self.highlight_check.setToolTip("Green: from the suffix drafter (text that repeats). Blue: from the "
                                        "trained drafter (a drafter model, MTP heads, EAGLE-3, DFlash).")
        self.colour_key = ColourKey(right)
        self.colour_key.setVisible(False)
        self.continue_button = QPushButton("Continue", right)
        self.continue_button.setToolTip("The answer was cut at Max tokens: ask the model to go on")
        self.continue_button.setVisible(False)
        self.continue_button.clicked.connect(self._on_continue_button_clicked)
        self.send_button.clicked.connect(self._on_send_button_clicked)
        self.stop_button.clicked.connect(self._on_stop_button_clicked)
        self.regenerate_button.clicked.connect(self._on_regenerate_button_clicked)
        self.edit_button.clicked.connect(self._on_edit_button_clicked)
        self.highlight_check.toggled.connect(self._on_highlight_check_toggled)
        for w in (self.send_button, self.stop_button, self.regenerate_button, self.continue_button,
                  self.edit_button, self.undo_edit_button, self.new_chat_with_last_button, self.version_button,
                  self.highlight_check,
                  self.colour_key):
            buttons.addWidget(w)
        layout.addWidget(buttons_row)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setChildrenCollapsible(False)
        splitter.setSizes([180, 600])
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(splitter)

        # Window-wide: Ctrl+Enter sends from anywhere in the window; Esc stops, and is taken only while an
        # answer streams (otherwise it belongs to whatever has focus).
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            shortcut = QShortcut(QKeySequence(keys), self)
            shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
            shortcut.activated.connect(self._on_send_shortcut_activated)
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        self.stop_shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
        self.stop_shortcut.setEnabled(False)
        self.stop_shortcut.activated.connect(self._on_stop_shortcut_activated)
        # Ctrl+Z takes back the last deletion or edit (a text box with focus keeps Ctrl+Z for its own text).
        self.undo_shortcut = QShortcut(QKeySequence(QKeySequence.StandardKey.Undo), self)
        self.undo_shortcut.setContext(Qt.ShortcutContext.WindowShortcut)
        self.undo_shortcut.activated.connect(self._on_undo_shortcut_activated)
        self.view.message_action.connect(self._on_view_message_action)

    # --- storage (every failure is shown; the chat stays in memory) -----------------------------------

    def _store_call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """``fn`` (a method of the store) with its arguments; None when it failed (a failure is shown)."""
        try:
            return fn(*args, **kwargs)
        except StorageError as exc:
            self.error_raised.emit(str(exc))
        except KeyError:
            pass  # the chat was deleted elsewhere; the chat in memory is what counts now
        return None

    # The creates: the writer thread hands back a handle at once (``*_later``), which stands for the new id in
    # every later call; a plain store (a test's) creates the row now.

    def _new_chat(self, store: ChatStore, title: str, system_prompt: str, *,
                  version_of: int | None = None) -> int | None:
        create = store.new_chat_later if isinstance(store, HistoryThread) else store.new_chat
        return self._store_call(create, title, system_prompt, version_of=version_of)

    def _add_message(self, store: ChatStore, chat_id: int, role: str, text: str, status: str = "complete", *,
                     model: str | None = None, drafter: str | None = None, stats: object = None,
                     stop_reason: str | None = None, drafted: DraftedSpans | None = None) -> int | None:
        create = store.add_message_later if isinstance(store, HistoryThread) else store.add_message
        return self._store_call(create, chat_id, role, text, status, model=model, drafter=drafter, stats=stats,
                                stop_reason=stop_reason, drafted=drafted)

    def _begin_answer(self, store: ChatStore, chat_id: int, *, model: str | None, drafter: str | None,
                      sampling: SamplingSettings) -> int | None:
        create = store.begin_answer_later if isinstance(store, HistoryThread) else store.begin_answer
        return self._store_call(create, chat_id, model=model, drafter=drafter, sampling=sampling)

    def attach_store(self, store: ChatStore) -> None:
        """The history opened late (space was freed): the chat in memory is saved into it as a new chat, and
        saving goes on from here. Call it between answers."""
        self.store = store
        if self.messages and self.chat_id is None:
            first_user = next((m.text for m in self.messages if m.role == "user"), "")
            self.chat_id = self._new_chat(store, title_from(first_user) if first_user else "New chat",
                                          self.system_prompt.text())
            for message in self.messages if self.chat_id is not None else ():
                status = "interrupted" if message.status == "streaming" else message.status
                message.store_id = self._add_message(store, self.chat_id, message.role, message.text, status,
                                                     model=message.model, drafter=message.drafter,
                                                     stats=message.stats)
        self.refresh_history()

    def stored_chat_id(self) -> int | None:
        """The open chat's id in the database (a handle resolved; waits for the writer: for closing only)."""
        if self.chat_id is None or not isinstance(self.store, HistoryThread):
            return self.chat_id
        try:
            return self.store.real_id(self.chat_id)
        except (KeyError, StorageError):
            return None

    def refresh_history(self) -> None:
        """Ask for the chat list; it is shown when it arrives (``history_refreshed``). With the window's writer
        thread the GUI thread never waits for it: the read queues behind the writes (an fsync, a lock)."""
        if self.store is None:
            self._fill_history([])
            return
        self._chat_list_requests += 1
        number = self._chat_list_requests
        query = self.search_edit.text().strip()
        if isinstance(self.store, HistoryThread):
            try:
                future = self.store.chats_later(query)
            except StorageError as exc:
                self.error_raised.emit(f"Could not read the chat history: {exc}")
                return
            self._reads.deliver(future, lambda chats: self._on_chats_read(number, *chats),
                                lambda exc: self._on_chats_read_failed(number, exc))
            return
        try:  # a store without a writer thread (a test's): read here
            chats = self.store.list_chats()
        except Exception as exc:
            self.error_raised.emit(f"Could not read the chat history: {exc}")
            return
        matching: set[int] | None = None
        if query:
            try:
                matching = set(self.store.search_chats(query))
            except StorageError as exc:
                self.error_raised.emit(str(exc))
        self._fill_history(chats, matching)

    def _on_chats_read(self, number: int, chats: list[ChatSummary], matching: set[int] | None) -> None:
        if number == self._chat_list_requests:  # else a newer request is on its way
            self._fill_history(chats, matching)

    def _on_chats_read_failed(self, number: int, exc: BaseException) -> None:
        if number == self._chat_list_requests:
            self.error_raised.emit(f"Could not read the chat history: {exc}")

    def _fill_history(self, chats: list[ChatSummary], matching: set[int] | None = None) -> None:
        self._versions = {c.id: c.version_of for c in chats}
        if matching is not None:
            chats = [c for c in chats if c.id in matching]
        # A chat's earlier versions are reached from it (the version button), not listed beside it.
        chats = [c for c in chats if c.id != self._pending_delete and c.version_of is None]
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
                self._history_labels.pop(chat_id, None)
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
            if self._history_labels.get(chat.id) != (title, chat.message_count) or item.text() != title:
                self._history_labels[chat.id] = (title, chat.message_count)
                self.history_rows_written += 1
                item.setText(title)
                via = "\nasked through the API (Model → Serve)" if chat.origin == "api" else ""
                item.setToolTip(plain_tooltip(f"{title}\n{chat.message_count} messages{via}"))
            if chat.id == self.chat_id:
                current = item
        if current is not None:
            listed.setCurrentItem(current)
        else:
            listed.setCurrentRow(-1)
        listed.blockSignals(False)
        self._update_buttons()
        self.history_refreshed.emit()

    def open_chat(self, chat_id: int, *, quiet: bool = False) -> None:
        """Show a stored chat. With the window's writer thread the read queues behind the writes and the chat is
        shown when it arrives (``chat_opened``): the GUI thread never waits for it. ``quiet``: a chat that is no
        longer there is no error."""
        store = self.store
        if self.generating or store is None:
            return
        self._open_requests += 1
        number = self._open_requests
        if isinstance(store, HistoryThread):
            try:
                future = store.chat_later(chat_id)
            except StorageError as exc:
                self.error_raised.emit(str(exc))
                return
        else:
            future = read_now(lambda: (store.chat(chat_id), store.messages(chat_id)))
        self._reads.deliver(future, lambda read: self._on_chat_read(number, chat_id, *read),
                            lambda exc: self._on_chat_read_failed(number, exc, quiet))

    def _on_chat_read_failed(self, number: int, exc: BaseException, quiet: bool) -> None:
        if number != self._open_requests:
            return  # another chat was asked for since
        if not isinstance(exc, KeyError | StorageError):
            raise exc
        if not quiet:
            self.error_raised.emit(str(exc))

    def _on_chat_read(self, number: int, chat_id: int, chat: ChatSummary, stored: list[StoredMessage]) -> None:
        if number != self._open_requests or self.generating:
            return  # another chat was asked for (or a new one begun) since, or an answer is being written
        self._commit_message_delete()
        self.chat_id = chat_id
        if chat.mode is not None:  # the mode it was written in (older chats: the model's default stays)
            self.set_completion_mode(chat.mode == "completion")
        self._pending_edit = None  # an edit not sent deleted nothing: the chat's history still holds its turn
        self.system_prompt.setText(chat.system_prompt)
        self.messages = [
            ChatMessage(m.role, m.text, m.status, m.stats, m.id, stop_reason=m.stop_reason,
                        model=m.target_model, drafter=m.drafter,
                        pieces=pieces_from_spans(m.text, m.drafted) if m.role == "assistant" else [])
            for m in stored if m.role != "system"
        ]
        self.view.show_messages(self.messages)
        self._select_open_chat()
        self._update_buttons()
        self.chat_opened.emit(chat_id)

    def _select_open_chat(self) -> None:
        """The open chat's row becomes the list's current one (no other chat is opened by it)."""
        listed = self.history_list
        for row in range(listed.count()):
            if listed.item(row).data(Qt.ItemDataRole.UserRole) == self.chat_id:
                listed.blockSignals(True)
                listed.setCurrentRow(row)
                listed.blockSignals(False)
                return

    def _leave_chat(self) -> None:
        """No chat is open, and none being read is shown: the transcript is empty (the input keeps its text)."""
        self._open_requests += 1
        self._commit_message_delete()
        self._pending_edit = None
        self.chat_id = None
        self.messages = []
        self.view.show_messages([])

    def reopen(self, chat_id: int) -> None:
        """Open a chat from an earlier session, if it is still there (quietly nothing otherwise)."""
        self.open_chat(chat_id, quiet=True)
        self.refresh_history()

    def new_chat(self) -> None:
        if self.generating:
            return
        self._leave_chat()
        self.input.clear()
        self.history_list.blockSignals(True)
        self.history_list.clearSelection()
        self.history_list.setCurrentRow(-1)
        self.history_list.blockSignals(False)
        self._update_buttons()
        self.input.setFocus()

    # --- sending ------------------------------------------------------------------------------------

    def send(self, text: str | None = None) -> bool:
        """Send the input box's text (or ``text``); False with the reason shown when refused."""
        if self.generating:
            return False
        text = (self.input.toPlainText() if text is None else text).strip()
        if not text:
            return False
        try:
            sampling = self.sampling_form.settings()
        except SettingsError as exc:
            self.error_raised.emit(str(exc))
            return False
        if self.bridge.loaded is None:
            self.error_raised.emit(LOADING_MESSAGE if self.model_loading() else NEED_MODEL_MESSAGE)
            return False
        self._commit_edit()
        self._commit_message_delete()
        self._open_requests += 1  # a chat still being read is not shown over the one written in
        if self.chat_id is None and self.store is not None:
            title = title_from(text)
            self.chat_id = self._new_chat(self.store, title, self.system_prompt.text())
            if self.chat_id is not None:
                self._store_call(self.store.set_mode, self.chat_id, "completion" if self.completion_mode else "chat")
        elif self.chat_id is not None and self.store is not None:
            self._store_call(self.store.set_system_prompt, self.chat_id, self.system_prompt.text())
        message = ChatMessage("user", text)
        if self.chat_id is not None and self.store is not None:
            message.store_id = self._add_message(self.store, self.chat_id, "user", text)
        self.messages.append(message)
        self.view.append_message(message)
        self.view.follow_end()
        self.input.clear()
        self._start_answer(sampling)
        self.refresh_history()
        return True

    def _engine_messages(self) -> list[dict[str, str]]:
        out = []
        if self.system_prompt.text().strip():
            out.append({"role": "system", "content": self.system_prompt.text().strip()})
        turns = [m for m in self.messages if m.role in ("user", "assistant")]
        if self._left_out:
            # Whole turns from the start; the last question always stays.
            starts = [i for i, m in enumerate(turns) if m.role == "user"]
            cut = starts[min(self._left_out, len(starts) - 1)] if starts else 0
            turns = turns[cut:]
        out += [{"role": m.role, "content": m.text} for m in turns]
        return out

    def _can_leave_out_more(self) -> bool:
        return sum(1 for m in self.messages if m.role == "user") - 1 > self._left_out

    @property
    def completion_mode(self) -> bool:
        """Completion: the messages' texts are the raw prompt (no chat template)."""
        return self.completion_check.isChecked()

    def set_completion_mode(self, on: bool) -> None:
        """The mode for a model just loaded (not a user's choice: completion_mode_toggled stays quiet)."""
        self.completion_check.blockSignals(True)
        self.completion_check.setChecked(on)
        self.completion_check.blockSignals(False)
        self.system_prompt.setEnabled(not on)
        self._show_verbatim(on)

    @Slot(bool)
    def _on_completion_check_toggled(self, on: bool) -> None:
        if self.chat_id is not None and self.store is not None:
            self._store_call(self.store.set_mode, self.chat_id, "completion" if on else "chat")
        self.system_prompt.setEnabled(not on)
        self._show_verbatim(on)
        self.completion_mode_toggled.emit(on)

    def _show_verbatim(self, on: bool) -> None:
        """Completion mode shows the transcript as raw text; the chat is drawn again in the new way."""
        if self.view.verbatim != on:
            self.view.verbatim = on
            if not self.generating:
                self.view.show_messages(self.messages)

    def _start_answer(self, sampling: SamplingSettings, resume: ChatMessage | None = None) -> None:
        """Start an answer; ``resume``: an answer cut at Max tokens, which the engine goes on from, in the
        same message (and the same stored answer)."""
        self._commit_edit()  # Regenerate or Continue after Edit last: the chat as shown is the chat
        self._commit_message_delete()
        loaded = self.bridge.loaded
        if resume is not None:
            answer = resume
            answer.status = "streaming"
            messages = [*self._engine_messages(), {"role": "assistant", "content": resume.text}]
        else:
            answer = ChatMessage("assistant", "", "streaming",
                                 model=loaded.target.path if loaded else None,
                                 drafter=drafted_by(loaded) if loaded else None)
            messages = self._engine_messages()
        if resume is None and self.chat_id is not None and self.store is not None:
            answer.store_id = self._begin_answer(self.store, self.chat_id,
                                                 model=loaded.target.path if loaded else None,
                                                 drafter=answer.drafter, sampling=sampling)
        self._request = (sampling, resume is not None)
        try:
            self.bridge.generate(messages, sampling, continue_answer=resume is not None, raw=self.completion_mode)
        except AppError as exc:
            self.error_raised.emit(str(exc))
            if resume is not None:
                resume.status = "complete"
                self.messages.append(resume)
                self.view.show_messages(self.messages)
            elif answer.store_id is not None and self.store is not None:
                self._store_call(self.store.delete_message, answer.store_id)
            return
        self._resumed_text = resume.text if resume is not None else ""
        self._resumed_stats = message_stats(resume.stats) if resume is not None else None
        self._answer = answer
        self._request_id = None
        self._awaiting_start = True
        self.view.begin_answer()
        if resume is not None:
            self.view.update_answer(answer)  # the partial answer, which the continuation extends
        self.view.follow_end()
        self.progress_label.setText(f"Processing the prompt ({len(self._engine_messages())} messages)…")
        self.progress_label.setVisible(True)
        self._set_generating(True)
        self._last_flush = time.monotonic()
        self._flush_timer.start()

    def _engine_links(self, engine: ChatEngine) -> tuple[tuple[SignalInstance, Callable[..., None]], ...]:
        """Each of the engine's signals the chat listens to, with the slot it goes to."""
        return (
            (engine.generation_started, self._on_bridge_generation_started),
            (engine.token_received, self._on_bridge_token_received),
            (engine.prompt_progress, self._on_bridge_prompt_progress),
            (engine.prompt_processed, self._on_bridge_prompt_processed),
            (engine.generation_finished, self._on_bridge_generation_finished),
            (engine.engine_error, self._on_bridge_engine_error),
            (engine.engine_crashed, self._on_bridge_engine_crashed),
        )

    def use_engine(self, engine: ChatEngine) -> None:
        """Answer through ``engine`` from now on: the window's EngineBridge, or a remote server's model
        (``ui.remote.route.RemoteChat``). The old engine's signals no longer reach the chat. Call it between
        answers."""
        if engine is self.bridge:
            return
        for signal, slot in self._engine_links(self.bridge):
            signal.disconnect(slot)
        for signal, slot in self._engine_links(engine):
            signal.connect(slot)
        self.bridge = engine

    def stop(self) -> None:
        if self.generating:
            self.bridge.cancel()

    def regenerate(self) -> bool:
        """Answer the last question again, replacing the last answer."""
        if self.generating or not self.messages or self.bridge.loaded is None:
            return False
        try:
            sampling = self.sampling_form.settings()
        except SettingsError as exc:
            self.error_raised.emit(str(exc))
            return False
        if self.messages[-1].role == "assistant":
            old = self.messages.pop()
            if old.store_id is not None and self.store is not None:
                self._store_call(self.store.delete_message, old.store_id)
        if not self.messages or self.messages[-1].role != "user":
            return False
        self.view.show_messages(self.messages)
        self._start_answer(sampling)
        return True

    def edit_last(self) -> bool:
        """Take the last question back into the input box to edit and resend (see edit_message)."""
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        return bool(users) and self.edit_message(users[-1])

    def edit_message(self, index: int) -> bool:
        """Take a question back into the input box to edit and resend. It and what followed leave the view but
        nothing is deleted until the edited question is sent (Undo edit and Ctrl+Z bring them back); once sent,
        the old continuation is kept as the chat's previous version."""
        if self.generating or not 0 <= index < len(self.messages) or self.messages[index].role != "user":
            return False
        self._commit_edit()  # an earlier edit not sent: its turn is replaced by this one's
        self._commit_message_delete()
        question = self.messages[index]
        self._pending_edit = (index, self.messages[index:])
        self._undo_order.append("edit")
        del self.messages[index:]
        self.view.show_messages(self.messages)
        self.input.setPlainText(question.text)
        self.input.setFocus()
        self._update_buttons()
        return True

    def undo_edit(self) -> bool:
        """Bring back the turn Edit last took away (the input box keeps what was typed)."""
        if self.generating or self._pending_edit is None:
            return False
        index, removed = self._pending_edit
        self._pending_edit = None
        if index != len(self.messages):
            return False  # the chat moved on meanwhile (it cannot: sending commits); nothing to put back
        self.messages.extend(removed)
        if self.input.toPlainText() == removed[0].text:
            self.input.clear()
        self.view.show_messages(self.messages)
        self._update_buttons()
        return True

    def _commit_edit(self) -> None:
        """The edited question is being sent: the turn it replaces (and what followed) moves to the chat's
        previous version, and leaves this chat's history now."""
        pending, self._pending_edit = self._pending_edit, None
        if pending is None or self.store is None:
            return
        index, removed = pending
        if len(removed) > 1:  # an answer, at least, would be lost: keep the old continuation reachable
            self._keep_previous_version(self.messages[:index] + removed)
        question = removed[0]
        if question.store_id is not None and self.chat_id is not None:
            self._store_call(self.store.truncate_after, self.chat_id, question.store_id, inclusive=True)
        else:
            for m in pending[1]:
                if m.store_id is not None:
                    self._store_call(self.store.delete_message, m.store_id)

    @Slot()
    def _on_undo_edit_button_clicked(self) -> None:
        self.undo_edit()

    # --- per-message actions, versions and Ctrl+Z ---------------------------------------------------

    @Slot(str, int)
    def _on_view_message_action(self, action: str, index: int) -> None:
        {"copy": self.copy_message, "edit": self.edit_message, "delete": self.delete_message,
         "regenerate": self.regenerate_message}[action](index)

    def copy_message(self, index: int) -> bool:
        """Put one message's text, as written, on the clipboard."""
        if not 0 <= index < len(self.messages):
            return False
        QGuiApplication.clipboard().setText(self.messages[index].text)
        return True

    def delete_message(self, index: int) -> bool:
        """Take one message out of the chat; Ctrl+Z puts it back until the chat changes again."""
        if self.generating or not 0 <= index < len(self.messages):
            return False
        self._commit_message_delete()
        message = self.messages.pop(index)
        self._pending_message_delete = (index, message)
        if self._pending_edit is not None and index < self._pending_edit[0]:
            self._pending_edit = (self._pending_edit[0] - 1, self._pending_edit[1])
        self._undo_order.append("message")
        self.view.show_messages(self.messages)
        self._update_buttons()
        return True

    def _commit_message_delete(self) -> None:
        pending, self._pending_message_delete = self._pending_message_delete, None
        if pending is not None and pending[1].store_id is not None and self.store is not None:
            self._store_call(self.store.delete_message, pending[1].store_id)

    def undo_message_delete(self) -> bool:
        pending = self._pending_message_delete
        if self.generating or pending is None or pending[0] > len(self.messages):
            return False
        self._pending_message_delete = None
        index, message = pending
        self.messages.insert(index, message)
        if self._pending_edit is not None and index <= self._pending_edit[0]:
            self._pending_edit = (self._pending_edit[0] + 1, self._pending_edit[1])
        self.view.show_messages(self.messages)
        self._update_buttons()
        return True

    def regenerate_message(self, index: int) -> bool:
        """Answer the question before this answer again. An earlier answer's continuation is kept as the
        chat's previous version; the last answer is simply replaced (as Regenerate does)."""
        if index == len(self.messages) - 1:
            return self.regenerate()
        if (self.generating or not 0 < index < len(self.messages) or self.messages[index].role != "assistant"
                or self.messages[index - 1].role != "user" or self.bridge.loaded is None):
            return False
        try:
            sampling = self.sampling_form.settings()
        except SettingsError as exc:
            self.error_raised.emit(str(exc))
            return False
        self._commit_edit()
        self._commit_message_delete()
        self._keep_previous_version(list(self.messages))
        first = self.messages[index]
        if first.store_id is not None and self.chat_id is not None and self.store is not None:
            self._store_call(self.store.truncate_after, self.chat_id, first.store_id, inclusive=True)
        del self.messages[index:]
        self.view.show_messages(self.messages)
        self._start_answer(sampling)
        return True

    def _keep_previous_version(self, messages: list[ChatMessage]) -> None:
        """A copy of the chat as it was (before an edit or an earlier answer's regenerate) in a chat of its
        own, linked to this one: the "Previous version" button opens it."""
        if self.chat_id is None or self.store is None or not messages:
            return
        title = self._chat_title() or "Untitled chat"
        copy = self._new_chat(self.store, f"{title} (earlier version)", self.system_prompt.text(),
                              version_of=self.chat_id)
        if copy is None:
            return
        for m in messages:
            self._add_message(self.store, copy, m.role, m.text,
                              "interrupted" if m.status == "streaming" else m.status, model=m.model,
                              drafter=m.drafter, stats=m.stats, stop_reason=m.stop_reason,
                              drafted=drafted_spans(m.pieces, len(m.text)) or None)
        self._versions = {copy: self.chat_id, **self._versions}  # newest first, as the list orders them
        self.refresh_history()

    def _chat_title(self) -> str:
        if self.chat_id is None:
            return ""
        return self._history_labels.get(self.chat_id, ("", 0))[0]

    def previous_version(self) -> int | None:
        """The newest chat kept as an earlier version of the open chat."""
        older = [c for c, of in self._versions.items() if of is not None and of == self.chat_id]
        return older[0] if older else None  # the list's order: most recently updated first

    def newer_version(self) -> int | None:
        """The chat the open chat is an earlier version of."""
        return None if self.chat_id is None else self._versions.get(self.chat_id)

    def switch_version(self) -> bool:
        """Open the open chat's previous version, or from a previous version the chat it came from (shown when
        it arrives, as ``open_chat`` says)."""
        target = self.previous_version() or self.newer_version()
        if target is None or self.generating:
            return False
        self.open_chat(target)
        self.refresh_history()
        return True

    @Slot()
    def _on_version_button_clicked(self) -> None:
        self.switch_version()

    def undo(self) -> bool:
        """Ctrl+Z: take back the newest of a message deletion, an edit not yet sent, or a chat deletion."""
        while self._undo_order:
            kind = self._undo_order.pop()
            done = {"message": self.undo_message_delete, "edit": self.undo_edit, "chat": self.undo_delete}[kind]()
            if done:
                return True
        return False

    @Slot()
    def _on_undo_shortcut_activated(self) -> None:
        self.undo()

    # --- engine events ------------------------------------------------------------------------------

    @Slot(int)
    def _on_bridge_generation_started(self, request_id: int) -> None:
        if self._awaiting_start:
            self._request_id = request_id
            self._awaiting_start = False

    def _mine(self, request_id: int | None) -> bool:
        return self._answer is not None and request_id is not None and request_id == self._request_id

    @Slot(PromptProgress)
    def _on_bridge_prompt_progress(self, event: PromptProgress) -> None:
        if self._mine(event.request_id):
            self.progress_label.setText(f"Processing prompt {event.done:,} / {event.total:,}")
            self.prompt_bar.setRange(0, max(event.total, 1))
            self.prompt_bar.setValue(event.done)
            self.prompt_bar.setVisible(True)

    @Slot(PromptProcessed)
    def _on_bridge_prompt_processed(self, event: PromptProcessed) -> None:
        if self._mine(event.request_id):
            self.prompt_bar.setVisible(False)
            self.progress_label.setText(f"Prompt processed: {event.prompt_tokens:,} tokens in "
                                        f"{event.seconds:.1f} s; writing…")

    @Slot(Token)
    def _on_bridge_token_received(self, event: Token) -> None:
        if not self._mine(event.request_id) or self._answer is None:
            return
        self._answer.text += event.text
        pieces = event.pieces or ((event.text,) if len(event.sources) <= 1 else ())
        self._answer.pieces.extend(zip(pieces, event.sources, strict=False))
        self._dirty = True
        self.view.update_answer(self._answer)

    @Slot(Finished)
    def _on_bridge_generation_finished(self, event: Finished) -> None:
        # request_id -1: the bridge could not even send the request
        failed_to_send = self._awaiting_start and event.request_id == -1
        if self._answer is None or not (self._mine(event.request_id) or failed_to_send):
            return
        answer = self._answer
        if event.text or event.reason != "error":
            answer.text = self._resumed_text + event.text if event.text else answer.text
        answer.status = FINAL_STATUS.get(event.reason, "complete")
        answer.stop_reason = event.reason
        answer.stats = self._answer_stats(event) if event.reason != "error" else self._resumed_stats
        self._end_answer(answer)

    def _answer_stats(self, event: Finished) -> MessageStats:
        """The answer's figures: a continued answer's over both parts, and its speedup over the plain rate
        measured at load (the rate the dashboard draws), or none when that is not measured."""
        stats = event.stats
        if self._resumed_stats is not None:
            stats = continued_stats(self._resumed_stats, stats)
        loaded = self.bridge.loaded
        return replace(stats, speedup_estimate=speedup_over_plain(stats, loaded.plain_tps if loaded else 0.0))

    @Slot(EngineError)
    def _on_bridge_engine_error(self, event: EngineError) -> None:
        if self._answer is not None and (self._mine(event.request_id) or (event.request_id is None
                                         and self._awaiting_start)):
            if event.kind == "PromptTooLongError" and self._overflowed(event):
                return
            self._answer.status = "error"
            self._answer.stop_reason = "error"
            self._end_answer(self._answer)
        # The window shows engine errors (one place for every error the engine reports).

    def _overflowed(self, event: EngineError) -> bool:
        """The chat no longer fits the context and nothing was written: per the overflow policy, ask again
        without the oldest turn, or stop with no empty answer left behind and offer a new chat. True when
        handled here (the window then shows no error of its own)."""
        answer = self._answer
        if answer is None or answer.text or self._request is None:
            return False
        self.overflowed_request = event.request_id
        if self.overflow_policy() == "drop_oldest" and self._can_leave_out_more():
            self._left_out += 1
            sampling, resumed = self._request
            messages = self._engine_messages()
            if resumed:
                messages.append({"role": "assistant", "content": answer.text})
            self._request_id = None
            self._awaiting_start = True
            self.progress_label.setText(f"The chat is longer than the context: asking again without the oldest "
                                        f"{self._left_out} question{'s' if self._left_out > 1 else ''} and "
                                        "answers…")
            try:
                self.bridge.generate(messages, sampling, continue_answer=resumed, raw=self.completion_mode)
            except AppError as exc:
                self.error_raised.emit(str(exc))
            else:
                return True
        # Stop: the empty answer goes; the question stays, and a new chat can take it.
        self._leave_answer()
        if answer.store_id is not None and self.store is not None:
            self._store_call(self.store.delete_message, answer.store_id)
        self.view.show_messages(self.messages)
        self._set_generating(False)
        self.new_chat_with_last_button.setVisible(any(m.role == "user" for m in self.messages))
        self.error_raised.emit(f"{event.message} Or press “Continue in a new chat” to send your last message "
                               "there.")
        return True

    def continue_in_new_chat(self) -> bool:
        """The chat outgrew the context: a new chat gets the last question, sent at once."""
        question = next((m.text for m in reversed(self.messages) if m.role == "user"), None)
        if question is None or self.generating:
            return False
        self.new_chat()
        return self.send(question)

    @Slot()
    def _on_new_chat_with_last_button_clicked(self) -> None:
        self.continue_in_new_chat()

    @Slot(EngineCrashed)
    def _on_bridge_engine_crashed(self, _event: EngineCrashed) -> None:
        if self._answer is not None:
            self._answer.status = "interrupted"
            self._answer.stop_reason = "crashed"
            self._end_answer(self._answer)

    def _leave_answer(self) -> None:
        """No answer is being written any more: its timer, progress and handles go."""
        self._flush_timer.stop()
        self.progress_label.setVisible(False)
        self.prompt_bar.setVisible(False)
        self._answer = None
        self._request_id = None
        self._awaiting_start = False

    def _end_answer(self, answer: ChatMessage) -> None:
        self._left_out = 0
        self._leave_answer()
        if answer.store_id is not None and self.store is not None:
            self._store_call(self.store.finish_answer, answer.store_id, answer.text, answer.status,
                             answer.stats, stop_reason=answer.stop_reason,
                             drafted=drafted_spans(answer.pieces, len(answer.text)))
        self.messages.append(answer)
        self.view.finish_answer(answer)
        self._set_generating(False)
        self.refresh_history()
        self.answer_finished.emit(answer)

    @Slot()
    def _on_flush_timer_timeout(self) -> None:
        self.flush()

    def flush(self) -> None:
        answer = self._answer
        if answer is None or answer.store_id is None or self.store is None or not self._dirty:
            return
        self._dirty = False
        self._last_flush = time.monotonic()
        self._store_call(self.store.update_answer, answer.store_id, answer.text)

    # --- widgets ------------------------------------------------------------------------------------

    def _set_generating(self, generating: bool) -> None:
        self.generating = generating
        self._update_buttons()
        self.generation_state_changed.emit(generating)

    def _update_buttons(self) -> None:
        idle = not self.generating
        self.send_button.setEnabled(idle)
        self.stop_button.setEnabled(self.generating)
        self.regenerate_button.setEnabled(idle and bool(self.messages))
        self.edit_button.setEnabled(idle and any(m.role == "user" for m in self.messages))
        self.new_chat_button.setEnabled(idle)
        self.history_list.setEnabled(idle)
        self.stop_shortcut.setEnabled(self.generating)
        last = self.messages[-1] if self.messages else None
        self.continue_button.setVisible(idle and last is not None and last.role == "assistant"
                                        and last.stop_reason == "max_tokens")
        self.undo_edit_button.setVisible(idle and self._pending_edit is not None)
        if not idle or not self.messages:
            self.new_chat_with_last_button.setVisible(False)
        elif last is not None and last.stop_reason == "context_full":
            self.new_chat_with_last_button.setVisible(True)
        previous, newer = self.previous_version(), self.newer_version()
        self.version_button.setVisible(idle and (previous is not None or newer is not None))
        self.version_button.setText("Previous version" if previous is not None else "Newer version")
        self.version_button.setToolTip("Open the chat as it was before an earlier message was edited or answered "
                                       "again" if previous is not None else "Open the chat this version led to")

    @Slot()
    def _on_send_button_clicked(self) -> None:
        self.send()

    @Slot()
    def _on_send_shortcut_activated(self) -> None:
        self.send()

    @Slot()
    def _on_stop_button_clicked(self) -> None:
        self.stop()

    @Slot()
    def _on_stop_shortcut_activated(self) -> None:
        self.stop()

    @Slot()
    def _on_regenerate_button_clicked(self) -> None:
        self.regenerate()

    @Slot()
    def _on_edit_button_clicked(self) -> None:
        self.edit_last()

    @Slot()
    def _on_new_chat_button_clicked(self) -> None:
        self.new_chat()

    @Slot()
    def _on_continue_button_clicked(self) -> None:
        self.continue_answer()

    def continue_answer(self) -> bool:
        """After an answer cut at Max tokens: the model goes on from where it stopped, in the same answer."""
        last = self.messages[-1] if self.messages else None
        if self.generating or last is None or last.role != "assistant" or last.stop_reason != "max_tokens":
            return False
        if self.bridge.loaded is None:
            self.error_raised.emit(LOADING_MESSAGE if self.model_loading() else NEED_MODEL_MESSAGE)
            return False
        try:
            sampling = self.sampling_form.settings()
        except SettingsError as exc:
            self.error_raised.emit(str(exc))
            return False
        self.messages.pop()
        self.view.show_messages(self.messages)
        self._start_answer(sampling, resume=last)
        return True

    @Slot(QListWidgetItem)
    def _on_history_list_item_activated(self, item: QListWidgetItem) -> None:
        chat_id = item.data(Qt.ItemDataRole.UserRole)
        if isinstance(chat_id, int) and chat_id != self.chat_id:
            self.open_chat(chat_id)

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_history_list_current_item_changed(self, current: QListWidgetItem | None,
                                              _previous: QListWidgetItem | None) -> None:
        # Whatever made a chat current (a click, a right-click, the arrow keys) shows that chat.
        if current is not None:
            self._on_history_list_item_activated(current)

    @Slot(str)
    def _on_search_edit_text_changed(self, _text: str) -> None:
        self.refresh_history()

    # --- managing chats -----------------------------------------------------------------------------

    def selected_chat_item(self) -> QListWidgetItem | None:
        return self.history_list.currentItem()

    @Slot()
    def _on_rename_action_triggered(self) -> None:
        item = self.selected_chat_item()
        if item is not None:
            self.history_list.editItem(item)

    def rename_current_chat(self) -> bool:
        """Start renaming the open chat (else the one selected in the list), wherever the focus is."""
        item = next((self.history_list.item(row) for row in range(self.history_list.count())
                     if self.history_list.item(row).data(Qt.ItemDataRole.UserRole) == self.chat_id), None)
        item = item if self.chat_id is not None and item is not None else self.selected_chat_item()
        if item is None or not self.history_list.isEnabled():
            return False
        self.history_list.setCurrentItem(item)
        self.history_list.setFocus()
        self.history_list.editItem(item)
        return True

    def last_answer(self) -> ChatMessage | None:
        return next((m for m in reversed(self.messages) if m.role == "assistant"), None)

    def copy_last_answer(self) -> bool:
        """Put the newest answer's text, as the model wrote it, on the clipboard."""
        answer = self.last_answer()
        if answer is None or not answer.text:
            return False
        QGuiApplication.clipboard().setText(answer.text)
        return True

    def focus_input(self) -> None:
        self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    @Slot()
    def _on_delete_shortcut_activated(self) -> None:
        item = self.selected_chat_item()
        if item is not None:
            self.delete_chat(int(item.data(Qt.ItemDataRole.UserRole)))

    @Slot(QListWidgetItem)
    def _on_history_list_item_changed(self, item: QListWidgetItem) -> None:
        chat_id = item.data(Qt.ItemDataRole.UserRole)
        title = " ".join(item.text().split())
        if not isinstance(chat_id, int) or self.store is None:
            return
        if not title:
            self.refresh_history()  # an empty name is not a name: the old one comes back
            return
        self.rename_chat(chat_id, title)

    def rename_chat(self, chat_id: int, title: str) -> None:
        if self.store is not None:
            self._store_call(self.store.rename_chat, chat_id, title)
        self.refresh_history()

    def delete_chat(self, chat_id: int) -> None:
        """Hide the chat at once and delete it for good after UNDO_DELETE_MS, unless undone."""
        if self.generating and chat_id == self.chat_id:
            return
        self.commit_pending_delete()
        self._pending_delete = chat_id
        self._undo_order.append("chat")
        self._delete_timer.start(UNDO_DELETE_MS)
        was_open = chat_id == self.chat_id
        title = ""
        neighbour: int | None = None
        for row in range(self.history_list.count()):  # hidden now, before the refreshed list arrives
            item = self.history_list.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == chat_id:
                title = item.text()
                self.history_list.blockSignals(True)
                self.history_list.takeItem(row)
                self.history_list.blockSignals(False)
                # The chat that took its row (or the one above, for the last row) is shown next.
                near = self.history_list.item(min(row, self.history_list.count() - 1))
                neighbour = near.data(Qt.ItemDataRole.UserRole) if near is not None else None
                break
        if was_open:
            self._leave_chat()  # nothing goes on in the deleted chat while its neighbour is read
            if isinstance(neighbour, int):
                self.open_chat(neighbour)
            else:
                self.new_chat()
        self.refresh_history()
        self.undo_delete_button.setText(f"Undo delete of “{title}”" if title else "Undo delete")
        self.undo_delete_button.setToolTip(f"Deleted for good in {UNDO_DELETE_MS // 1000} s, or at the next "
                                           "delete or when SpecDeck closes")
        self.undo_delete_button.setVisible(True)
        self.chat_deleted.emit(chat_id)

    def undo_delete(self) -> bool:
        chat_id = self._pending_delete
        if chat_id is None:
            return False
        self._pending_delete = None
        self._delete_timer.stop()
        self.undo_delete_button.setVisible(False)
        self.refresh_history()
        self.open_chat(chat_id)
        return True

    def commit_pending_delete(self) -> None:
        """Deletions waiting for their undo become final (the next delete, the timer, SpecDeck closing)."""
        self._commit_message_delete()
        chat_id, self._pending_delete = self._pending_delete, None
        self._delete_timer.stop()
        self.undo_delete_button.setVisible(False)
        if chat_id is not None and self.store is not None:
            for gone in self._with_versions(chat_id):
                self._store_call(self.store.delete_chat, gone)

    def _with_versions(self, chat_id: int) -> list[int]:
        """The chat and its earlier versions (and theirs): deleted together."""
        out, todo = [], [chat_id]
        while todo:
            current = todo.pop()
            out.append(current)
            todo += [c for c, of in self._versions.items() if of == current and c not in out]
        return out

    @Slot()
    def _on_delete_timer_timeout(self) -> None:
        self.commit_pending_delete()

    @Slot()
    def _on_undo_delete_button_clicked(self) -> None:
        self.undo_delete()

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

    @Slot(bool)
    def _on_highlight_check_toggled(self, on: bool) -> None:
        self.view.highlight_sources = on
        self.colour_key.setVisible(on)
        if not self.generating:
            self.view.show_messages(self.messages)
