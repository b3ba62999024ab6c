"""The chat panel's line to the history: every write and read it makes, and what a failure does.

A failure to save (a full disk) is reported and the chat goes on in memory. With the window's writer thread
(``HistoryThread``) nothing here waits on the GUI thread: creates return a handle at once (it stands for the
new id in every later call) and reads arrive by callback (``ui.history_reads``); a plain store (a test's)
answers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from app.errors import StorageError
from app.params import SamplingSettings
from app.storage.chat_store import ChatStore, DraftedSpans
from app.storage.history_rows import ChatSummary, StoredMessage
from app.storage.history_writer import HistoryThread
from ui.history_reads import ReadDelivery, read_now

P = ParamSpec("P")
T = TypeVar("T")


class HistoryLink:
    """Create on the GUI thread; ``report`` shows a failure (one sentence) to the user."""

    def __init__(self, store: ChatStore | None, reads: ReadDelivery, report: Callable[[str], None]) -> None:
        self.store = store
        self._reads = reads
        self._report = report

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """``fn`` (a method of the store) with its arguments; None when it failed (a failure is reported)."""
        try:
            return fn(*args, **kwargs)
        except StorageError as exc:
            self._report(str(exc))
        except KeyError:
            pass  # the chat was deleted elsewhere; the chat in memory is what counts now
        return None

    # --- creates: the new id, or the writer thread's handle for it; None without a store or on failure ---

    def new_chat(self, title: str, system_prompt: str, *, version_of: int | None = None) -> int | None:
        store = self.store
        if store is None:
            return None
        create = store.new_chat_later if isinstance(store, HistoryThread) else store.new_chat
        return self.call(create, title, system_prompt, version_of=version_of)

    def add_message(self, chat_id: int, role: str, text: str, status: str = "complete", *,
                    model: str | None = None, drafter: str | None = None, stats: object = None,
                    stop_reason: str | None = None, drafted: DraftedSpans | None = None) -> int | None:
        store = self.store
        if store is None:
            return None
        create = store.add_message_later if isinstance(store, HistoryThread) else store.add_message
        return self.call(create, chat_id, role, text, status, model=model, drafter=drafter, stats=stats,
                         stop_reason=stop_reason, drafted=drafted)

    def begin_answer(self, chat_id: int, *, model: str | None, drafter: str | None,
                     sampling: SamplingSettings) -> int | None:
        store = self.store
        if store is None:
            return None
        create = store.begin_answer_later if isinstance(store, HistoryThread) else store.begin_answer
        return self.call(create, chat_id, model=model, drafter=drafter, sampling=sampling)

    # --- reads ------------------------------------------------------------------------------------------

    def stored_id(self, chat_id: int | None) -> int | None:
        """A chat's id in the database (a handle resolved; waits for the writer: for closing only)."""
        if chat_id is None or not isinstance(self.store, HistoryThread):
            return chat_id
        try:
            return self.store.real_id(chat_id)
        except (KeyError, StorageError):
            return None

    def read_chats(self, query: str, done: Callable[[list[ChatSummary], set[int] | None], None],
                   failed: Callable[[BaseException], None]) -> None:
        """The chats, and the ids matching ``query`` (None without one), to ``done``."""
        store = self.store
        if store is None:
            done([], None)
            return
        if isinstance(store, HistoryThread):
            try:
                future = store.chats_later(query)
            except StorageError as exc:
                failed(exc)
                return
            self._reads.deliver(future, lambda read: done(*read), failed)
            return
        try:  # a store without a writer thread (a test's): read here
            chats = store.list_chats()
        except Exception as exc:
            failed(exc)
            return
        matching: set[int] | None = None
        if query:
            try:
                matching = set(store.search_chats(query))
            except StorageError as exc:
                self._report(str(exc))
        done(chats, matching)

    def read_chat(self, chat_id: int, done: Callable[[ChatSummary, list[StoredMessage]], None],
                  failed: Callable[[BaseException], None]) -> None:
        """A chat and its messages, to ``done``; KeyError to ``failed`` when there is no such chat."""
        store = self.store
        if store is None:
            return
        if isinstance(store, HistoryThread):
            try:
                future = store.chat_later(chat_id)
            except StorageError as exc:
                failed(exc)
                return
        else:
            future = read_now(lambda: (store.chat(chat_id), store.messages(chat_id)))
        self._reads.deliver(future, lambda read: done(*read), failed)
