"""Damage checks and salvage for the history database, and the leftovers that keep SQLite from opening it.

- :func:`quick_check` runs ``PRAGMA quick_check`` with a time bound (a progress handler stops it), so a
  big history never delays the start by more than the bound; an unfinished check counts as no damage.
- :func:`salvage` copies what can still be read from a damaged file, row by row: a row that raises is
  skipped and the scan goes on after it, so damage in one page loses that page's rows, not the file.
- :func:`fix_readonly_shm` makes a leftover read-only ``-shm`` file writable again (or removes it; SQLite
  rebuilds it from the WAL), after the user fixed the permissions of the database itself.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUICK_CHECK_SECONDS = 2.0
MAX_SKIPS = 100_000  # unreadable rows skipped before a table's scan gives up


def quick_check(conn: sqlite3.Connection, seconds: float = QUICK_CHECK_SECONDS) -> str | None:
    """The first problem ``PRAGMA quick_check`` reports, or None (also when it ran out of time)."""
    deadline = time.monotonic() + seconds
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    try:
        rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.OperationalError as exc:
        if "interrupt" in str(exc).lower():
            return None
        return str(exc)
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.set_progress_handler(None, 0)
    problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
    return problems[0] if problems else None


def _rows(conn: sqlite3.Connection, table: str, columns: list[str],
          damaged: list[int] | None = None) -> Iterator[tuple[Any, ...]]:
    """Every readable row of ``table`` in id order; unreadable ones are stepped over (and counted in
    ``damaged``'s one item, when given)."""
    last = -(1 << 62)
    skips = 0
    select = f"SELECT {', '.join(columns)} FROM {table} WHERE id > ? ORDER BY id"
    while skips < MAX_SKIPS:
        try:
            for row in conn.execute(select, (last,)):
                last = row[0]
                yield tuple(row)
            return
        except sqlite3.DatabaseError:
            skips += 1
            if damaged is not None:
                damaged[0] += 1
            # Step past the damaged row: find the next id the index can still give, else go one further.
            try:
                found = conn.execute(f"SELECT min(id) FROM {table} WHERE id > ?", (last + 1,)).fetchone()
            except sqlite3.DatabaseError:
                found = None
            nxt = found[0] if found and found[0] is not None else None
            last = nxt if nxt is not None and nxt > last + 1 else last + 1


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    try:
        return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        return []


@dataclass(frozen=True)
class Salvaged:
    chats: int = 0  # recovered
    seen: int = 0  # chats that could be read at all
    messages_missing: bool = False  # messages were in damaged pages, or belonged to a chat that was lost


def salvage(damaged: Path, into: sqlite3.Connection) -> Salvaged:
    """Copy readable chats, their messages and their answers' alternatives from ``damaged`` into ``into`` (a
    fresh, migrated history).

    Messages whose chat is lost are not copied, nor alternatives whose question is.
    """
    # immutable: no lock files are created beside the kept copy; with a WAL beside it, its pages count too.
    mode = "mode=ro" if Path(f"{damaged}-wal").exists() else "mode=ro&immutable=1"
    try:
        src = sqlite3.connect(f"{damaged.as_uri()}?{mode}", uri=True)
    except sqlite3.Error:
        return Salvaged()
    recovered = seen = 0
    unreadable = [0]
    orphans = 0
    try:
        with contextlib.suppress(sqlite3.Error):
            src.execute("PRAGMA query_only=ON")
        want_chats = ["id", "title", "system_prompt", "created", "updated"]
        have = set(_columns(src, "chats"))
        if not set(want_chats) <= have:
            return Salvaged()
        target_msg_cols = _columns(into, "messages")
        msg_cols = [c for c in _columns(src, "messages") if c in target_msg_cols]
        chats: dict[int, tuple[Any, ...]] = {}
        for row in _rows(src, "chats", want_chats, unreadable):
            seen += 1
            chats[int(row[0])] = row
        messages: list[tuple[Any, ...]] = []
        if "id" in msg_cols and "chat_id" in msg_cols:
            chat_at = msg_cols.index("chat_id")
            readable = list(_rows(src, "messages", msg_cols, unreadable))
            messages = [row for row in readable if row[chat_at] in chats]
            orphans = len(readable) - len(messages)
        into.execute("BEGIN IMMEDIATE")
        try:
            for row in chats.values():
                try:
                    into.execute(f"INSERT INTO chats ({', '.join(want_chats)}) VALUES (?, ?, ?, ?, ?)", row)
                    recovered += 1
                except sqlite3.IntegrityError:
                    chats.pop(int(row[0]), None)
            marks = ", ".join("?" for _ in msg_cols)
            kept: set[int] = set()
            for row in messages:
                with contextlib.suppress(sqlite3.IntegrityError):  # a value the schema's checks refuse
                    into.execute(f"INSERT INTO messages ({', '.join(msg_cols)}) VALUES ({marks})", row)
                    kept.add(int(row[0]))
            _copy_alternatives(src, into, kept, unreadable)
            into.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                into.execute("ROLLBACK")
            raise
    finally:
        src.close()
    return Salvaged(recovered, seen, messages_missing=unreadable[0] > 0 or orphans > 0 or recovered < seen)


def _copy_alternatives(src: sqlite3.Connection, into: sqlite3.Connection, questions: set[int],
                       unreadable: list[int]) -> None:
    """A regenerated answer's earlier versions, under the questions that were copied (a history older than the
    alternatives has none)."""
    target_cols = _columns(into, "alternatives")
    cols = [c for c in _columns(src, "alternatives") if c in target_cols]
    if "id" not in cols or "question_id" not in cols:
        return
    question_at = cols.index("question_id")
    marks = ", ".join("?" for _ in cols)
    for row in _rows(src, "alternatives", cols, unreadable):
        if row[question_at] in questions:
            with contextlib.suppress(sqlite3.IntegrityError):
                into.execute(f"INSERT INTO alternatives ({', '.join(cols)}) VALUES ({marks})", row)


def fix_readonly_shm(db: Path) -> bool:
    """Make ``db``'s ``-shm`` writable (or remove it) when it is the one thing refusing writes.

    Only when the database file itself is writable: otherwise the user has not fixed the permissions yet,
    and the error that says so is the right one. Returns True when something was changed.
    """
    shm = Path(f"{db}-shm")
    if not shm.exists() or os.access(shm, os.W_OK) or not os.access(db, os.W_OK):
        return False
    try:
        os.chmod(shm, 0o600)
        return True
    except OSError:
        pass
    try:
        # No writer can be using a -shm this user cannot write, so SQLite may rebuild it from the WAL.
        shm.unlink()
        return True
    except OSError:
        return False
