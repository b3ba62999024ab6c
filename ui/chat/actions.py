"""What the user does to the messages of the open chat: copy, edit (Edit last), delete and regenerate one
message; the earlier versions an edit or a regenerate keeps; and Ctrl+Z, which takes back the newest of a
message deletion, an edit not yet sent, or a chat deletion.

Nothing is lost before it has to be: a message deleted, or a turn taken back for editing, stays in the history
until the chat changes again (the edited question is sent), so undo puts it back where it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot
from PySide6.QtGui import QGuiApplication

from app.errors import SettingsError
from app.events import drafted_spans
from ui.chat.message import ChatMessage

if TYPE_CHECKING:
    from ui.chat.panel import ChatPanel


class MessageActions(QObject):
    """The panel's message actions; the panel holds the chat, its widgets and its history."""

    def __init__(self, panel: ChatPanel) -> None:
        super().__init__(panel)
        self.panel = panel
        # Edit last: where the turn taken back began and its messages, kept (in the view's memory and in the
        # history) until the edited question is sent; Undo edit brings them back.
        self.pending_edit: tuple[int, list[ChatMessage]] | None = None
        # A message deleted from the transcript: hidden at once, deleted from the history at the next change
        # to the chat (or when SpecDeck closes), so Ctrl+Z can put it back where it was.
        self._pending_message_delete: tuple[int, ChatMessage] | None = None
        self.undo_order: list[str] = []  # "edit", "message", "chat": what Ctrl+Z takes back, newest last

    @Slot(str, int)
    def on_view_message_action(self, action: str, index: int) -> None:
        {"copy": self.copy_message, "edit": self.edit_message, "delete": self.delete_message,
         "regenerate": self.regenerate_message}[action](index)

    # --- edit ---------------------------------------------------------------------------------------

    def edit_last(self) -> bool:
        """Take the last question back into the input box to edit and resend (see edit_message)."""
        users = [i for i, m in enumerate(self.panel.messages) if m.role == "user"]
        return bool(users) and self.edit_message(users[-1])

    def edit_message(self, index: int) -> bool:
        """Take a question back into the input box to edit and resend. It and what followed leave the view but
        nothing is deleted until the edited question is sent (Undo edit and Ctrl+Z bring them back); once sent,
        the old continuation is kept as the chat's previous version."""
        panel = self.panel
        if panel.generating or not 0 <= index < len(panel.messages) or panel.messages[index].role != "user":
            return False
        self.commit_edit()  # an earlier edit not sent: its turn is replaced by this one's
        self.commit_message_delete()
        question = panel.messages[index]
        self.pending_edit = (index, panel.messages[index:])
        self.undo_order.append("edit")
        del panel.messages[index:]
        panel.view.show_messages(panel.messages)
        panel.input.setPlainText(question.text)
        panel.input.setFocus()
        panel.update_buttons()
        return True

    def undo_edit(self) -> bool:
        """Bring back the turn Edit last took away (the input box keeps what was typed)."""
        panel = self.panel
        if panel.generating or self.pending_edit is None:
            return False
        index, removed = self.pending_edit
        self.pending_edit = None
        if index != len(panel.messages):
            return False  # the chat moved on meanwhile (it cannot: sending commits); nothing to put back
        panel.messages.extend(removed)
        if panel.input.toPlainText() == removed[0].text:
            panel.input.clear()
        panel.view.show_messages(panel.messages)
        panel.update_buttons()
        return True

    def commit_edit(self) -> None:
        """The edited question is being sent: the turn it replaces (and what followed) moves to the chat's
        previous version, and leaves this chat's history now."""
        panel = self.panel
        pending, self.pending_edit = self.pending_edit, None
        if pending is None or panel.store is None:
            return
        index, removed = pending
        if len(removed) > 1:  # an answer, at least, would be lost: keep the old continuation reachable
            self._keep_previous_version(panel.messages[:index] + removed)
        question = removed[0]
        if question.store_id is not None and panel.chat_id is not None:
            panel.history.call(panel.store.truncate_after, panel.chat_id, question.store_id, inclusive=True)
        else:
            for m in pending[1]:
                if m.store_id is not None:
                    panel.history.call(panel.store.delete_message, m.store_id)

    # --- one message --------------------------------------------------------------------------------

    def copy_message(self, index: int) -> bool:
        """Put one message's text, as written, on the clipboard."""
        if not 0 <= index < len(self.panel.messages):
            return False
        QGuiApplication.clipboard().setText(self.panel.messages[index].text)
        return True

    def delete_message(self, index: int) -> bool:
        """Take one message out of the chat; Ctrl+Z puts it back until the chat changes again."""
        panel = self.panel
        if panel.generating or not 0 <= index < len(panel.messages):
            return False
        self.commit_message_delete()
        message = panel.messages.pop(index)
        self._pending_message_delete = (index, message)
        if self.pending_edit is not None and index < self.pending_edit[0]:
            self.pending_edit = (self.pending_edit[0] - 1, self.pending_edit[1])
        self.undo_order.append("message")
        panel.view.show_messages(panel.messages)
        panel.update_buttons()
        return True

    def commit_message_delete(self) -> None:
        panel = self.panel
        pending, self._pending_message_delete = self._pending_message_delete, None
        if pending is not None and pending[1].store_id is not None and panel.store is not None:
            panel.history.call(panel.store.delete_message, pending[1].store_id)

    def undo_message_delete(self) -> bool:
        panel = self.panel
        pending = self._pending_message_delete
        if panel.generating or pending is None or pending[0] > len(panel.messages):
            return False
        self._pending_message_delete = None
        index, message = pending
        panel.messages.insert(index, message)
        if self.pending_edit is not None and index <= self.pending_edit[0]:
            self.pending_edit = (self.pending_edit[0] + 1, self.pending_edit[1])
        panel.view.show_messages(panel.messages)
        panel.update_buttons()
        return True

    def regenerate_message(self, index: int) -> bool:
        """Answer the question before this answer again. An earlier answer's continuation is kept as the
        chat's previous version; the last answer is simply replaced (as Regenerate does)."""
        panel = self.panel
        if index == len(panel.messages) - 1:
            return panel.regenerate()
        if (panel.generating or not 0 < index < len(panel.messages) or panel.messages[index].role != "assistant"
                or panel.messages[index - 1].role != "user" or panel.bridge.loaded is None):
            return False
        try:
            sampling = panel.sampling_form.settings()
        except SettingsError as exc:
            panel.error_raised.emit(str(exc))
            return False
        self.commit_edit()
        self.commit_message_delete()
        self._keep_previous_version(list(panel.messages))
        first = panel.messages[index]
        if first.store_id is not None and panel.chat_id is not None and panel.store is not None:
            panel.history.call(panel.store.truncate_after, panel.chat_id, first.store_id, inclusive=True)
        del panel.messages[index:]
        panel.view.show_messages(panel.messages)
        panel.answers.start(sampling)
        return True

    # --- versions and Ctrl+Z ------------------------------------------------------------------------

    def _keep_previous_version(self, messages: list[ChatMessage]) -> None:
        """A copy of the chat as it was (before an edit or an earlier answer's regenerate) in a chat of its
        own, linked to this one: the "Previous version" button opens it."""
        panel = self.panel
        if panel.chat_id is None or panel.store is None or not messages:
            return
        title = panel.chat_list.title(panel.chat_id) or "Untitled chat"
        copy = panel.history.new_chat(f"{title} (earlier version)", panel.system_prompt.text(),
                                      version_of=panel.chat_id)
        if copy is None:
            return
        self.copy_messages(copy, messages)
        panel.chat_list.add_version(copy, panel.chat_id)
        panel.refresh_history()

    def copy_messages(self, chat_id: int, messages: list[ChatMessage]) -> list[int | None]:
        """Save copies of ``messages`` into the chat ``chat_id``, with their figures; the copies' store ids."""
        return [self.panel.history.add_message(chat_id, m.role, m.text,
                                               "interrupted" if m.status == "streaming" else m.status,
                                               model=m.model, drafter=m.drafter, stats=m.stats,
                                               stop_reason=m.stop_reason,
                                               drafted=drafted_spans(m.pieces, len(m.text)) or None)
                for m in messages]

    def switch_version(self) -> bool:
        """Open the open chat's previous version, or from a previous version the chat it came from (shown when
        it arrives, as ``open_chat`` says)."""
        panel = self.panel
        target = panel.chat_list.previous_version(panel.chat_id) or panel.chat_list.newer_version(panel.chat_id)
        if target is None or panel.generating:
            return False
        panel.open_chat(target)
        panel.refresh_history()
        return True

    @Slot()
    def on_version_button_clicked(self) -> None:
        self.switch_version()

    def undo(self) -> bool:
        """Ctrl+Z: take back the newest of a message deletion, an edit not yet sent, or a chat deletion."""
        while self.undo_order:
            kind = self.undo_order.pop()
            done = {"message": self.undo_message_delete, "edit": self.undo_edit,
                    "chat": self.panel.undo_delete}[kind]()
            if done:
                return True
        return False
