"""The window's history runs on one writer thread: while an answer streams (and is saved as it streams),
the GUI thread never runs an SQL statement; every statement runs on the writer thread, which owns the
connection. Reads (the chat list, opening a chat, an export) never wait for the writer on the GUI thread."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QTimer
from pytestqt.qtbot import QtBot

from app.storage.history_writer import HistoryThread
from tests.ui.conftest import load_pair, set_sampling


def test_history_writes_run_on_the_writer_thread_while_streaming(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    store = window.store
    assert isinstance(store, HistoryThread)
    statements: list[tuple[int, str]] = []  # (thread, SQL) of every statement the connection runs

    def trace() -> None:
        conn = store._store._store._conn  # type: ignore[union-attr]  # the open HistoryStore's connection
        conn.set_trace_callback(lambda sql: statements.append((threading.get_ident(), sql)))

    store._call(trace)
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=60)
    saves: list[int] = []

    def save_now(_event: object) -> None:  # what the 500 ms flush timer does, on every token
        before = len(statements)
        chat.flush()
        saves.append(before)

    window.bridge.token_received.connect(save_now)  # after the panel's own slot: the text is dirty
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=60_000):
        assert chat.send("Tell me something.")
    assert saves
    store.sync()
    gui = threading.get_ident()
    assert store.thread_id is not None
    assert store.thread_id != gui
    assert statements
    assert {thread for thread, _ in statements} == {store.thread_id}
    updates = [sql for _, sql in statements if sql.lstrip().upper().startswith("UPDATE")]
    assert len(updates) >= 2  # the answer saved while streaming, then finished
    assert window.store.messages(chat.chat_id)[-1].text == chat.messages[-1].text


def _titles(window) -> list[str]:  # type: ignore[no-untyped-def]
    lst = window.chat.history_list
    return [lst.item(i).text() for i in range(lst.count())]


def test_the_chat_list_is_read_without_waiting_for_a_busy_writer(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    """Ending an answer and sending refresh the chat list; the writer may be busy for a while then (an fsync,
    another program's lock). The GUI thread asks and goes on; the list is filled when the read arrives."""
    window = make_window(start_engine=False)
    store = window.store
    assert isinstance(store, HistoryThread)
    store.new_chat("Held up")
    gate = threading.Event()
    writer_done: list[bool] = []

    def busy_write() -> None:  # a write that waits for a lock or a slow disk
        gate.wait(60)
        writer_done.append(True)

    store._post(busy_write)
    try:
        window.chat.refresh_history()
        assert not writer_done  # the call came back while the writer was still held
        assert "Held up" not in _titles(window)  # not read yet: the read waits its turn behind the write
    finally:
        gate.set()
    qtbot.waitUntil(lambda: _titles(window) == ["Held up"], timeout=10_000)


def test_sending_does_not_wait_for_a_busy_writer(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    """Sending creates a chat, the question and the answer's row: with the writer held (another program's
    lock, a slow disk) the GUI thread gets handles at once and goes on; the rows are written in order later,
    under their real ids."""
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    store = window.store
    assert isinstance(store, HistoryThread)
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=8)
    gate = threading.Event()
    writer_done: list[bool] = []

    def busy_write() -> None:
        gate.wait(60)
        writer_done.append(True)

    store._post(busy_write)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=60_000):
        try:
            assert chat.send("Say something short.")
            assert not writer_done  # send came back while the writer was still held
        finally:
            gate.set()
    qtbot.waitUntil(lambda: chat.history_list.count() == 1, timeout=10_000)
    assert chat.history_list.currentItem() is not None  # the new chat is the current one in the list
    stored = store.messages(chat.chat_id)  # the handle stands for the chat's real id
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].text == "Say something short."
    assert stored[1].text == chat.messages[-1].text
    assert stored[1].status == "complete"
    real = store.real_id(chat.chat_id)
    assert real > 0
    assert chat.stored_chat_id() == real
    assert [c.id for c in store.list_chats()] == [real]


def test_opening_and_exporting_a_chat_do_not_wait_for_a_busy_writer(
    qtbot: QtBot, make_window, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    """Opening a chat and exporting it read behind the writes queued before them (an fsync'd commit, another
    program's lock). The GUI thread asks and goes on, its event loop running (a timer fires); the chat is
    shown, and the file written, when the read arrives."""
    window = make_window(start_engine=False)
    store = window.store
    assert isinstance(store, HistoryThread)
    chat = window.chat
    chat_id = store.new_chat("Held up")
    store.add_message(chat_id, "user", "A question the history keeps.")
    ticks: list[int] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(len(ticks)))
    timer.start(5)

    def hold_the_writer() -> threading.Event:
        gate, holding = threading.Event(), threading.Event()

        def busy_write() -> None:  # a commit that waits for a lock or a slow disk
            holding.set()
            gate.wait(60)

        store._post(busy_write)
        assert holding.wait(10)
        return gate

    gate = hold_the_writer()
    try:
        chat.open_chat(chat_id)  # returns while the writer is held
        seen = len(ticks)
        qtbot.waitUntil(lambda: len(ticks) >= seen + 3, timeout=10_000)  # the event loop runs meanwhile
        assert chat.chat_id != chat_id  # not shown yet: the read waits its turn behind the write
        assert chat.messages == []
    finally:
        with qtbot.waitSignal(chat.chat_opened, timeout=10_000):
            gate.set()
    assert chat.chat_id == chat_id
    assert [m.text for m in chat.messages] == ["A question the history keeps."]
    assert "A question the history keeps." in chat.view.toPlainText()

    path = tmp_path / "chat.md"
    gate = hold_the_writer()
    try:
        assert window.export_chat(str(path))  # returns while the writer is held
        seen = len(ticks)
        qtbot.waitUntil(lambda: len(ticks) >= seen + 3, timeout=10_000)
        assert not path.exists()
    finally:
        with qtbot.waitSignal(window.export_done, timeout=10_000) as done:
            gate.set()
    timer.stop()
    assert done.args == [str(path)]
    assert "A question the history keeps." in path.read_text(encoding="utf-8")
