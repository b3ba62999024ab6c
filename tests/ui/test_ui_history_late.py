"""A history that cannot open when the window starts (a full disk, a file where the data folder should be) is
tried again, and the chat held in memory meanwhile is saved once it opens (issue 28 §9)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

import ui.main_window
from app.paths import data_dir
from app.storage.history import FILE_NAME
from tests.ui.conftest import load_pair


def test_a_history_that_would_not_open_is_opened_later_and_the_chat_saved(
    qtbot: QtBot, make_window, specdeck_home: Path, tiny_target: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ui.main_window, "HISTORY_REOPEN_SECONDS", 1)
    folder = data_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("a file where the data folder should be")
    window = make_window(folders=(tiny_target.parent,))
    assert window.store is None  # told in one sentence; the chat is in memory
    load_pair(qtbot, window, tiny_target)
    with qtbot.waitSignal(window.chat.answer_finished, timeout=120_000):
        assert window.chat.send("kept in memory first")
    folder.unlink()  # the user freed the folder
    qtbot.waitUntil(lambda: window.store is not None, timeout=30_000)
    window.store.flush_pending()
    qtbot.waitUntil(lambda: (folder / FILE_NAME).exists(), timeout=10_000)

    def saved() -> list[tuple[str, str]]:
        with sqlite3.connect(folder / FILE_NAME) as db:
            return [(r, t) for r, t in db.execute("SELECT role, text FROM messages ORDER BY id")]

    qtbot.waitUntil(lambda: len(saved()) == 2, timeout=10_000)
    rows = saved()
    assert rows[0] == ("user", "kept in memory first")
    assert rows[1][0] == "assistant"
    assert rows[1][1] == window.chat.messages[-1].text
    with qtbot.waitSignal(window.chat.answer_finished, timeout=120_000):
        assert window.chat.send("and the next turn too")
    qtbot.waitUntil(lambda: len(saved()) == 4, timeout=10_000)


def test_the_window_loads_a_model_where_no_log_folder_can_be_created(
    qtbot: QtBot, make_window, specdeck_home: Path, tiny_target: Path,  # type: ignore[no-untyped-def]
) -> None:
    from app.paths import logs_dir

    logs = logs_dir()
    logs.parent.mkdir(parents=True, exist_ok=True)
    logs.write_text("a file where the log folder should be")  # as a read-only home refuses the folder
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)  # the engine's log goes to the temporary folder instead
    with qtbot.waitSignal(window.chat.answer_finished, timeout=120_000):
        assert window.chat.send("hello")
    answer = window.chat.messages[-1]
    assert (answer.role, answer.status) == ("assistant", "complete")
