"""Chat history in SQLite, written so that a crash or a power cut loses at most the last second of an answer.

- WAL journal with ``synchronous=FULL``: every commit is on disk before the call returns.
- The user's message is committed before generation starts (``add_message``); the answer is a
  ``"streaming"`` row (``begin_answer``) whose text the caller flushes at least once a second
  (``update_answer``, one small UPDATE) and closes with ``finish_answer``.
- On open, an answer left ``"streaming"`` by a crash is marked ``"interrupted"`` and kept with its text.
- Every write is one transaction: a full disk raises :class:`app.errors.StorageError` and leaves the
  database as it was before that call.
- The schema is versioned with ``PRAGMA user_version``; ``MIGRATIONS[n]`` takes version n to n + 1
  (``app.storage.history_rows``, with the rows, how their values are cleaned, and the exports).

Threads: a store belongs to the thread that opened it (sqlite3's ``check_same_thread`` stays on, so a
call from another thread raises ``sqlite3.ProgrammingError`` instead of racing). The window uses it from
one writer thread (``app/storage/history_writer.py``), never the GUI thread.

Over 500 lines: every write is one transaction with its own checks on the same connection (the salvage of a
damaged file, the migrations and the exports included); the rows and their cleaning live in history_rows.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from app.errors import StorageError
from app.paths import data_dir
from app.storage.atomic import describe_os_error
from app.storage.history_repair import Salvaged, fix_readonly_shm, quick_check, salvage
from app.storage.history_rows import (
    FINAL_STATUSES,
    MIGRATIONS,
    MODES,
    ORIGINS,
    ROLES,
    SCHEMA_VERSION,
    STATUSES,
    ChatSummary,
    StoredMessage,
    answer_position,
    chat_json,
    chat_markdown,
    clean_text,
    from_json,
    read_spans,
    spans_json,
    to_json,
)

_T = TypeVar("_T")

FILE_NAME = "history.sqlite3"


def _sqlite_reason(exc: sqlite3.Error) -> tuple[str, str]:
    name = getattr(exc, "sqlite_errorname", "")
    msg = str(exc).lower()
    if name == "SQLITE_FULL" or "disk is full" in msg:
        return "the disk is full", "Free some space and try again"
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED") or "locked" in msg:
        return "the history is in use by another SpecDeck window", "Close the other window and try again"
    if name.startswith("SQLITE_READONLY") or "readonly" in msg:
        return "the history file is read-only", "Check the permissions of the data folder"
    if name.startswith("SQLITE_IOERR") or "i/o error" in msg:
        return "the disk reported an input/output error", "Check the disk and free space"
    if name.startswith("SQLITE_CORRUPT") or "malformed" in msg:
        return "the history file is damaged", "Export what you can and restart SpecDeck"
    return str(exc), "Try again"


class _Damaged(Exception):
    """PRAGMA quick_check found damage in a file that opens."""


class HistoryBusyError(StorageError):
    """Another connection holds the database's write lock past the busy timeout: try again later."""


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc).lower()


def _storage_error(exc: sqlite3.Error) -> StorageError:
    reason, advice = _sqlite_reason(exc)
    kind = HistoryBusyError if _is_busy(exc) else StorageError
    return kind(
        f"Could not save the chat history: {reason} ({exc}). {advice}; messages already saved are kept."
    )


def _irregular(path: Path) -> bool:
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # missing: a new history is created
        return False


