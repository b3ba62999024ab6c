"""A chat that outgrows the context: the overflow policy (a setting: stop and offer a new chat, the default, or
leave out the oldest messages), no empty "failed" answer left behind; and Completion mode kept per chat."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.events import EngineError
from app.storage.settings import AppSettings
from tests.ui.conftest import LOAD_TIMEOUT_MS, choose_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def _small_context(qtbot: QtBot, window, target: Path) -> None:  # type: ignore[no-untyped-def]
    choose_pair(qtbot, window, target)
    window.picker.load_box.ctx_spin.setValue(256)  # the smallest: a few long questions fill it
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        assert window.picker.request_load()
    set_sampling(window, temperature=0, max_tokens=4)


def _question(i: int) -> str:
    return f"Question {i}: " + " ".join(["lorem ipsum dolor"] * 5)


def test_stop_is_the_default_and_leaves_no_empty_answer(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    assert AppSettings().context_overflow == "stop"
    window = make_window(folders=(tiny_target.parent,))
    assert window.picker.load_box.overflow_combo.currentData() == "stop"
    _small_context(qtbot, window, tiny_target)
    chat = window.chat
    errors: list[str] = []
    chat.error_raised.connect(errors.append)
    notices: list[str] = []
    chat.notice_raised.connect(notices.append)
    shown: list[str] = []
    window.notifier.error = lambda message, *a, **k: shown.append(message)  # a message box, in the window
    for i in range(8):
        with qtbot.waitSignal(chat.generation_state_changed, timeout=ANSWER_TIMEOUT_MS,
                              check_params_cb=lambda on: not on):
            assert chat.send(_question(i))
        if notices:
            break
    assert notices, "the chat never outgrew a 256-token context"
    assert "Continue in a new chat" in notices[-1]
    assert (errors, shown) == ([], [])  # nothing was lost: no message box, the engine's error not shown either
    assert chat.progress_label.isVisibleTo(chat)
    assert chat.progress_label.text() == notices[-1]  # said beside the button
    assert window.notifier.last_message == notices[-1]
    assert chat.messages[-1].role == "user"
    assert chat.messages[-1].text == _question(i)
    assert all(m.text for m in chat.messages if m.role == "assistant")  # no empty "failed" turn
    stored = window.store.messages(chat.chat_id)
    assert [m.role for m in stored] == [m.role for m in chat.messages]
    assert not any(m.status == "error" for m in stored)
    assert chat.new_chat_with_last_button.isVisibleTo(chat)

    first = chat.chat_id
    earlier = [(m.role, m.text) for m in chat.messages[:-1]]
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        qtbot.mouseClick(chat.new_chat_with_last_button, Qt.MouseButton.LeftButton)
    assert finished.args[0].reason != "error"
    assert chat.chat_id != first
    assert not chat.new_chat_with_last_button.isVisibleTo(chat)
    assert errors == []
    # The question and the latest turns before it that fit: a tail of the old chat, whole turns, in order.
    carried = [(m.role, m.text) for m in chat.messages[:-2]]
    assert [(m.role, m.text) for m in chat.messages[-2:-1]] == [("user", _question(i))]
    assert (chat.messages[-1].role, chat.messages[-1].status) == ("assistant", "complete")
    assert carried == earlier[len(earlier) - len(carried):]
    assert not carried or carried[0][0] == "user"
    assert len(carried) >= 2, "a turn before the question fits beside it in 256 tokens"
    stored = window.store.messages(chat.chat_id)
    assert [(m.role, m.text) for m in stored] == [(m.role, m.text) for m in chat.messages]
    assert len(window.store.messages(first)) == len(earlier) + 1  # the old chat is kept as it was


def test_leaving_out_the_oldest_messages_keeps_the_chat_going(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    window.picker.load_box.overflow_combo.setCurrentIndex(window.picker.load_box.overflow_combo.findData("drop_oldest"))
    assert window.picker.update_settings(AppSettings()).context_overflow == "drop_oldest"
    _small_context(qtbot, window, tiny_target)
    chat = window.chat
    too_long: list[EngineError] = []
    window.bridge.engine_error.connect(lambda e: too_long.append(e) if e.kind == "PromptTooLongError" else None)
    errors: list[str] = []
    chat.error_raised.connect(errors.append)
    for i in range(6):
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
            assert chat.send(_question(i))
    assert too_long, "the chat never outgrew a 256-token context"
    assert errors == []
    assert [m.role for m in chat.messages] == ["user", "assistant"] * 6  # every question answered, all kept
    assert all(m.text and m.status == "complete" for m in chat.messages)
    assert len(window.store.messages(chat.chat_id)) == 12


@pytest.mark.parametrize("first_mode", [False, True])
def test_completion_mode_is_kept_per_chat(
    qtbot: QtBot, make_window, tiny_target: Path, first_mode: bool  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    _small_context(qtbot, window, tiny_target)
    chat = window.chat
    chat.completion_check.setChecked(first_mode)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("one")
    first = chat.chat_id
    chat.new_chat()
    chat.completion_check.setChecked(not first_mode)  # the user's switch, for the new chat
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("two")
    second = chat.chat_id
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        chat.open_chat(first)
    assert chat.completion_mode == first_mode
    assert chat.view.verbatim == first_mode
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        chat.open_chat(second)
    assert chat.completion_mode == (not first_mode)
