"""Ctrl+Enter sends and Esc stops from anywhere in the window (through the real key events); Esc is left
to the focused widget while nothing streams."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot


def test_ctrl_enter_sends_and_esc_stops_window_wide(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window.show()
    window.activateWindow()
    qtbot.waitActive(window)
    chat = window.chat
    sent: list[str] = []
    stopped: list[bool] = []
    chat.send = lambda text=None: sent.append(chat.input.toPlainText()) or True
    chat.stop = lambda: stopped.append(True)
    chat.input.setPlainText("hello")
    # Focus far from the chat: the temperature field in the left dock.
    window.sampling_form.spins["temperature"].setFocus()
    qtbot.waitUntil(lambda: window.sampling_form.spins["temperature"].hasFocus(), timeout=2000)
    # Through the window's QWindow, as the platform delivers keys, so the shortcut map sees them.
    handle = window.windowHandle()
    qtbot.keyClick(handle, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent == ["hello"]
    qtbot.keyClick(handle, Qt.Key.Key_Escape)
    assert stopped == []  # nothing streams: Esc is not taken from the focused widget
    chat.set_generating(True)
    qtbot.keyClick(handle, Qt.Key.Key_Escape)
    assert stopped == [True]
    chat.set_generating(False)
