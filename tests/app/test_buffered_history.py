"""The window's history under a lock held by another program: nothing freezes, no turn is lost."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.params import SamplingSettings
from app.storage.buffered_history import BufferedHistory
from app.storage.history import HistoryStore


@contextmanager
def locked(path: Path) -> Iterator[sqlite3.Connection]:
    """Another program holding the database's write lock (as `sqlite3 history.sqlite3` in a shell can)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def _one_turn(store: BufferedHistory | HistoryStore, title: str) -> tuple[int, int, int]:
    chat = store.new_chat(title, "Be brief.")
    user = store.add_message(chat, "user", f"{title}: question")
    answer = store.begin_answer(chat, model="/m/t.gguf", sampling=SamplingSettings(temperature=0.5))
    assert store.update_answer(answer, "partial")
    store.finish_answer(answer, f"{title}: answer", "complete")
    return chat, user, answer


def _saved_turns(path: Path) -> list[tuple[str, list[tuple[str, str, str]]]]:
    with HistoryStore(path) as s:
        return [(c.title, [(m.role, m.text, m.status) for m in s.messages(c.id)])
                for c in reversed(s.list_chats())]


def test_a_lock_held_at_startup_keeps_turns_in_memory_and_writes_them_later(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as s:
        s.new_chat("before")
    with locked(path):
        started = time.monotonic()
        store = BufferedHistory(path)
        assert time.monotonic() - started < 2.0  # the window opens without waiting for the lock
        assert not store.available
        assert store.warning is not None
        assert "kept in memory" in store.warning
        chat, user, answer = _one_turn(store, "while locked")
        assert max(chat, user, answer) < 0  # provisional ids
        assert store.pending_count > 0
        # The waiting turn is shown, with its latest text.
        assert [c.title for c in store.list_chats()] == ["while locked"]
        assert [(m.role, m.text, m.status) for m in store.messages(chat)] == [
            ("user", "while locked: question", "complete"), ("assistant", "while locked: answer", "complete")]
    time.sleep(2.1)  # past the longest retry interval
    assert store.flush_pending()  # the database is free again: everything is written, in order
    assert store.pending_count == 0
    assert store.available
    assert store.real_id(chat) > 0
    chat_after, _, _ = _one_turn(store, "after")  # and later turns go straight in
    assert chat_after > 0
    store.close()
    assert _saved_turns(path) == [
        ("before", []),
        ("while locked", [("user", "while locked: question", "complete"),
                          ("assistant", "while locked: answer", "complete")]),
        ("after", [("user", "after: question", "complete"), ("assistant", "after: answer", "complete")]),
    ]


def test_a_lock_taken_mid_session_buffers_then_catches_up(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    store = BufferedHistory(path)
    chat, _, _ = _one_turn(store, "first")
    with locked(path):
        started = time.monotonic()
        user = store.add_message(chat, "user", "second question")
        answer = store.begin_answer(chat)
        for n in range(5):
            assert store.update_answer(answer, "second answer"[: 3 + n])
        store.finish_answer(answer, "second answer", "interrupted")
        assert time.monotonic() - started < 3.0  # each write waited a fraction of a second, at most
        assert max(user, answer) < 0
        assert store.pending_count <= 4  # the streaming flushes of one answer were merged
        assert [m.text for m in store.messages(chat)][-2:] == ["second question", "second answer"]
    time.sleep(2.1)  # past the longest retry interval
    store.rename_chat(chat, "renamed")  # the next write finds the database free and writes all in order
    assert store.pending_count == 0
    store.close()
    assert _saved_turns(path) == [("renamed", [
        ("user", "first: question", "complete"), ("assistant", "first: answer", "complete"),
        ("user", "second question", "complete"), ("assistant", "second answer", "interrupted")])]


def test_writes_still_waiting_at_close_are_kept_and_written_next_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import app.storage.buffered_history as buffered

    monkeypatch.setattr(buffered, "CLOSE_TIMEOUT_S", 0.3)
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path):
        pass
    with locked(path):
        store = BufferedHistory(path)
        _one_turn(store, "unsaved")
        store.close()
        [side] = tmp_path.glob("history.sqlite3.unsaved-*.json")
    again = BufferedHistory(path)
    assert again.warning is not None
    assert "could not be saved last time were saved now" in again.warning
    again.close()
    assert not side.exists()
    assert _saved_turns(path) == [
        ("unsaved", [("user", "unsaved: question", "complete"), ("assistant", "unsaved: answer", "complete")])]


def test_a_side_file_naming_no_history_write_is_left_alone(tmp_path: Path) -> None:
    """A side file is read at start: one naming anything but a history write (here a private method that
    would move the database aside) is not run; it stays where it is, and the history opens untouched."""
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        store.new_chat("kept")
    side = tmp_path / "history.sqlite3.unsaved-20260101-000000-1.json"
    side.write_text(json.dumps({"format": "specdeck-unsaved-history", "version": 1, "writes": [
        {"method": "_move_aside", "args": [], "kwargs": {}, "provisional": None}]}), encoding="utf-8")
    store = BufferedHistory(path)
    try:
        assert [c.title for c in store.list_chats()] == ["kept"]
        assert store.pending_count == 0
    finally:
        store.close()
    assert side.exists()
    assert path.exists()
