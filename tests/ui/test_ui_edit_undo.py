"""Edit last keeps the old turn recoverable: nothing is deleted until the edited question is sent, Undo edit
brings the question and its answer back, and opening another chat loses nothing."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def test_edit_last_can_be_undone_and_deletes_only_when_sent(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=4)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("The first question")
    answer = chat.messages[-1].text
    store = window.store

    assert chat.edit_last()
    assert [m.role for m in chat.messages] == []
    assert chat.input.toPlainText() == "The first question"
    assert chat.undo_edit_button.isVisibleTo(chat)
    assert [m.text for m in store.messages(chat.chat_id)] == ["The first question", answer]  # still there
    assert chat.undo_edit()
    assert [m.text for m in chat.messages] == ["The first question", answer]
    assert answer in chat.view.toPlainText()
    assert chat.input.toPlainText() == ""
    assert not chat.undo_edit_button.isVisibleTo(chat)

    # Taken back again and left for another chat: the history still holds the turn.
    assert chat.edit_last()
    first = chat.chat_id
    chat.new_chat()
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        chat.open_chat(first)
    assert [m.text for m in chat.messages] == ["The first question", answer]

    assert chat.edit_last()
    chat.input.setPlainText("The edited question")
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send()
    stored = store.messages(chat.chat_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].text == "The edited question"
    assert not chat.undo_edit()  # sent: the old turn was replaced
