"""HistoryThread: the history on one writer thread keeps BufferedHistory's guarantees (order, a lock held
by another program, what waits at close) and reports a failed queued write instead of losing it silently."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from app.errors import StorageError
from app.storage.buffered_history import BufferedHistory
from app.storage.history import HistoryStore
from app.storage.history_writer import HistoryThread
from tests.app.test_buffered_history import _saved_turns, locked


def _turn(store: HistoryThread, title: str) -> int:
    chat = store.new_chat(title)
    store.add_message(chat, "user", f"{title}: question")
    answer = store.begin_answer(chat, model="/m/t.gguf")
    for n in range(1, 20):
        store.update_answer(answer, "word " * n)  # queued: returns before the database is touched
    store.finish_answer(answer, f"{title}: answer", "complete", stop_reason="eog")
    return chat


def test_queued_writes_run_in_order_on_one_thread(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    threads: set[int] = set()

    def open_store() -> BufferedHistory:
        threads.add(threading.get_ident())
        return BufferedHistory(path)

    with HistoryThread(open_store) as store:
        chat = _turn(store, "first")
        assert [m.text for m in store.messages(chat)] == ["first: question", "first: answer"]  # reads wait
        assert threads == {store.thread_id}
        assert store.thread_id != threading.get_ident()
    assert _saved_turns(path) == [
        ("first", [("user", "first: question", "complete"), ("assistant", "first: answer", "complete")])]


def test_a_lock_keeps_turns_in_memory_and_close_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path):
        pass
    with locked(path):
        store = HistoryThread(lambda: BufferedHistory(path))
        _turn(store, "while locked")
        assert store.pending_count > 0
        assert [c.title for c in store.list_chats()] == ["while locked"]
    store.close()  # the lock is gone: close writes what waited
    assert _saved_turns(path) == [
        ("while locked", [("user", "while locked: question", "complete"),
                          ("assistant", "while locked: answer", "complete")])]


def test_a_failed_queued_write_is_reported(tmp_path: Path) -> None:
    errors: list[Exception] = []
    with HistoryThread(lambda: BufferedHistory(tmp_path / "history.sqlite3"), on_error=errors.append) as store:
        chat = store.new_chat("x")
        store._call(lambda: store._store._store._conn.close())  # type: ignore[union-attr]  # the file is gone
        store.rename_chat(chat, "y")  # returns at once; fails on the writer thread
        store.sync()
    assert errors
    with pytest.raises(StorageError):
        store.new_chat("after close")


def test_creates_that_do_not_wait_hand_out_handles_that_stand_for_the_ids(tmp_path: Path) -> None:
    """A turn made with the *_later creates, while another program holds the lock and then after: every call
    may pass the handles; the rows land under real ids, and the chat list shows this session's chats by
    their handles."""
    path = tmp_path / "history.sqlite3"
    with HistoryThread(lambda: BufferedHistory(path)) as store:
        store.sync()
        with locked(path):
            chat = store.new_chat_later("held")
            question = store.add_message_later(chat, "user", "held: question")
            answer = store.begin_answer_later(chat, model="/m/t.gguf")
            store.update_answer(answer, "part")
            store.finish_answer(answer, "held: answer", "complete", stop_reason="eog")
            assert min(chat, question, answer) < 0  # handles, not ids
            assert [m.text for m in store.messages(chat)] == ["held: question", "held: answer"]
        other = store.real_id(store.new_chat("a create that waits"))
        deadline = time.monotonic() + 30
        while store.pending_count and time.monotonic() < deadline:  # the lock's backoff runs out, then all is written
            store.flush_pending()
            time.sleep(0.05)
        real = store.real_id(chat)
        assert real > 0
        other = store.real_id(other)
        assert other > 0
        chats, matching = store.chats_later("held").result(timeout=30)
        assert {c.title: c.id for c in chats} == {"held": chat, "a create that waits": other}
        assert matching == {chat}
        store.truncate_after(chat, question)  # the handles still work for later writes
        assert [m.text for m in store.messages(chat)] == ["held: question"]
    saved = HistoryStore(path)
    try:
        assert [m.text for m in saved.messages(real)] == ["held: question"]
    finally:
        saved.close()


def test_a_failed_create_is_reported_and_later_calls_with_its_handle_are_dropped(tmp_path: Path) -> None:
    errors: list[Exception] = []
    with HistoryThread(lambda: BufferedHistory(tmp_path / "history.sqlite3"), on_error=errors.append) as store:
        bad = store.add_message_later(123456, "nobody", "no such role")  # refused by the store
        store.update_answer(store.begin_answer_later(bad), "nothing to attach to")
        store.sync()
        assert errors  # the refused create reached on_error, on the writer thread
        with pytest.raises(KeyError):
            store.real_id(bad)
