"""Every chat action is one key away, window-wide (through real key events on the window): Tab leaves the
message box, F2 renames the open chat wherever the focus is, and the shortcuts table names each key."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from app.events import MessageStats
from ui.chat.message import ChatMessage
from ui.shortcuts import SHORTCUTS, SHORTCUTS_HTML


def _shown(qtbot: QtBot, make_window):  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    window.show()
    window.activateWindow()
    qtbot.waitActive(window)
    return window


def test_tab_leaves_the_message_box(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = _shown(qtbot, make_window)
    chat = window.chat
    chat.input.setFocus()
    qtbot.waitUntil(chat.input.hasFocus)
    chat.input.setPlainText("a")
    qtbot.keyClick(chat.input, Qt.Key.Key_Tab)
    assert chat.input.toPlainText() == "a"  # no tab character typed
    assert not chat.input.hasFocus()


def test_chat_actions_have_window_wide_keys(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = _shown(qtbot, make_window)
    chat = window.chat
    called: list[str] = []
    for name in ("regenerate", "continue_answer", "edit_last"):
        setattr(chat, name, lambda name=name: called.append(name) or True)
    window.sampling_form.spins["temperature"].setFocus()  # far from the chat
    qtbot.waitUntil(window.sampling_form.spins["temperature"].hasFocus)
    handle = window.windowHandle()
    ctrl, shift = Qt.KeyboardModifier.ControlModifier, Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(handle, Qt.Key.Key_R, ctrl)
    qtbot.keyClick(handle, Qt.Key.Key_Return, ctrl | shift)
    qtbot.keyClick(handle, Qt.Key.Key_E, ctrl)
    assert called == ["regenerate", "continue_answer", "edit_last"]

    stats = MessageStats(3, 2, 0.1, 10.0, 5.0, 1.0, 2, 0, 0, 0.0, 1.0, (), (), 0.0)
    chat.messages = [ChatMessage("user", "q"), ChatMessage("assistant", "line one\n  line two", stats=stats)]
    QGuiApplication.clipboard().clear()
    qtbot.keyClick(handle, Qt.Key.Key_C, ctrl | shift)
    assert QGuiApplication.clipboard().text() == "line one\n  line two"

    qtbot.keyClick(handle, Qt.Key.Key_L, ctrl)
    qtbot.waitUntil(chat.input.hasFocus)


def test_f2_renames_the_open_chat_from_anywhere(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = _shown(qtbot, make_window)
    chat = window.chat
    chat_id = chat.store.new_chat("first chat", "")
    with qtbot.waitSignal(chat.history_refreshed, timeout=5000):
        chat.refresh_history()
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        chat.open_chat(chat_id)
    chat.input.setFocus()
    qtbot.waitUntil(chat.input.hasFocus)
    qtbot.keyClick(window.windowHandle(), Qt.Key.Key_F2)
    assert chat.history_list.state() == chat.history_list.State.EditingState
    assert chat.history_list.currentItem().data(Qt.ItemDataRole.UserRole) == chat_id


def test_the_shortcuts_table_lists_every_key() -> None:
    for keys, what in SHORTCUTS:
        assert keys in SHORTCUTS_HTML
        assert what in SHORTCUTS_HTML
    assert SHORTCUTS_HTML.count("<tr>") == len(SHORTCUTS)
