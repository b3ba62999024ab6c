"""Regenerate keeps the replaced answer: each question holds its earlier answers as alternatives (a real
SQLite file), one of them can be shown in the answer's place, and they go with their question."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.history import HistoryStore
from app.storage.history_rows import SCHEMA_VERSION, answer_position


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(tmp_path / "history.sqlite3") as s:
        yield s


def _chat(store: HistoryStore) -> tuple[int, int, int]:
    chat = store.new_chat("t")
    question = store.add_message(chat, "user", "Q")
    answer = store.add_message(chat, "assistant", "first", model="/m/target.gguf", stop_reason="eog",
                               drafted=[(0, 3, "ngram")])
    return chat, question, answer


@pytest.mark.parametrize(("kept", "expected"), [((), (1, 1)), ((1,), (2, 2)), ((2, 3), (1, 3)), ((1, 3), (2, 3))])
def test_the_answer_shown_holds_the_position_missing(kept: tuple[int, ...], expected: tuple[int, int]) -> None:
    assert answer_position(kept) == expected


def test_regenerate_keeps_the_old_answer_and_choose_shows_it_again(store: HistoryStore) -> None:
    chat, question, answer = _chat(store)
    store.keep_alternative(question, answer)
    assert [m.role for m in store.messages(chat)] == ["user"]
    assert store.messages(chat)[0].alternatives == (1,)
    second = store.add_message(chat, "assistant", "second", stop_reason="max_tokens")
    store.keep_alternative(question, second)
    third = store.add_message(chat, "assistant", "third")
    messages = store.messages(chat)
    assert messages[0].alternatives == (1, 2)
    assert answer_position(messages[0].alternatives) == (3, 3)

    store.choose_alternative(question, third, 1)
    messages = store.messages(chat)
    assert [m.text for m in messages] == ["Q", "first"]
    shown = messages[1]
    assert (shown.id, shown.target_model, shown.stop_reason, shown.drafted) == (
        third, "/m/target.gguf", "eog", ((0, 3, "ngram"),))  # the alternative's own record, in the same row
    assert messages[0].alternatives == (2, 3)
    assert answer_position(messages[0].alternatives) == (1, 3)
    store.choose_alternative(question, third, 3)
    assert [m.text for m in store.messages(chat)] == ["Q", "third"]
    assert store.messages(chat)[0].alternatives == (1, 2)
    assert store.integrity_ok()


def test_a_missing_message_or_position_is_a_key_error_and_changes_nothing(store: HistoryStore) -> None:
    chat, question, answer = _chat(store)
    other_chat, other_question, _ = _chat(store)
    with pytest.raises(KeyError):
        store.keep_alternative(other_question, answer)  # an answer of another chat
    with pytest.raises(KeyError):
        store.keep_alternative(question, question)  # a question is no answer
    with pytest.raises(KeyError):
        store.choose_alternative(question, answer, 2)
    assert [m.text for m in store.messages(chat)] == ["Q", "first"]
    assert store.messages(chat)[0].alternatives == ()
    assert [m.text for m in store.messages(other_chat)] == ["Q", "first"]


def test_an_interrupted_answer_is_kept_as_interrupted(store: HistoryStore) -> None:
    chat = store.new_chat("t")
    question = store.add_message(chat, "user", "Q")
    streaming = store.add_message(chat, "assistant", "half", "streaming")
    store.keep_alternative(question, streaming)
    store.add_message(chat, "assistant", "whole")
    store.choose_alternative(question, store.messages(chat)[1].id, 1)
    assert [(m.text, m.status) for m in store.messages(chat)][1] == ("half", "interrupted")


def test_alternatives_go_with_their_question_and_their_chat(store: HistoryStore, tmp_path: Path) -> None:
    _, question, answer = _chat(store)
    store.keep_alternative(question, answer)
    store.delete_message(question)
    second_chat, second_question, second_answer = _chat(store)
    store.keep_alternative(second_question, second_answer)
    store.delete_chat(second_chat)
    with sqlite3.connect(tmp_path / "history.sqlite3") as conn:
        assert conn.execute("SELECT COUNT(*) FROM alternatives").fetchone() == (0,)
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_a_history_from_before_alternatives_opens_and_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with HistoryStore(path) as store:
        chat, question, answer = _chat(store)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE alternatives")
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION - 1}")
    with HistoryStore(path) as store:
        assert [m.text for m in store.messages(chat)] == ["Q", "first"]
        store.keep_alternative(question, answer)
        assert store.messages(chat)[0].alternatives == (1,)


def test_a_salvaged_history_keeps_the_alternatives_of_the_questions_it_kept(tmp_path: Path) -> None:
    from app.storage.history_repair import salvage

    damaged = tmp_path / "damaged.sqlite3"
    with HistoryStore(damaged) as s:
        chat, question, answer = _chat(s)
        s.keep_alternative(question, answer)
        s.add_message(chat, "assistant", "second")
        lost_chat, lost_question, lost_answer = _chat(s)
        s.keep_alternative(lost_question, lost_answer)
    conn = sqlite3.connect(damaged)  # one chat's row lost, its messages and alternatives left behind
    conn.execute("DELETE FROM chats WHERE id = ?", (lost_chat,))
    conn.commit()
    conn.close()
    with HistoryStore(tmp_path / "fresh.sqlite3") as fresh:
        found = salvage(damaged, fresh._conn)
        assert (found.chats, found.messages_missing) == (1, True)
        messages = fresh.messages(chat)
        assert [m.text for m in messages] == ["Q", "second"]
        assert messages[0].alternatives == (1,)
        fresh.choose_alternative(question, messages[1].id, 1)
        assert [m.text for m in fresh.messages(chat)] == ["Q", "first"]  # the kept version, whole
        assert fresh._conn.execute("SELECT count(*) FROM alternatives").fetchone()[0] == 1  # not the lost chat's
        assert fresh.integrity_ok()
