"""Ctrl+Enter sends from the message box; Esc stops (both through the real key events)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot


def test_ctrl_enter_sends_and_esc_stops(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window.show()
    window.activateWindow()
    qtbot.waitActive(window)
    chat = window.chat
    sent: list[str] = []
    stopped: list[bool] = []
    chat.send = lambda text=None: sent.append(chat.input.toPlainText()) or True
    chat.stop = lambda: stopped.append(True)
    chat.input.setFocus()
    chat.input.setPlainText("hello")
    # Through the window's QWindow, as the platform delivers keys, so the shortcut map sees them.
    handle = window.windowHandle()
    qtbot.keyClick(handle, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent == ["hello"]
    qtbot.keyClick(handle, Qt.Key.Key_Escape)
    assert stopped == [True]
    qtbot.keyClick(handle, Qt.Key.Key_Return)  # a plain Enter is a new line, not a send
    assert sent == ["hello"]
