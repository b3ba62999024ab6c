"""Per-message actions in the transcript (copy, edit, regenerate, delete this message), Ctrl+Z for the last
deletion or edit, and versions: editing an earlier question keeps the old continuation as the chat's previous
version, one button away. A real model answers; the keys go through the window."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def _action(chat, index: int, name: str):  # type: ignore[no-untyped-def]
    """The action named ``name`` in the menu a right-click on message ``index`` shows."""
    position = chat.view.message_position(index)
    assert chat.view.message_at(position) == index  # the menu belongs to the message under the pointer
    menu = chat.view.message_menu(chat.view.message_at(position))
    found = {a.data(): a for a in menu.actions()}
    return found.get(name)


def _undo_key(qtbot: QtBot, window) -> None:  # type: ignore[no-untyped-def]
    window.chat.view.setFocus()
    qtbot.waitUntil(window.chat.view.hasFocus)
    qtbot.keyClick(window.windowHandle(), Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)


def test_message_actions_undo_and_the_previous_version(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    window.show()
    window.activateWindow()
    qtbot.waitActive(window)
    load_pair(qtbot, window, tiny_target)
    chat = window.chat
    store = window.store
    set_sampling(window, temperature=0, max_tokens=4)
    for question in ("First question", "Second question"):
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
            assert chat.send(question)
    before = [m.text for m in chat.messages]
    assert len(before) == 4
    chat_id = chat.chat_id

    # The menu offers what fits the message: edit for a question, regenerate for an answer.
    assert _action(chat, 0, "edit") is not None
    assert _action(chat, 0, "regenerate") is None
    assert _action(chat, 1, "regenerate") is not None
    assert _action(chat, 1, "edit") is None

    QGuiApplication.clipboard().clear()
    _action(chat, 2, "copy").trigger()
    assert QGuiApplication.clipboard().text() == "Second question"

    # Delete one message, then Ctrl+Z: it comes back in its place, and the history never lost it.
    _action(chat, 1, "delete").trigger()
    assert [m.text for m in chat.messages] == [before[0], *before[2:]]
    assert chat.view.message_at(len(chat.view.toPlainText())) == 2  # three messages shown
    _undo_key(qtbot, window)
    assert [m.text for m in chat.messages] == before
    assert [m.text for m in store.messages(chat_id)] == before

    # A deletion that is not undone reaches the history once the chat changes.
    _action(chat, 3, "delete").trigger()
    chat.new_chat()
    assert [m.text for m in store.messages(chat_id)] == before[:3]
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        chat.open_chat(chat_id)
    assert [m.text for m in chat.messages] == before[:3]

    # Edit the earlier question: the rest leaves the view, Ctrl+Z brings it back.
    _action(chat, 0, "edit").trigger()
    assert chat.input.toPlainText() == "First question"
    assert chat.messages == []
    _undo_key(qtbot, window)
    assert [m.text for m in chat.messages] == before[:3]

    # Edited and sent: the chat goes on from the edit, and its old continuation is its previous version.
    _action(chat, 0, "edit").trigger()
    chat.input.setPlainText("First question, edited")
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send()
    assert chat.messages[0].text == "First question, edited"
    assert len(chat.messages) == 2
    qtbot.waitUntil(lambda: chat.version_button.isVisible(), timeout=5000)
    assert chat.version_button.text() == "Previous version"
    earlier = [c for c in store.list_chats() if c.version_of == store.real_id(chat_id)]
    assert len(earlier) == 1
    assert [m.text for m in store.messages(earlier[0].id)] == before[:3]
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        qtbot.mouseClick(chat.version_button, Qt.MouseButton.LeftButton)
    assert [m.text for m in chat.messages] == before[:3]
    qtbot.waitUntil(lambda: chat.version_button.text() == "Newer version", timeout=5000)
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):
        qtbot.mouseClick(chat.version_button, Qt.MouseButton.LeftButton)
    assert chat.messages[0].text == "First question, edited"

    # Regenerate an earlier answer: it is answered again, and the old continuation is kept too.
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        _action(chat, 1, "regenerate").trigger()
    assert len(chat.messages) == 2

    # Ctrl+Z also takes back a chat deletion.
    chat.delete_chat(chat_id)
    assert chat.chat_id != chat_id
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):
        _undo_key(qtbot, window)
    assert chat.chat_id == chat_id
    assert all(chat.history_list.item(r).data(Qt.ItemDataRole.UserRole) != earlier[0].id
               for r in range(chat.history_list.count()))  # versions are reached from their chat, not listed

    # Deleted for good, a chat takes its earlier versions with it.
    chat.delete_chat(chat_id)
    chat.commit_pending_delete()
    assert [c for c in store.list_chats() if c.version_of == store.real_id(chat_id)] == []


def test_edit_menu_undo_takes_back_a_chat_deletion(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    chat = window.chat
    chat_id = window.store.new_chat("Kept")
    chat.refresh_history()
    qtbot.waitUntil(lambda: chat.history_list.count() == 1, timeout=5000)
    chat.delete_chat(chat_id)
    qtbot.waitUntil(lambda: chat.history_list.count() == 0, timeout=5000)
    window.undo_action.trigger()
    qtbot.waitUntil(lambda: chat.history_list.count() == 1 and chat.chat_id == chat_id, timeout=5000)
