"""The history keeps why each answer ended (schema version 2), migrates a version-1 file, and searches
titles and message text."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.storage.history import HistoryStore
from app.storage.history_rows import MIGRATIONS


def test_stop_reason_is_stored_and_read_back(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        chat = store.new_chat("t")
        store.add_message(chat, "user", "q")
        answer = store.begin_answer(chat)
        store.finish_answer(answer, "cut mid", "complete", None, stop_reason="max_tokens")
        assert [m.stop_reason for m in store.messages(chat)] == [None, "max_tokens"]


def test_a_version_1_history_gains_the_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO chats (title, created, updated) VALUES ('old', 0, 0)")
    conn.execute("INSERT INTO messages (chat_id, role, text, status, created, updated)"
                 " VALUES (1, 'assistant', 'kept', 'complete', 0, 0)")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with HistoryStore(path) as store:
        (message,) = store.messages(1)
        assert (message.text, message.stop_reason) == ("kept", None)
        store.finish_answer(message.id, "kept", "complete", None, stop_reason="eog")
        assert store.message(message.id).stop_reason == "eog"


def test_search_finds_titles_and_message_text_and_treats_wildcards_literally(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        a = store.new_chat("Rust lifetimes")
        b = store.new_chat("Other")
        store.add_message(b, "user", "What does 100% mean in a_b?")
        assert store.search_chats("rust") == [a]
        assert store.search_chats("100%") == [b]
        assert store.search_chats("a_b") == [b]
        assert store.search_chats("a%b") == []
        assert set(store.search_chats("")) == {a, b}
