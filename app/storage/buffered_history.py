"""The history as the window uses it: a write the database cannot take now waits in memory instead of failing.

Another program (or another SpecDeck) may hold the database's lock for seconds, at startup or at any
time. The window must neither freeze waiting for it nor lose a turn, so :class:`BufferedHistory` offers
:class:`HistoryStore`'s methods and:

- waits at most ``busy_timeout`` (a fraction of a second) for a lock, then keeps the write in memory, in
  order, and answers at once (a new chat or message gets a provisional negative id);
- writes what waits, in order, at the next call once the database is free again (or on
  :meth:`flush_pending`, which the window calls on a timer), translating provisional ids to real ones;
- shows waiting chats and messages in its reads, so nothing disappears from the window meanwhile;
- at :meth:`close`, saves what still cannot be written to a file beside the database
  (``history.sqlite3.unsaved-*.json``), which the next start writes into the history.

Only a lock waits this way; a full disk or a damaged file still raises ``StorageError`` at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from app.errors import StorageError
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_regular_bytes
from app.storage.history import FILE_NAME, HistoryBusyError, HistoryStore
from app.storage.history_rows import ChatSummary, StoredMessage

_T = TypeVar("_T")
BUSY_TIMEOUT_S = 0.05  # how long the window waits for another writer's lock before buffering (twice, at most)
CLOSE_TIMEOUT_S = 5.0  # at close, a last, longer wait before saving the rest to a side file
MAX_RETRY_INTERVAL_S = 2.0
_CREATES = ("new_chat", "add_message", "begin_answer")  # writes that return a new id
# A waiting write names its method (a side file keeps the name): only these are ever called, so a side file
# from an earlier session can name nothing else.
WRITES: dict[str, Callable[..., Any]] = {
    "new_chat": HistoryStore.new_chat,
    "add_message": HistoryStore.add_message,
    "begin_answer": HistoryStore.begin_answer,
    "update_answer": HistoryStore.update_answer,
    "finish_answer": HistoryStore.finish_answer,
    "rename_chat": HistoryStore.rename_chat,
    "set_mode": HistoryStore.set_mode,
    "set_system_prompt": HistoryStore.set_system_prompt,
    "keep_alternative": HistoryStore.keep_alternative,
    "choose_alternative": HistoryStore.choose_alternative,
    "delete_chat": HistoryStore.delete_chat,
    "delete_message": HistoryStore.delete_message,
    "truncate_after": HistoryStore.truncate_after,
}


@dataclass
class _Write:
    method: str
    args: list[Any]
    kwargs: dict[str, Any]
    provisional: int | None = None  # the id handed out for a create
    created: float = field(default_factory=time.time)


def _plain(value: Any) -> Any:
    """Dataclass arguments (SamplingSettings, MessageStats) as mappings, so a waiting write can be saved."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class BufferedHistory:
    """HistoryStore's methods, with writes buffered while the database is locked. One thread, like it."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path) if path is not None else data_dir() / FILE_NAME
        self.busy_timeout = busy_timeout
        self.warning: str | None = None
        self._store: HistoryStore | None = None
        self._pending: list[_Write] = []
        self._real: dict[int, int] = {}  # provisional id -> id in the database
        self._next_provisional = -1
        self._retry_at = 0.0
        self._retry_interval = 0.05
        self._taken: list[Path] = []  # side files whose writes wait in _pending
        self._opened_once = False
        self._connect()  # StorageError other than a lock (a newer file, no permission) is raised here
        if self._store is None:
            self.warning = ("The chat history is in use by another program. Your chats are kept in memory and "
                            "saved as soon as it is free.")
        else:
            self.warning = self._store.warning
        self._take_unsaved_files()

    # --- the connection -------------------------------------------------------------------------------

    def _connect(self) -> HistoryStore | None:
        """The open store; None while the lock is held (tried again after a backoff, not on every call)."""
        if time.monotonic() < self._retry_at:
            return None
        if self._store is not None:
            return self._store
        try:
            # The damage check reads the whole file: once per start, not at every retry on the GUI thread.
            self._store = HistoryStore(self.path, busy_timeout=self.busy_timeout, check_damage=not self._opened_once)
            self._opened_once = True
        except HistoryBusyError:
            self._opened_once = True  # the check ran (or was locked out) once: later retries skip it
            self._backoff()
            return None
        return self._store

    def _backoff(self) -> None:
        # Each try may wait up to busy_timeout on the GUI thread: while the lock stays, try less and less often.
        self._retry_interval = min(self._retry_interval * 2, MAX_RETRY_INTERVAL_S)
        self._retry_at = time.monotonic() + self._retry_interval

    @property
    def available(self) -> bool:
        """True when the database is open (writes may still wait for a lock)."""
        return self._store is not None

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def real_id(self, any_id: int) -> int:
        """The database id for a provisional one once it is written; ids already real are returned as is."""
        return self._real.get(any_id, any_id)

    # --- writes ---------------------------------------------------------------------------------------

    def _resolve(self, args: list[Any]) -> list[Any]:
        return [self._real.get(a, a) if isinstance(a, int) and not isinstance(a, bool) and a < 0 else a
                for a in args]

    def _run(self, write: _Write) -> Any:
        store = self._connect()
        if store is None:
            raise HistoryBusyError("The chat history is in use by another program.")
        try:
            named = dict(zip(write.kwargs, self._resolve(list(write.kwargs.values())), strict=True))
            result = WRITES[write.method](store, *self._resolve(write.args), **named)
        except HistoryBusyError:
            self._backoff()
            raise
        self._retry_interval = 0.05
        if write.provisional is not None:
            self._real[write.provisional] = int(result)
        return result

    def flush_pending(self) -> bool:
        """Write what waits, in order; True when nothing waits any more. Raises StorageError (not a lock)."""
        while self._pending:
            write = self._pending[0]
            try:
                self._run(write)
            except HistoryBusyError:
                return False
            except KeyError:
                pass  # its chat or message was deleted meanwhile (here or in another window): nothing to write
            self._pending.pop(0)
        for side in self._taken:  # everything they held is in the database now
            side.unlink(missing_ok=True)
        self._taken.clear()
        return True

    def _write(self, method: str, *args: Any, **kwargs: Any) -> Any:
        write = _Write(method, [_plain(a) for a in args], {k: _plain(v) for k, v in kwargs.items()})
        if self.flush_pending():
            try:
                return self._run(write)
            except HistoryBusyError:
                pass
        if method in _CREATES:
            write.provisional = self._next_provisional
            self._next_provisional -= 1
        last = self._pending[-1] if self._pending else None
        if (method == "update_answer" and last is not None and last.method == "update_answer"
                and last.args[0] == write.args[0]):
            self._pending[-1] = write  # the newer text replaces the older: both would be written in turn
        else:
            self._pending.append(write)
        return write.provisional if write.provisional is not None else (True if method == "update_answer" else
                                                                         (0 if method == "truncate_after" else None))

    def new_chat(self, title: str = "New chat", system_prompt: str = "", **kwargs: Any) -> int:
        return int(self._write("new_chat", title, system_prompt, **kwargs))

    def add_message(self, chat_id: int, role: str, text: str, status: str = "complete", **kwargs: Any) -> int:
        return int(self._write("add_message", chat_id, role, text, status, **kwargs))

    def begin_answer(self, chat_id: int, **kwargs: Any) -> int:
        return int(self._write("begin_answer", chat_id, **kwargs))

    def update_answer(self, message_id: int, text: str) -> bool:
        return bool(self._write("update_answer", message_id, text))

    def finish_answer(self, message_id: int, text: str, status: str = "complete", stats: object = None,
                      **kwargs: Any) -> None:
        self._write("finish_answer", message_id, text, status, stats, **kwargs)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._write("rename_chat", chat_id, title)

    def set_mode(self, chat_id: int, mode: str | None) -> None:
        self._write("set_mode", chat_id, mode)

    def set_system_prompt(self, chat_id: int, system_prompt: str) -> None:
        self._write("set_system_prompt", chat_id, system_prompt)

    def delete_chat(self, chat_id: int) -> None:
        self._write("delete_chat", chat_id)

    def delete_message(self, message_id: int) -> None:
        self._write("delete_message", message_id)

    def keep_alternative(self, question_id: int, message_id: int) -> None:
        self._write("keep_alternative", question_id, message_id)

    def choose_alternative(self, question_id: int, message_id: int, position: int) -> None:
        self._write("choose_alternative", question_id, message_id, position)

    def truncate_after(self, chat_id: int, message_id: int, *, inclusive: bool = False) -> int:
        return int(self._write("truncate_after", chat_id, message_id, inclusive=inclusive))

    # --- reads: the database, with what waits laid over it ----------------------------------------------

    def _read(self, read: Callable[..., _T], *args: int | str) -> _T:
        """``read``: a HistoryStore method, called on the open store with ``args`` (provisional ids resolved)."""
        store = self._store or self._connect()  # reads need no write lock: an open store is read at once
        if store is None:
            raise StorageError("The chat history is in use by another program; it is read again when it is free.")
        try:
            return read(store, *self._resolve(list(args)))
        except HistoryBusyError as exc:
            raise StorageError(str(exc)) from exc

    def _waiting_chats(self) -> list[ChatSummary]:
        out = []
        for w in self._pending:
            if w.method == "new_chat" and w.provisional is not None and w.provisional not in self._real:
                count = sum(1 for m in self._pending if m.method in ("add_message", "begin_answer")
                            and m.args[0] == w.provisional)
                out.append(ChatSummary(w.provisional, str(w.args[0]), str(w.args[1]), w.created, w.created, count,
                                       version_of=w.kwargs.get("version_of")))
        return out

    def _waiting_messages(self, chat_id: int) -> list[StoredMessage]:
        ids = {chat_id, self.real_id(chat_id)}
        out: dict[int, StoredMessage] = {}
        for w in self._pending:
            if w.method in ("add_message", "begin_answer") and w.args[0] in ids and w.provisional is not None:
                role, text, status = ("assistant", "", "streaming") if w.method == "begin_answer" else (
                    str(w.args[1]), str(w.args[2]), str(w.args[3]))
                out[w.provisional] = StoredMessage(
                    id=w.provisional, chat_id=chat_id, role=role, text=text, status=status,
                    target_model=w.kwargs.get("model"), drafter=w.kwargs.get("drafter"),
                    sampling=w.kwargs.get("sampling"), stats=w.kwargs.get("stats"),
                    created=w.created, updated=w.created, stop_reason=w.kwargs.get("stop_reason"),
                    drafted=tuple(tuple(s) for s in w.kwargs.get("drafted") or ()))
            elif w.method in ("update_answer", "finish_answer") and w.args[0] in out:
                old = out[w.args[0]]
                status = "streaming" if w.method == "update_answer" else str(w.args[2])
                out[w.args[0]] = dataclasses.replace(old, text=str(w.args[1]), status=status, updated=w.created)
                if w.method == "finish_answer":
                    out[w.args[0]] = dataclasses.replace(
                        out[w.args[0]], stop_reason=w.kwargs.get("stop_reason"),
                        drafted=tuple(tuple(s) for s in w.kwargs.get("drafted") or ()))
            elif w.method == "delete_message":
                out.pop(w.args[0], None)
            elif w.method == "keep_alternative":
                out.pop(w.args[1], None)
        return list(out.values())

    def list_chats(self) -> list[ChatSummary]:
        """Most recently updated first; chats waiting to be written come first."""
        try:
            saved = self._read(HistoryStore.list_chats)
        except StorageError:
            if self._store is not None:
                raise
            saved = []
        return [*reversed(self._waiting_chats()), *saved]

    def chat(self, chat_id: int) -> ChatSummary:
        for waiting in self._waiting_chats():
            if waiting.id == chat_id:
                return waiting
        return self._read(HistoryStore.chat, chat_id)

    def messages(self, chat_id: int) -> list[StoredMessage]:
        saved: list[StoredMessage] = []
        if not (chat_id < 0 and chat_id not in self._real):
            saved = self._read(HistoryStore.messages, chat_id)
        return [*saved, *self._waiting_messages(chat_id)]

    def message(self, message_id: int) -> StoredMessage:
        return self._read(HistoryStore.message, message_id)

    def search_chats(self, query: str) -> list[int]:
        return self._read(HistoryStore.search_chats, query)

    def export_markdown(self, chat_id: int) -> str:
        self.flush_pending()
        return self._read(HistoryStore.export_markdown, chat_id)

    def export_json(self, chat_id: int) -> str:
        self.flush_pending()
        return self._read(HistoryStore.export_json, chat_id)

    def integrity_ok(self) -> bool:
        return self._read(HistoryStore.integrity_ok)

    # --- closing, and what could not be written -------------------------------------------------------

    def close(self) -> None:
        """Write what waits (waiting up to CLOSE_TIMEOUT_S for the lock); keep the rest in a side file."""
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while self._pending and time.monotonic() < deadline:
            self._retry_at = 0.0
            with contextlib.suppress(StorageError):
                if self.flush_pending():
                    break
            time.sleep(0.05)
        if self._pending:
            self._save_unsaved()
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> BufferedHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _save_unsaved(self) -> None:
        doc = {"format": "specdeck-unsaved-history", "version": 1, "writes": [
            {"method": w.method, "args": self._resolve(w.args), "kwargs": w.kwargs, "provisional": w.provisional}
            for w in self._pending]}
        stamp = time.strftime("%Y%m%d-%H%M%S")
        side = self.path.with_name(f"{self.path.name}.unsaved-{stamp}-{os.getpid()}.json")
        atomic_write_json(side, doc)  # StorageError if even this fails: the caller must say so
        self._pending.clear()
        for old in self._taken:  # their writes are in the new file
            old.unlink(missing_ok=True)
        self._taken.clear()

    def _take_unsaved_files(self) -> None:
        """Queue the writes an earlier session could not make, ahead of this session's, and write them."""
        sides = sorted(self.path.parent.glob(f"{self.path.name}.unsaved-*.json"))
        taken = 0
        for side in sides:
            try:
                doc = json.loads(read_regular_bytes(side).decode("utf-8"))
                writes = doc["writes"] if isinstance(doc, Mapping) else None
                if not isinstance(writes, list):
                    continue
                remap: dict[int, int] = {}
                parsed: list[_Write] = []
                for raw in writes:
                    old = raw.get("provisional")
                    provisional = None
                    if isinstance(old, int):
                        provisional = remap[old] = self._next_provisional
                        self._next_provisional -= 1
                    args = [remap.get(a, a) if isinstance(a, int) and not isinstance(a, bool) and a < 0 else a
                            for a in raw["args"]]
                    method = str(raw["method"])
                    if method not in WRITES:
                        raise ValueError(f"not a history write: {method!r}")
                    parsed.append(_Write(method, args, dict(raw["kwargs"]), provisional))
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue  # left in place for the user; the warning below counts only what was taken
            self._pending += parsed
            taken += len(parsed)
            self._taken.append(side)
        if taken:
            with contextlib.suppress(StorageError):
                self.flush_pending()
            note = f"{taken} changes to the chat history that could not be saved last time were saved now."
            self.warning = f"{self.warning} {note}" if self.warning else note