class HistoryStore:
    """All chats and their messages. Use from one thread (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, busy_timeout: float = 5.0,
                 check_damage: bool = True) -> None:
        self.path = Path(path) if path is not None else data_dir() / FILE_NAME
        self.busy_timeout = busy_timeout  # seconds a write waits for another connection's lock
        self.check_damage = check_damage  # PRAGMA quick_check at open (up to QUICK_CHECK_SECONDS)
        self.warning: str | None = None  # set when a damaged file was moved aside at open
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                describe_os_error(exc, "the chat history", self.path.parent, kept="no chat was changed")
            ) from exc
        try:
            try:
                self._conn = self._retry_busy(self._open)
            except (sqlite3.OperationalError, StorageError) as exc:
                # A -shm left read-only refuses every write even after the file's permissions are fixed.
                if "readonly" not in str(exc).lower() or not fix_readonly_shm(self.path):
                    raise
                self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            name = getattr(exc, "sqlite_errorname", "")
            if not (name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in str(exc)
                    or "malformed" in str(exc)):
                raise _storage_error(exc) from exc
            self._recover_from_damage(str(exc))
        except _Damaged as exc:
            self._recover_from_damage(str(exc))

    def _recover_from_damage(self, problem: str) -> None:
        """Move the damaged file aside, start a new history, and copy into it whatever can still be read."""
        aside = self._move_aside()
        try:
            self._conn = self._open()
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc
        try:
            found = salvage(self.path.with_name(aside), self._conn)
        except sqlite3.Error:
            found = Salvaged()
        kept = f"It was kept as {aside}"
        if found.seen:
            missing = (" Some messages were in the damaged part and could not be read: recovered chats may "
                       "miss some of theirs.") if found.messages_missing else ""
            self.warning = (f"The chat history file was damaged ({problem}). {kept}; {found.chats} of {found.seen} "
                            f"chats could be read and were recovered into a new history.{missing}")
        else:
            self.warning = (f"The chat history file was damaged ({problem}) and no chat could be read from it. "
                            f"{kept} and a new, empty history was started.")

    # --- opening ------------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if _irregular(self.path):
            # SQLite would block for ever reading a FIFO, and read or write a device.
            raise StorageError(f"The chat history at {self.path} is not a regular file (a pipe, a device or a "
                               "folder); move it away to start a new history. Nothing was changed.")
        # isolation_level=None: no implicit transactions; every write below says where it begins and ends.
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        try:
            # The version first: a newer SpecDeck's file is refused before anything (even the journal
            # mode, which is in the file header) is changed.
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"The chat history at {self.path} was written by a newer SpecDeck (history version "
                    f"{version}; this one knows up to {SCHEMA_VERSION}). Update SpecDeck to open it; "
                    "nothing was changed."
                )
            # Damage the file still opens with, found before anything is written into it.
            problem = quick_check(conn) if version and self.check_damage else None
            if problem is not None:
                raise _Damaged(problem)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._conn = conn
            self._migrate(version)
            with self._write():
                now = time.time()
                conn.execute(
                    "UPDATE messages SET status='interrupted', updated=? WHERE status='streaming'", (now,)
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, version: int) -> None:
        for n in range(version, SCHEMA_VERSION):
            with self._write() as conn:
                # Another process may have migrated since the version was read; the write lock is held now.
                if int(conn.execute("PRAGMA user_version").fetchone()[0]) > n:
                    continue
                for statement in MIGRATIONS[n]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={n + 1}")

    def _retry_busy(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()`` again with backoff while another connection holds the lock, up to busy_timeout.

        SQLite's own busy handler waits for most locks, but some (a journal-mode switch, WAL recovery,
        a lock upgrade) answer SQLITE_BUSY at once.
        """
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.005
        while True:
            try:
                return attempt()
            except (sqlite3.OperationalError, HistoryBusyError) as exc:
                if not (isinstance(exc, HistoryBusyError) or _is_busy(exc)) or time.monotonic() > deadline:
                    raise
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)
    def _move_aside(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        n = 0
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.bad-{stamp}-{n}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                try:
                    os.replace(src, f"{aside}{suffix}")
                except OSError as exc:
                    raise StorageError(describe_os_error(
                        exc, "the chat history", self.path.parent, kept="no chat was changed"
                    )) from exc
        return aside.name

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction; any SQLite failure rolls it back and becomes a StorageError."""
        conn = self._conn
        try:
            self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:  # SQLite may already have rolled back (e.g. on SQLITE_FULL)
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.ProgrammingError):
                raise _storage_error(exc) from exc
            raise

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- chats --------------------------------------------------------------------------------------

    def new_chat(self, title: str = "New chat", system_prompt: str = "", *, origin: str = "window",
                 version_of: int | None = None) -> int:
        """``version_of``: this chat keeps an earlier version of that chat (its continuation before an edit)."""
        if origin not in ORIGINS:
            raise ValueError(f"origin must be one of {ORIGINS}, not {origin!r}")
        now = time.time()
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO chats (title, system_prompt, created, updated, origin, version_of)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (clean_text(title), clean_text(system_prompt), now, now, origin, version_of),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def list_chats(self) -> list[ChatSummary]:
        """Most recently updated first."""
        rows = self._conn.execute(
            "SELECT c.id, c.title, c.system_prompt, c.created, c.updated,"
            " (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id), c.origin, c.version_of, c.mode"
            " FROM chats c ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [ChatSummary(*row) for row in rows]

    def chat(self, chat_id: int) -> ChatSummary:
        row = self._conn.execute(
            "SELECT c.id, c.title, c.system_prompt, c.created, c.updated,"
            " (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id), c.origin, c.version_of, c.mode"
            " FROM chats c WHERE c.id = ?",
            (chat_id,),
        ).fetchone()
        if row is None:
            raise KeyError(f"There is no chat {chat_id}.")
        return ChatSummary(*row)

    def search_chats(self, query: str) -> list[int]:
        """Ids of the chats whose title or any message contains ``query`` (case-insensitive for ASCII),
        most recently updated first."""
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._conn.execute(
            "SELECT c.id FROM chats c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
            " WHERE m.chat_id = c.id AND m.text LIKE ?1 ESCAPE '\\') ORDER BY c.updated DESC, c.id DESC",
            (pattern,),
        ).fetchall()
        return [row[0] for row in rows]

    def rename_chat(self, chat_id: int, title: str) -> None:
        """A new title only: a rename is not activity, so the chat keeps its place in the list."""
        with self._write() as conn:
            cur = conn.execute("UPDATE chats SET title=? WHERE id=?", (clean_text(title), chat_id))
            if cur.rowcount == 0:
                raise KeyError(f"There is no chat {chat_id}.")

    def set_mode(self, chat_id: int, mode: str | None) -> None:
        """Remember the chat's mode (MODES); not activity, so the chat keeps its place in the list."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {MODES} or None, not {mode!r}")
        with self._write() as conn:
            if conn.execute("UPDATE chats SET mode=? WHERE id=?", (mode, chat_id)).rowcount == 0:
                raise KeyError(f"There is no chat {chat_id}.")

    def set_system_prompt(self, chat_id: int, system_prompt: str) -> None:
        with self._write() as conn:
            self._touch(conn, chat_id, "system_prompt=?", clean_text(system_prompt))

    def delete_chat(self, chat_id: int) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM chats WHERE id=?", (chat_id,))  # messages go by ON DELETE CASCADE

    @staticmethod
    def _touch(conn: sqlite3.Connection, chat_id: int, assignment: str = "", value: object = None) -> None:
        now = time.time()
        if assignment:
            cur = conn.execute(f"UPDATE chats SET {assignment}, updated=? WHERE id=?", (value, now, chat_id))
        else:
            cur = conn.execute("UPDATE chats SET updated=? WHERE id=?", (now, chat_id))
        if cur.rowcount == 0:
            raise KeyError(f"There is no chat {chat_id}.")

    # --- messages -----------------------------------------------------------------------------------

    def messages(self, chat_id: int) -> list[StoredMessage]:
        """In conversation order."""
        rows = self._conn.execute(
            "SELECT id, chat_id, role, text, status, target_model, drafter, sampling, stats, created, updated,"
            " stop_reason, drafted"
            " FROM messages WHERE chat_id=? ORDER BY id",
            (chat_id,),
        ).fetchall()
        kept: dict[int, list[int]] = {}
        for question_id, position in self._conn.execute(
            "SELECT a.question_id, a.position FROM alternatives a JOIN messages m ON m.id = a.question_id"
            " WHERE m.chat_id=? ORDER BY a.position",
            (chat_id,),
        ):
            kept.setdefault(question_id, []).append(position)
        return [self._message(row, tuple(kept.get(row[0], ()))) for row in rows]

    def recent_answers(self, max_chars: int) -> list[str]:
        """The newest complete answers, oldest first, up to ``max_chars`` characters in all (the suffix
        drafter's memory across chats)."""
        out: list[str] = []
        total = 0
        rows = self._conn.execute(
            "SELECT text FROM messages WHERE role='assistant' AND status='complete' ORDER BY id DESC")
        for (text,) in rows:
            if total + len(text) > max_chars:
                break
            out.append(text)
            total += len(text)
        out.reverse()
        return out

    def message(self, message_id: int) -> StoredMessage:
        row = self._conn.execute(
            "SELECT id, chat_id, role, text, status, target_model, drafter, sampling, stats, created, updated,"
            " stop_reason, drafted"
            " FROM messages WHERE id=?",
            (message_id,),
        ).fetchone()
        if row is None:
            raise KeyError(f"There is no message {message_id}.")
        return self._message(row)

    @staticmethod
    def _message(row: Sequence[Any], alternatives: tuple[int, ...] = ()) -> StoredMessage:
        return StoredMessage(
            id=row[0], chat_id=row[1], role=row[2], text=row[3], status=row[4], target_model=row[5],
            drafter=row[6], sampling=from_json(row[7]), stats=from_json(row[8]), created=row[9],
            updated=row[10], stop_reason=row[11], drafted=read_spans(row[12]), alternatives=alternatives,
        )

    def add_message(
        self,
        chat_id: int,
        role: str,
        text: str,
        status: str = "complete",
        *,
        model: str | None = None,
        drafter: str | None = None,
        sampling: object = None,
        stats: object = None,
        stop_reason: str | None = None,
        drafted: Sequence[Sequence[Any]] | None = None,
    ) -> int:
        """Commit one message (the user's, before generation starts; a whole answer when a chat is copied).
        ``sampling``/``stats``: a dataclass (SamplingSettings, MessageStats) or a mapping; ``drafted``: the
        answer's drafted character spans. Raises KeyError for an unknown chat."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        record = (clean_text(text), status, model, drafter, to_json(sampling), to_json(stats))
        now = time.time()
        with self._write() as conn:
            self._touch(conn, chat_id)
            cur = conn.execute(
                "INSERT INTO messages (chat_id, role, text, status, target_model, drafter, sampling, stats,"
                " created, updated, stop_reason, drafted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (chat_id, role, *record, now, now, stop_reason, spans_json(drafted)),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def begin_answer(
        self, chat_id: int, *, model: str | None = None, drafter: str | None = None, sampling: object = None
    ) -> int:
        """An empty assistant message with status "streaming"; fill it with update_answer."""
        return self.add_message(chat_id, "assistant", "", "streaming", model=model, drafter=drafter,
                                sampling=sampling)

    def update_answer(self, message_id: int, text: str) -> bool:
        """Save the answer so far: one UPDATE, one commit. Call it at least once a second while streaming.

        Returns False when the message is gone or already finished (nothing is written then). An answer
        another SpecDeck marked "interrupted" at its start is taken back to "streaming".
        """
        try:
            cur = self._retry_busy(lambda: self._conn.execute(
                "UPDATE messages SET text=?, status='streaming', updated=?"
                " WHERE id=? AND status IN ('streaming', 'interrupted')",
                (clean_text(text), time.time(), message_id),
            ))
        except sqlite3.ProgrammingError:
            raise
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc
        return cur.rowcount == 1

    def finish_answer(
        self, message_id: int, text: str, status: str = "complete", stats: object = None,
        stop_reason: str | None = None, drafted: Sequence[Sequence[Any]] | None = None,
    ) -> None:
        """``drafted``: which characters of ``text`` a drafter proposed, ``[(start, end, source), ...]``, so
        a reopened chat can show them highlighted."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"status must be one of {FINAL_STATUSES}, not {status!r}")
        with self._write() as conn:
            row = conn.execute("SELECT chat_id FROM messages WHERE id=?", (message_id,)).fetchone()
            if row is None:
                raise KeyError(f"There is no message {message_id}.")
            conn.execute(
                "UPDATE messages SET text=?, status=?, stats=?, stop_reason=?, drafted=?, updated=? WHERE id=?",
                (clean_text(text), status, to_json(stats), stop_reason, spans_json(drafted), time.time(),
                 message_id),
            )
            self._touch(conn, row[0])

    def delete_message(self, message_id: int) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM messages WHERE id=?", (message_id,))

    def truncate_after(self, chat_id: int, message_id: int, *, inclusive: bool = False) -> int:
        """Delete the messages after ``message_id`` in this chat (and it too when ``inclusive``): for
        regenerate (keep the question) and edit-and-resend. Returns how many were deleted."""
        with self._write() as conn:
            op = ">=" if inclusive else ">"
            cur = conn.execute(f"DELETE FROM messages WHERE chat_id=? AND id {op} ?", (chat_id, message_id))
            if cur.rowcount:
                self._touch(conn, chat_id)
        return cur.rowcount

    # --- alternatives of an answer ------------------------------------------------------------------

    _ANSWER_FIELDS = "text, status, target_model, drafter, sampling, stats, stop_reason, drafted"

    def _answer_and_positions(self, conn: sqlite3.Connection, question_id: int,
                              message_id: int) -> tuple[tuple[Any, ...], list[int]]:
        row = conn.execute(f"SELECT {self._ANSWER_FIELDS}, chat_id FROM messages WHERE id=? AND role='assistant'",
                           (message_id,)).fetchone()
        question = conn.execute("SELECT chat_id FROM messages WHERE id=?", (question_id,)).fetchone()
        if row is None or question is None or question[0] != row[-1]:
            raise KeyError(f"There is no answer {message_id} to message {question_id}.")
        positions = [p for (p,) in conn.execute("SELECT position FROM alternatives WHERE question_id=?",
                                                (question_id,))]
        answer = row[:-1]
        if answer[1] == "streaming":
            answer = (answer[0], "interrupted", *answer[2:])
        return answer, positions

    def _keep(self, conn: sqlite3.Connection, question_id: int, position: int, answer: Sequence[Any]) -> None:
        conn.execute(f"INSERT INTO alternatives (question_id, position, {self._ANSWER_FIELDS})"
                     " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (question_id, position, *answer))

    def keep_alternative(self, question_id: int, message_id: int) -> None:
        """Regenerate of the last answer: the answer leaves the chat and is kept as an alternative of its
        question (the new answer takes the next position). KeyError when either message is gone."""
        with self._write() as conn:
            answer, positions = self._answer_and_positions(conn, question_id, message_id)
            self._keep(conn, question_id, answer_position(positions)[0], answer)
            chat_id = conn.execute("SELECT chat_id FROM messages WHERE id=?", (message_id,)).fetchone()[0]
            conn.execute("DELETE FROM messages WHERE id=?", (message_id,))
            self._touch(conn, chat_id)

    def choose_alternative(self, question_id: int, message_id: int, position: int) -> None:
        """Show the alternative at ``position`` as the answer (the next question continues from it); the
        answer shown until now is kept at its own position. Not activity: the chat keeps its place."""
        with self._write() as conn:
            answer, positions = self._answer_and_positions(conn, question_id, message_id)
            chosen = conn.execute(f"SELECT id, {self._ANSWER_FIELDS} FROM alternatives"
                                  " WHERE question_id=? AND position=?", (question_id, position)).fetchone()
            if chosen is None:
                raise KeyError(f"Message {question_id} has no alternative {position}.")
            self._keep(conn, question_id, answer_position(positions)[0], answer)
            conn.execute("DELETE FROM alternatives WHERE id=?", (chosen[0],))
            conn.execute("UPDATE messages SET text=?, status=?, target_model=?, drafter=?, sampling=?, stats=?,"
                         " stop_reason=?, drafted=?, updated=? WHERE id=?", (*chosen[1:], time.time(), message_id))

    # --- checks and export --------------------------------------------------------------------------

    def integrity_ok(self) -> bool:
        """PRAGMA integrity_check (reads the whole file: not for every start of a big history)."""
        try:
            rows = self._conn.execute("PRAGMA integrity_check").fetchall()
        except sqlite3.DatabaseError:
            return False
        return [tuple(r) for r in rows] == [("ok",)]

    def export_markdown(self, chat_id: int) -> str:
        return chat_markdown(self.chat(chat_id), self.messages(chat_id))

    def export_json(self, chat_id: int) -> str:
        return chat_json(self.chat(chat_id), self.messages(chat_id))
