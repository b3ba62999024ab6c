"""The window's history on its own thread: one writer thread owns the database connection.

Saving a streamed answer fsyncs (synchronous=FULL) every half second; done on the GUI thread, each save
stalls painting and input. :class:`HistoryThread` opens a :class:`BufferedHistory` on a dedicated thread and
runs every call there, in the order given:

- writes whose result the window does not need (saving the answer as it streams, finishing it, renames,
  deletes) are queued and return at once; a failure reaches ``on_error`` (called on the writer thread);
- creates (they return the new id) and reads wait for their turn and return the result, so a read always
  sees every write queued before it;
- :meth:`chats_later`, :meth:`chat_later` and :meth:`export_later` read without waiting: the caller takes the
  result from a Future (the window hands it to the GUI thread by a queued signal), so an fsync queued before
  the read never holds the GUI thread;
- the ``*_later`` creates return at once with a handle (a large negative number) that stands for the new id:
  every later call, read or write, may pass it, and the writer thread puts the real id in its place (the
  create ran before, in order). The chat list gives this session's new chats their handles back.

BufferedHistory's guarantees hold unchanged, since every call still goes through it: a locked database
keeps writes in memory, in order, and :meth:`close` writes them or saves them to a side file.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from app.errors import StorageError
from app.storage.buffered_history import BufferedHistory
from app.storage.chat_store import DraftedSpans
from app.storage.history_rows import ChatSummary, StoredMessage

T = TypeVar("T")
HANDLE_BASE = -(1 << 30)  # ids handed out before their row exists: far below BufferedHistory's provisional
# ids (which count down from -1), and still a 32-bit int, as Qt signals and item data carry them
JOIN_TIMEOUT_S = 30.0  # close: BufferedHistory waits up to 5 s for a lock, then writes a side file


class HistoryThread:
    """BufferedHistory's methods, run on one writer thread that owns the connection."""

    def __init__(self, open_store: Callable[[], BufferedHistory] = BufferedHistory,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self.on_error = on_error
        self._handles: dict[int, int] = {}  # handle -> the store's id; written on the writer thread only
        self._chat_handles: dict[int, int] = {}  # the same, for chats only (chat and message ids overlap)
        self._handle_counter = itertools.count(HANDLE_BASE, -1)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="history-writer", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._store: BufferedHistory = self._call(open_store)
        except BaseException:
            self._stop()
            raise
        self.warning: str | None = self._store.warning

    @property
    def thread_id(self) -> int | None:
        """The writer thread's identifier: every database call runs on it."""
        return self._thread.ident

    # --- the thread -------------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the writer thread after everything queued before it; return its result or raise."""
        return self._submit(fn, *args, **kwargs).result()

    def _submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn`` on the writer thread; the Future gets its result or exception."""
        if self._closed:
            raise StorageError("The chat history is closed.")
        future: Future[T] = Future()

        def job() -> None:
            try:
                future.set_result(fn(*self._resolve(args), **kwargs))
            except BaseException as exc:  # handed to the caller, which raises it
                future.set_exception(exc)

        self._jobs.put(job)
        return future

    def _post(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn`` on the writer thread and return at once; a failure goes to ``on_error``."""
        if self._closed:
            raise StorageError("The chat history is closed.")

        def job() -> None:
            try:
                fn(*self._resolve(args), **kwargs)
            except KeyError:
                pass  # the chat or message was deleted meanwhile: the window's copy is what counts now
            except Exception as exc:
                if self.on_error is not None:
                    self.on_error(exc)

        self._jobs.put(job)

    def _resolve(self, args: tuple[Any, ...]) -> list[Any]:
        """On the writer thread: handles replaced by the ids their creates got (KeyError if a create failed)."""
        return [self._handles[a] if isinstance(a, int) and not isinstance(a, bool) and a <= HANDLE_BASE else a
                for a in args]

    def _create_later(self, create: Callable[..., int], *args: object, chat: bool = False,
                      **kwargs: object) -> int:
        handle = next(self._handle_counter)

        def run(*resolved: Any) -> None:
            # A keyword may name another create's handle too (new_chat's version_of).
            named = dict(zip(kwargs, self._resolve(tuple(kwargs.values())), strict=True))
            self._handles[handle] = new_id = int(create(*resolved, **named))
            if chat:
                self._chat_handles[handle] = new_id

        self._post(run, *args)
        return handle

    def _stop(self) -> None:
        self._closed = True
        self._jobs.put(None)
        self._thread.join(JOIN_TIMEOUT_S)

    # --- writes the window waits for (they return new ids) -------------------------------------------------

    def new_chat(self, title: str = "New chat", system_prompt: str = "", *, origin: str = "window",
                 version_of: int | None = None) -> int:
        return self._call(self._store.new_chat, title, system_prompt, origin=origin, version_of=version_of)

    def add_message(self, chat_id: int, role: str, text: str, status: str = "complete", *,
                    model: str | None = None, drafter: str | None = None, sampling: object = None,
                    stats: object = None, stop_reason: str | None = None,
                    drafted: DraftedSpans | None = None) -> int:
        return self._call(self._store.add_message, chat_id, role, text, status, model=model, drafter=drafter,
                          sampling=sampling, stats=stats, stop_reason=stop_reason, drafted=drafted)

    def begin_answer(self, chat_id: int, *, model: str | None = None, drafter: str | None = None,
                     sampling: object = None) -> int:
        return self._call(self._store.begin_answer, chat_id, model=model, drafter=drafter, sampling=sampling)

    # --- creates that do not wait: a handle now, the id on the writer thread --------------------------------

    def new_chat_later(self, title: str = "New chat", system_prompt: str = "", *, origin: str = "window",
                       version_of: int | None = None) -> int:
        return self._create_later(self._store.new_chat, title, system_prompt, chat=True, origin=origin,
                                  version_of=version_of)

    def add_message_later(self, chat_id: int, role: str, text: str, status: str = "complete", *,
                          model: str | None = None, drafter: str | None = None, sampling: object = None,
                          stats: object = None, stop_reason: str | None = None,
                          drafted: DraftedSpans | None = None) -> int:
        return self._create_later(self._store.add_message, chat_id, role, text, status, model=model,
                                  drafter=drafter, sampling=sampling, stats=stats, stop_reason=stop_reason,
                                  drafted=drafted)

    def begin_answer_later(self, chat_id: int, *, model: str | None = None, drafter: str | None = None,
                           sampling: object = None) -> int:
        return self._create_later(self._store.begin_answer, chat_id, model=model, drafter=drafter,
                                  sampling=sampling)

    # --- writes queued without waiting ----------------------------------------------------------------

    def update_answer(self, message_id: int, text: str) -> None:
        self._post(self._store.update_answer, message_id, text)

    def finish_answer(self, message_id: int, text: str, status: str = "complete", stats: object = None, *,
                      stop_reason: str | None = None, drafted: DraftedSpans | None = None) -> None:
        self._post(self._store.finish_answer, message_id, text, status, stats, stop_reason=stop_reason,
                   drafted=drafted)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._post(self._store.rename_chat, chat_id, title)

    def set_mode(self, chat_id: int, mode: str | None) -> None:
        self._post(self._store.set_mode, chat_id, mode)

    def set_system_prompt(self, chat_id: int, system_prompt: str) -> None:
        self._post(self._store.set_system_prompt, chat_id, system_prompt)

    def delete_chat(self, chat_id: int) -> None:
        self._post(self._store.delete_chat, chat_id)

    def delete_message(self, message_id: int) -> None:
        self._post(self._store.delete_message, message_id)

    def keep_alternative(self, question_id: int, message_id: int) -> None:
        self._post(self._store.keep_alternative, question_id, message_id)

    def choose_alternative(self, question_id: int, message_id: int, position: int) -> None:
        self._post(self._store.choose_alternative, question_id, message_id, position)

    def truncate_after(self, chat_id: int, message_id: int, *, inclusive: bool = False) -> None:
        self._post(self._store.truncate_after, chat_id, message_id, inclusive=inclusive)

    def flush_pending(self) -> None:
        """Write what BufferedHistory keeps waiting for a lock (a no-op when nothing waits)."""
        self._post(self._store.flush_pending)

    # --- reads --------------------------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return self._call(lambda: self._store.pending_count)

    def real_id(self, any_id: int) -> int:
        """The id in the database for a handle, a provisional id or a real one (KeyError: its create failed)."""
        return self._call(self._store.real_id, any_id)

    def list_chats(self) -> list[ChatSummary]:
        return self._call(self._store.list_chats)

    def chats_later(self, query: str = "") -> Future[tuple[list[ChatSummary], set[int] | None]]:
        """The chats (and the ids matching ``query``, when one is given) without waiting for them: the window's
        list is filled from the Future once the writes queued before it have run, so a slow write (an fsync, a
        lock) never holds the GUI thread."""

        def read() -> tuple[list[ChatSummary], set[int] | None]:
            handles = {self._store.real_id(new_id): h for h, new_id in self._chat_handles.items()}
            chats = [dataclasses.replace(c, id=handles.get(c.id, c.id),
                                         version_of=c.version_of and handles.get(c.version_of, c.version_of))
                     for c in self._store.list_chats()]
            matching = {handles.get(i, i) for i in self._store.search_chats(query)} if query else None
            return chats, matching

        return self._submit(read)

    def chat_later(self, chat_id: int) -> Future[tuple[ChatSummary, list[StoredMessage]]]:
        """A chat and its messages without waiting for them (opening a chat): the Future gets them once the
        writes queued before the read have run. KeyError in the Future: there is no such chat."""

        def read(resolved: int) -> tuple[ChatSummary, list[StoredMessage]]:
            return self._store.chat(resolved), self._store.messages(resolved)

        return self._submit(read, chat_id)

    def export_later(self, chat_id: int, *, as_json: bool = False) -> Future[str]:
        """The chat as Markdown (or JSON) without waiting for it, after the writes queued before it."""
        return self._submit(self._store.export_json if as_json else self._store.export_markdown, chat_id)

    def chat(self, chat_id: int) -> ChatSummary:
        return self._call(self._store.chat, chat_id)

    def messages(self, chat_id: int) -> list[StoredMessage]:
        return self._call(self._store.messages, chat_id)

    def message(self, message_id: int) -> StoredMessage:
        return self._call(self._store.message, message_id)

    def search_chats(self, query: str) -> list[int]:
        return self._call(self._store.search_chats, query)

    def export_markdown(self, chat_id: int) -> str:
        return self._call(self._store.export_markdown, chat_id)

    def export_json(self, chat_id: int) -> str:
        return self._call(self._store.export_json, chat_id)

    def integrity_ok(self) -> bool:
        return self._call(self._store.integrity_ok)

    def sync(self) -> None:
        """Wait until every write queued so far has run."""
        self._call(lambda: None)

    # --- closing ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Run what is queued, close the store on its thread (writing or side-filing what waits), stop."""
        if self._closed:
            return
        try:
            self._call(self._store.close)
        finally:
            self._stop()

    def __enter__(self) -> HistoryThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
