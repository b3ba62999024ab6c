"""The chat: the list of past chats beside the transcript, the input and its buttons; it ties together the
parts in this package: the chat list (``chat_list``), the answer being written (``answer``), the message
actions and undo (``actions``) and the history (``history_link``).

The user's message is saved before generation starts; the streaming answer is saved at least once a
second and when it ends, with why it ended. If saving fails (a full disk), the user is told and the chat
goes on in memory. Opening a chat reads it off the GUI thread; it is shown when it arrives. Over 500 lines:
it is the one place the parts meet, and the chat's API for the window and the tests; each method is short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QMenu,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.errors import SettingsError, StorageError
from app.events import pieces_from_spans
from app.storage.chat_store import ChatStore
from app.storage.history_rows import ChatSummary, StoredMessage, answer_position
from ui.chat.actions import MessageActions
from ui.chat.answer import AnswerWriter
from ui.chat.chat_list import ChatList
from ui.chat.colours import ColourKey
from ui.chat.engine import ChatEngine
from ui.chat.history_link import HistoryLink
from ui.chat.message import ChatMessage
from ui.chat.presets import PromptPresets
from ui.chat.transcript import TranscriptPane
from ui.chat.view import ChatView
from ui.history_reads import ReadDelivery
from ui.models.sampling_form import SamplingForm

TITLE_CHARS = 80  # the list elides to its width; the tooltip holds the whole title
NEED_MODEL_MESSAGE = "No model is chosen: choose a target in Models and settings (on the left), then send again."
LOADING_MESSAGE = "The model is still loading; send again once it is loaded."
WAITING_MESSAGE = "Loading the chosen model; the message is sent once it is loaded."


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
    notice_raised = Signal(str)  # for the status bar only: nothing to fix, nothing lost
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
        self.history = HistoryLink(store, ReadDelivery(self), self.error_raised.emit)
        self.chat_id: int | None = None
        self.messages: list[ChatMessage] = []
        self.generating = False
        self.model_loading: Callable[[], bool] = lambda: False  # the window's: is a load under way?
        # The window's: start loading the chosen model for a message sent before any was loaded; False when
        # nothing was started (the window said why). None: the message is refused (NEED_MODEL_MESSAGE).
        self.load_for_send: Callable[[], bool] | None = None
        self.send_waiting = False  # the input box's text is sent once the load started for it is done
        self.overflow_policy: Callable[[], str] = lambda: "stop"  # the window's: AppSettings.context_overflow
        self._chat_list_requests = 0  # only the newest request's answer is shown
        self._open_requests = 0  # likewise for opening a chat: the chat asked for last is the one shown
        self.answers = AnswerWriter(self)
        self.message_actions = MessageActions(self)
        self._build()
        for signal, slot in self.answers.engine_links(bridge):
            signal.connect(slot)
        self.refresh_history()
        self.update_buttons()

    def _build(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.setObjectName("chat_splitter")
        self.splitter = splitter
        self.chat_list = ChatList(splitter)
        chats = self.chat_list
        self.new_chat_button: QPushButton = chats.new_chat_button
        self.search_edit: QLineEdit = chats.search_edit
        self.history_list: QListWidget = chats.history_list
        self.no_match_label: QLabel = chats.no_match_label
        self.undo_delete_button: QPushButton = chats.undo_delete_button
        chats.new_chat_button.clicked.connect(self._on_new_chat_button_clicked)
        chats.undo_delete_button.clicked.connect(self._on_undo_delete_button_clicked)
        chats.chat_chosen.connect(self._on_chat_list_chat_chosen)
        chats.rename_requested.connect(self._on_chat_list_rename_requested)
        chats.delete_requested.connect(self.delete_chat)
        chats.search_changed.connect(self.refresh_history)
        chats.delete_due.connect(self.commit_pending_delete)
        pane = TranscriptPane(splitter)
        self.transcript = pane
        self.system_prompt: QLineEdit = pane.system_prompt
        self.presets = PromptPresets(pane.presets_button, self.system_prompt, self)
        self.presets.error_raised.connect(self.error_raised)
        self.completion_check: QCheckBox = pane.completion_check
        self.view: ChatView = pane.view
        self.progress_label: QLabel = pane.progress_label
        self.prompt_bar: QProgressBar = pane.prompt_bar
        self.input: QPlainTextEdit = pane.input
        self.send_button: QPushButton = pane.send_button
        self.stop_button: QPushButton = pane.stop_button
        self.regenerate_button: QPushButton = pane.regenerate_button
        self.continue_button: QPushButton = pane.continue_button
        self.edit_button: QPushButton = pane.edit_button
        self.undo_edit_button: QPushButton = pane.undo_edit_button
        self.new_chat_with_last_button: QPushButton = pane.new_chat_with_last_button
        self.version_button: QPushButton = pane.version_button
        self.highlight_check: QCheckBox = pane.highlight_check
        self.colour_key: ColourKey = pane.colour_key
        self.completion_check.toggled.connect(self._on_completion_check_toggled)
        self.send_button.clicked.connect(self._on_send_button_clicked)
        self.stop_button.clicked.connect(self._on_stop_button_clicked)
        self.regenerate_button.clicked.connect(self._on_regenerate_button_clicked)
        self.continue_button.clicked.connect(self._on_continue_button_clicked)
        self.edit_button.clicked.connect(self._on_edit_button_clicked)
        self.undo_edit_button.clicked.connect(self._on_undo_edit_button_clicked)
        self.new_chat_with_last_button.clicked.connect(self._on_new_chat_with_last_button_clicked)
        self.version_button.clicked.connect(self.message_actions.on_version_button_clicked)
        self.highlight_check.toggled.connect(self._on_highlight_check_toggled)
        splitter.addWidget(self.chat_list)
        splitter.addWidget(pane)
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
        self.view.message_action.connect(self.message_actions.on_view_message_action)
        self.view.alternative_chosen.connect(self._on_view_alternative_chosen)
        self.view.palette_changed.connect(self._on_view_palette_changed)

    # --- the parts' state, as the window and the tests read it -------------------------------------------

    @property
    def store(self) -> ChatStore | None:
        return self.history.store

    @property
    def overflowed_request(self) -> int | None:
        """The request whose "too long" the chat handled itself (the window then shows no error of its own)."""
        return self.answers.overflowed_request

    @property
    def history_rows_written(self) -> int:
        return self.chat_list.rows_written

    @property
    def context_menu(self) -> QMenu | None:
        return self.chat_list.context_menu

    # --- the history ----------------------------------------------------------------------------------

    def attach_store(self, store: ChatStore) -> None:
        """The history opened late (space was freed): the chat in memory is saved into it as a new chat, and
        saving goes on from here. Call it between answers."""
        self.history.store = store
        if self.messages and self.chat_id is None:
            first_user = next((m.text for m in self.messages if m.role == "user"), "")
            chat_id = self.history.new_chat(title_from(first_user) if first_user else "New chat",
                                            self.system_prompt.text())
            self.chat_id = chat_id
            if chat_id is not None:
                for message in self.messages:
                    status = "interrupted" if message.status == "streaming" else message.status
                    message.store_id = self.history.add_message(chat_id, message.role, message.text, status,
                                                                model=message.model, drafter=message.drafter,
                                                                stats=message.stats)
        self.refresh_history()

    def stored_chat_id(self) -> int | None:
        """The open chat's id in the database (a handle resolved; waits for the writer: for closing only)."""
        return self.history.stored_id(self.chat_id)

    def refresh_history(self) -> None:
        """Ask for the chat list; it is shown when it arrives (``history_refreshed``). With the window's writer
        thread the GUI thread never waits for it: the read queues behind the writes (an fsync, a lock)."""
        self._chat_list_requests += 1
        number = self._chat_list_requests
        self.history.read_chats(self.chat_list.query(),
                                lambda chats, matching: self._on_chats_read(number, chats, matching),
                                lambda exc: self._on_chats_read_failed(number, exc))

    def _on_chats_read(self, number: int, chats: list[ChatSummary], matching: set[int] | None) -> None:
        if number == self._chat_list_requests:  # else a newer request is on its way
            self.chat_list.fill(chats, matching, self.chat_id)
            self.update_buttons()
            self.history_refreshed.emit()

    def _on_chats_read_failed(self, number: int, exc: BaseException) -> None:
        if number == self._chat_list_requests:
            self.error_raised.emit(f"Could not read the chat history: {exc}")

    def open_chat(self, chat_id: int, *, quiet: bool = False) -> None:
        """Show a stored chat. With the window's writer thread the read queues behind the writes and the chat is
        shown when it arrives (``chat_opened``): the GUI thread never waits for it. ``quiet``: a chat that is no
        longer there is no error."""
        if self.generating or self.store is None:
            return
        self._open_requests += 1
        number = self._open_requests
        self.history.read_chat(chat_id, lambda chat, stored: self._on_chat_read(number, chat_id, chat, stored),
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
        self.message_actions.commit_message_delete()
        self.chat_id = chat_id
        if chat.mode is not None:  # the mode it was written in (older chats: the model's default stays)
            self.set_completion_mode(chat.mode == "completion")
        self.message_actions.pending_edit = None  # an edit not sent deleted nothing: the history still holds it
        self.system_prompt.setText(chat.system_prompt)
        self.messages = [
            ChatMessage(m.role, m.text, m.status, m.stats, m.id, stop_reason=m.stop_reason,
                        model=m.target_model, drafter=m.drafter, alternatives=m.alternatives,
                        pieces=pieces_from_spans(m.text, m.drafted) if m.role == "assistant" else [])
            for m in stored if m.role != "system"
        ]
        self.view.show_messages(self.messages)
        self.progress_label.setVisible(False)  # a notice about the chat left
        self.chat_list.select(self.chat_id)
        self.update_buttons()
        self.chat_opened.emit(chat_id)

    def _leave_chat(self) -> None:
        """No chat is open, and none being read is shown: the transcript is empty (the input keeps its text)."""
        self._open_requests += 1
        self.message_actions.commit_message_delete()
        self.message_actions.pending_edit = None
        self.chat_id = None
        self.messages = []
        self.view.show_messages([])
        if not self.generating:
            self.progress_label.setVisible(False)  # a notice about the chat left

    def reopen(self, chat_id: int) -> None:
        """Open a chat from an earlier session, if it is still there (quietly nothing otherwise)."""
        self.open_chat(chat_id, quiet=True)
        self.refresh_history()

    def new_chat(self) -> None:
        if self.generating:
            return
        self._leave_chat()
        self.input.clear()
        self.chat_list.clear_selection()
        self.update_buttons()
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
            return self._wait_for_model()
        self.send_waiting = False
        self.message_actions.commit_edit()
        self.message_actions.commit_message_delete()
        self._open_requests += 1  # a chat still being read is not shown over the one written in
        if self.chat_id is None and self.store is not None:
            self._begin_chat(text)
        elif self.chat_id is not None and self.store is not None:
            self.history.call(self.store.set_system_prompt, self.chat_id, self.system_prompt.text())
        message = ChatMessage("user", text)
        if self.chat_id is not None:
            message.store_id = self.history.add_message(self.chat_id, "user", text)
        self.messages.append(message)
        self.view.append_message(message)
        self.view.follow_end()
        self.input.clear()
        self.answers.start(sampling)
        self.refresh_history()
        return True

    def _wait_for_model(self) -> bool:
        """No model answers yet: the text stays in the input box, sent once the chosen model is loaded."""
        if self.model_loading():
            if self.send_waiting:
                self.notice_raised.emit(WAITING_MESSAGE)
            else:
                self.error_raised.emit(LOADING_MESSAGE)
        elif self.load_for_send is None:
            self.error_raised.emit(NEED_MODEL_MESSAGE)
        else:  # asked again while it waits for the drafters: the window keeps one load for it
            self.send_waiting = self.load_for_send()
        return False

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
            self.history.call(self.store.set_mode, self.chat_id, "completion" if on else "chat")
        self.system_prompt.setEnabled(not on)
        self._show_verbatim(on)
        self.completion_mode_toggled.emit(on)

    def _show_verbatim(self, on: bool) -> None:
        """Completion mode shows the transcript as raw text; the chat is drawn again in the new way."""
        if self.view.verbatim != on:
            self.view.verbatim = on
            if not self.generating:
                self.view.show_messages(self.messages)

    def use_engine(self, engine: ChatEngine) -> None:
        """Answer through ``engine`` from now on: the window's EngineBridge, or a remote server's model
        (``ui.remote.route.RemoteChat``). The old engine's signals no longer reach the chat. Call it between
        answers."""
        if engine is self.bridge:
            return
        for signal, slot in self.answers.engine_links(self.bridge):
            signal.disconnect(slot)
        for signal, slot in self.answers.engine_links(engine):
            signal.connect(slot)
        self.bridge = engine

    def flush(self) -> None:
        """Save the answer being written so far (closing saves it before the history closes)."""
        self.answers.flush()

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
            question = self.messages[-1] if self.messages else None
            if old.store_id is not None and self.store is not None:
                if question is not None and question.role == "user" and question.store_id is not None:
                    # Kept under its question as an alternative ("‹ 1/2 ›"); the new answer takes the next place.
                    self.history.call(self.store.keep_alternative, question.store_id, old.store_id)
                    question.alternatives = tuple(sorted(
                        (*question.alternatives, answer_position(question.alternatives)[0])))
                else:
                    self.history.call(self.store.delete_message, old.store_id)
        if not self.messages or self.messages[-1].role != "user":
            return False
        self.view.show_messages(self.messages)
        self.answers.start(sampling)
        return True

    def choose_alternative(self, position: int) -> bool:
        """Show the last question's answer at ``position`` (1-based) in place of the one shown; the one shown is
        kept among the alternatives. The chat is read again once the change is written."""
        if self.generating or len(self.messages) < 2 or self.store is None or self.chat_id is None:
            return False
        question, answer = self.messages[-2], self.messages[-1]
        shown, count = answer_position(question.alternatives)
        if (question.role != "user" or answer.role != "assistant" or question.store_id is None
                or answer.store_id is None or position == shown or not 1 <= position <= count):
            return False
        self.message_actions.commit_edit()
        self.message_actions.commit_message_delete()
        self.history.call(self.store.choose_alternative, question.store_id, answer.store_id, position)
        self.open_chat(self.chat_id)
        return True

    @Slot()
    def _on_view_palette_changed(self) -> None:
        if not self.generating:
            self.view.show_messages(self.messages)  # code blocks and drafted tints are drawn in palette colours

    @Slot(int)
    def _on_view_alternative_chosen(self, position: int) -> None:
        self.choose_alternative(position)

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
        self.answers.start(sampling, resume=last)
        return True

    def continue_in_new_chat(self) -> bool:
        """The chat outgrew the context: a new chat takes the last question, sent at once, with the latest
        turns before it that fit the context (the code the question refers to comes along). The model reads as
        many of them as fit, the oldest left out first, and the new chat keeps just those."""
        last = next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].role == "user"), None)
        if last is None or self.generating or self.bridge.loaded is None:
            return False
        question = self.messages[last].text
        carried = [replace(m, store_id=None, alternatives=()) for m in self.messages[:last]
                   if m.role in ("user", "assistant")]
        self.new_chat()
        if carried:
            self._begin_chat(question)
            if self.chat_id is not None:
                for message, store_id in zip(carried, self.message_actions.copy_messages(self.chat_id, carried),
                                             strict=True):
                    message.store_id = store_id
            self.messages = carried
            self.view.show_messages(self.messages)
            self.answers.carrying = True
        return self.send(question)

    def _begin_chat(self, first_question: str) -> None:
        """A new chat in the history for the open transcript, titled after its first question."""
        if self.store is None:
            return
        self.chat_id = self.history.new_chat(title_from(first_question), self.system_prompt.text())
        if self.chat_id is not None:
            self.history.call(self.store.set_mode, self.chat_id, "completion" if self.completion_mode else "chat")

    # --- the message actions (``message_actions``) ----------------------------------------------------

    def edit_last(self) -> bool:
        return self.message_actions.edit_last()

    def undo_edit(self) -> bool:
        return self.message_actions.undo_edit()

    def undo(self) -> bool:
        return self.message_actions.undo()

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

    # --- managing chats -----------------------------------------------------------------------------

    def rename_current_chat(self) -> bool:
        """Start renaming the open chat (else the one selected in the list), wherever the focus is."""
        return self.chat_list.rename(self.chat_id)

    def rename_chat(self, chat_id: int, title: str) -> None:
        if self.store is not None:
            self.history.call(self.store.rename_chat, chat_id, title)
        self.refresh_history()

    def delete_chat(self, chat_id: int) -> None:
        """Hide the chat at once and delete it for good after UNDO_DELETE_MS, unless undone."""
        if self.generating and chat_id == self.chat_id:
            return
        self.commit_pending_delete()
        self.message_actions.undo_order.append("chat")
        was_open = chat_id == self.chat_id
        neighbour = self.chat_list.hide_for_undo(chat_id)
        if was_open:
            self._leave_chat()  # nothing goes on in the deleted chat while its neighbour is read
            if neighbour is not None:  # the chat that took its row is shown next
                self.open_chat(neighbour)
            else:
                self.new_chat()
        self.refresh_history()
        self.chat_deleted.emit(chat_id)

    def undo_delete(self) -> bool:
        chat_id = self.chat_list.take_back()
        if chat_id is None:
            return False
        self.refresh_history()
        self.open_chat(chat_id)
        return True

    @Slot()
    def commit_pending_delete(self) -> None:
        """Deletions waiting for their undo become final (the next delete, the timer, SpecDeck closing)."""
        self.message_actions.commit_message_delete()
        for gone in self.chat_list.take_due():
            if self.store is not None:
                self.history.call(self.store.delete_chat, gone)

    # --- widgets ------------------------------------------------------------------------------------

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.update_buttons()
        self.generation_state_changed.emit(generating)

    def update_buttons(self) -> None:
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
        self.undo_edit_button.setVisible(idle and self.message_actions.pending_edit is not None)
        if not idle or not self.messages:
            self.new_chat_with_last_button.setVisible(False)
        elif last is not None and last.stop_reason == "context_full":
            self.new_chat_with_last_button.setVisible(True)
        previous = self.chat_list.previous_version(self.chat_id)
        newer = self.chat_list.newer_version(self.chat_id)
        self.version_button.setVisible(idle and (previous is not None or newer is not None))
        self.version_button.setText("Previous version" if previous is not None else "Newer version")
        self.version_button.setToolTip("Open the chat as it was before an earlier message was edited or answered "
                                       "again" if previous is not None else "Open the chat this version led to")

    @Slot(int)
    def _on_chat_list_chat_chosen(self, chat_id: int) -> None:
        if chat_id != self.chat_id:
            self.open_chat(chat_id)

    @Slot(int, str)
    def _on_chat_list_rename_requested(self, chat_id: int, title: str) -> None:
        if self.store is None:
            return
        if not title:
            self.refresh_history()  # an empty name is not a name: the old one comes back
            return
        self.rename_chat(chat_id, title)

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

    @Slot()
    def _on_new_chat_with_last_button_clicked(self) -> None:
        self.continue_in_new_chat()

    @Slot()
    def _on_undo_edit_button_clicked(self) -> None:
        self.undo_edit()

    @Slot()
    def _on_undo_delete_button_clicked(self) -> None:
        self.undo_delete()

    @Slot()
    def _on_undo_shortcut_activated(self) -> None:
        self.undo()

    @Slot(bool)
    def _on_highlight_check_toggled(self, on: bool) -> None:
        self.view.highlight_sources = on
        self.colour_key.setVisible(on)
        if not self.generating:
            self.view.show_messages(self.messages)
