"""The first start: Send with a chosen target that is not loaded yet loads it (as Load would) and then sends,
a failed load leaves the message in the input box, Unload says so and is off while nothing is loaded, and
Load is in view without scrolling on small screens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication, QMessageBox
from pytestqt.qtbot import QtBot

from tests.ui.conftest import LOAD_TIMEOUT_MS, load_pair, set_sampling
from ui.chat.panel import NEED_MODEL_MESSAGE
from ui.main_window import MainWindow

ANSWER_TIMEOUT_MS = 120_000


def _boxes(window: MainWindow) -> list[str]:
    return [box.text() for box in window.findChildren(QMessageBox) if box.isVisible()]


def _choose(qtbot: QtBot, window: MainWindow, target: Path) -> None:
    """The target chosen in the picker, as a user would; the picker's other settings as they are."""
    picker = window.picker
    picker.load_box.threads_spin.setValue(1)  # this machine's cores are shared
    picker.load_box.ctx_spin.setValue(1024)
    with qtbot.waitSignal(picker.drafters_ranked, timeout=30_000):
        assert picker.select_target(target)


def test_send_loads_the_chosen_target_then_sends(qtbot: QtBot, make_window, tiny_target: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(folders=(tiny_target.parent,))
    window.notifier.modal = True  # as in the app: a box would show
    window.show()
    qtbot.waitExposed(window)
    _choose(qtbot, window, tiny_target)
    set_sampling(window, max_tokens=8)
    assert window.bridge.loaded is None
    window.chat.input.setPlainText("hello")
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.chat.send_button.click()
        assert window.picker.loading
        assert window.chat.input.toPlainText() == "hello"  # kept until the model can take it
    assert window.bridge.loaded is not None
    assert window.bridge.loaded.target.path == str(tiny_target)
    qtbot.waitUntil(lambda: len(window.chat.messages) == 2 and not window.chat.generating,
                    timeout=ANSWER_TIMEOUT_MS)
    question, answer = window.chat.messages
    assert (question.role, question.text) == ("user", "hello")
    assert answer.role == "assistant"
    assert answer.stop_reason is not None
    assert window.chat.input.toPlainText() == ""
    assert _boxes(window) == []


def test_send_while_the_drafters_are_ranked_loads_the_drafter_load_would(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    picker = window.picker
    picker.load_box.threads_spin.setValue(1)
    picker.load_box.ctx_spin.setValue(1024)
    set_sampling(window, max_tokens=4)
    picker.target_combo.setCurrentIndex(-1)
    assert picker.select_target(tiny_target)
    assert picker.ranking  # Send comes before the drafter is chosen
    window.chat.input.setPlainText("hello")
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        window.chat.send_button.click()
    assert not picker.ranking
    event = loaded.args[0]
    assert (event.drafter.path if event.drafter else None) == picker.drafter_path()
    qtbot.waitUntil(lambda: len(window.chat.messages) == 2 and not window.chat.generating,
                    timeout=ANSWER_TIMEOUT_MS)
    assert window.chat.messages[0].text == "hello"


def test_a_failed_load_keeps_the_message_and_says_what_load_would(
    qtbot: QtBot, make_window, tiny_target: Path, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    target = folder / "going.gguf"
    shutil.copy(tiny_target, target)
    window = make_window(folders=(folder,))
    _choose(qtbot, window, target)
    window.picker.select_drafter(None)
    target.unlink()  # gone after it was listed: the engine cannot load it
    window.chat.input.setPlainText("hello")
    window.chat.send_button.click()
    qtbot.waitUntil(lambda: not window.picker.loading, timeout=LOAD_TIMEOUT_MS)
    sent_error = window.notifier.last_message
    assert window.chat.input.toPlainText() == "hello"
    assert window.chat.messages == []
    assert not window.chat.send_waiting
    window.picker.load_box.load_button.click()  # what Load says for the same choice
    qtbot.waitUntil(lambda: not window.picker.loading, timeout=LOAD_TIMEOUT_MS)
    assert sent_error == window.notifier.last_message
    assert window.picker.load_box.status_label.text() == sent_error


def test_send_with_no_target_says_to_choose_one_without_a_box(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    window.notifier.modal = True
    window.picker.target_combo.setCurrentIndex(-1)
    window.chat.input.setPlainText("hello")
    assert not window.chat.send()
    assert window.statusBar().currentMessage() == NEED_MODEL_MESSAGE
    assert not window.picker.loading
    assert window.chat.input.toPlainText() == "hello"
    assert _boxes(window) == []


def test_unload_says_so_and_is_off_while_nothing_is_loaded(qtbot: QtBot, make_window, tiny_target: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(folders=(tiny_target.parent,))
    assert not window.unload_action.isEnabled()
    load_pair(qtbot, window, tiny_target)
    assert window.unload_action.isEnabled()
    with qtbot.waitSignal(window.bridge.model_unloaded, timeout=30_000):
        window.unload_action.trigger()
        message = window.statusBar().currentMessage()
        assert message.startswith(f"Unloaded {tiny_target.name}")
        assert "Load" in message
        assert not window.unload_action.isEnabled()
    assert not window.unload_action.isEnabled()
    assert window.picker.load_box.status_label.text() == message


@pytest.mark.parametrize(("width", "height"), [(1366, 768), (1024, 700)])
def test_load_is_in_view_without_scrolling_on_a_first_start(
    qtbot: QtBot, make_window, width: int, height: int  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    window.resize(width, height)
    window.show()
    qtbot.waitExposed(window)
    QApplication.processEvents()
    assert (window.width(), window.height()) == (width, height)
    button = window.picker.load_box.load_button
    assert button.isVisible()
    rect = QRect(button.mapTo(window, QPoint(0, 0)), button.size())
    assert window.rect().contains(rect), f"Load at {rect} in a {width}×{height} window"
    assert button.visibleRegion().boundingRect().size() == button.size()  # not cut off by a scroll area
