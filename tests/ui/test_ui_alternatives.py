"""Regenerate in the real window keeps the answer it replaces: "‹ 2/2 ›" under the last answer, ‹ and ›
show the others (a real click on the link), the choice is in the history and survives reopening the chat,
and the navigator goes when the next question is sent."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextCursor
from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def _click_navigator(qtbot: QtBot, view, label: str) -> None:  # type: ignore[no-untyped-def]
    """Click the ‹ or › of the navigator, where it is drawn."""
    block = view.document().lastBlock()
    cursor = QTextCursor(block)
    cursor.setPosition(block.position() + block.text().index(label))
    left = view.cursorRect(cursor)
    cursor.movePosition(QTextCursor.MoveOperation.Right)
    right = view.cursorRect(cursor)
    view.ensureCursorVisible()
    point = QPoint((left.left() + right.left()) // 2, left.center().y())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_regenerate_keeps_alternatives_to_go_back_to(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    window.resize(1100, 700)
    window.show()
    load_pair(qtbot, window, tiny_target)
    set_sampling(window, temperature=1.0, max_tokens=12)
    chat, view = window.chat, window.chat.view
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("Say something.")
    assert view.alternatives_line() == ""
    answers = [chat.messages[-1].text]
    for shown in ("‹ 2/2 ›", "‹ 3/3 ›"):
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
            assert chat.regenerate()
        answers.append(chat.messages[-1].text)
        assert view.alternatives_line() == shown
    chat_id = chat.chat_id
    assert [m.role for m in window.store.messages(chat_id)] == ["user", "assistant"]  # one answer in the chat

    assert chat.choose_alternative(1)
    qtbot.waitUntil(lambda: view.alternatives_line() == "‹ 1/3 ›", timeout=10_000)
    assert chat.messages[-1].text == answers[0]
    assert window.store.messages(chat_id)[-1].text == answers[0]

    _click_navigator(qtbot, view, "›")
    qtbot.waitUntil(lambda: view.alternatives_line() == "‹ 2/3 ›", timeout=10_000)
    assert chat.messages[-1].text == answers[1]

    chat.new_chat()
    assert view.alternatives_line() == ""
    chat.open_chat(chat_id)
    qtbot.waitUntil(lambda: view.alternatives_line() == "‹ 2/3 ›", timeout=10_000)
    assert chat.messages[-1].text == answers[1]

    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("And another.")  # the navigator belongs to the last answer only
    assert view.alternatives_line() == ""
    assert [m.text for m in window.store.messages(chat_id)][:2] == ["Say something.", answers[1]]
