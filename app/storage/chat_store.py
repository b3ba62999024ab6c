"""What a front end calls on a chat history: the window's chat panel and `specdeck serve`'s runner.

``HistoryStore`` (the SQLite file), ``BufferedHistory`` (writes kept in memory while another program holds
the lock) and ``HistoryThread`` (the window's writer thread) implement it; the callers are typed against it,
so mypy checks every call. Results a caller does not use are typed ``object`` (the stores differ there: a
write queued on the writer thread returns nothing yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from app.storage.history_rows import ChatSummary, StoredMessage

DraftedSpans = Sequence[tuple[int, int, str]]  # an answer's drafted character spans: (start, end, source)


class ChatStore(Protocol):
    # --- creates: they return the new chat's or message's id --------------------------------------------

    def new_chat(self, title: str = ..., system_prompt: str = ..., *, origin: str = ...,
                 version_of: int | None = ...) -> int: ...

    def add_message(self, chat_id: int, role: str, text: str, status: str = ..., *, model: str | None = ...,
                    drafter: str | None = ..., sampling: object = ..., stats: object = ...,
                    stop_reason: str | None = ..., drafted: DraftedSpans | None = ...) -> int: ...

    def begin_answer(self, chat_id: int, *, model: str | None = ..., drafter: str | None = ...,
                     sampling: object = ...) -> int: ...

    # --- writes --------------------------------------------------------------------------------------

    def update_answer(self, message_id: int, text: str) -> object: ...

    def finish_answer(self, message_id: int, text: str, status: str = ..., stats: object = ..., *,
                      stop_reason: str | None = ..., drafted: DraftedSpans | None = ...) -> None: ...

    def rename_chat(self, chat_id: int, title: str) -> None: ...

    def set_mode(self, chat_id: int, mode: str | None) -> None: ...

    def set_system_prompt(self, chat_id: int, system_prompt: str) -> None: ...

    def delete_chat(self, chat_id: int) -> None: ...

    def delete_message(self, message_id: int) -> None: ...

    def truncate_after(self, chat_id: int, message_id: int, *, inclusive: bool = ...) -> object: ...

    def keep_alternative(self, question_id: int, message_id: int) -> None: ...

    def choose_alternative(self, question_id: int, message_id: int, position: int) -> None: ...

    # --- reads ---------------------------------------------------------------------------------------

    def list_chats(self) -> list[ChatSummary]: ...

    def search_chats(self, query: str) -> list[int]: ...

    def chat(self, chat_id: int) -> ChatSummary: ...

    def messages(self, chat_id: int) -> list[StoredMessage]: ...

    def export_markdown(self, chat_id: int) -> str: ...

    def export_json(self, chat_id: int) -> str: ...

    def close(self) -> None: ...
