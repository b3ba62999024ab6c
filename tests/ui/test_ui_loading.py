"""Loading: the progress shows in the status bar (in view at 1366×768, whatever the dock's height), each phase
has its own bar from 0 to 100 % that never goes back and whose text agrees with it, and a message sent during
the load is told the model is loading."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.events import LoadProgress
from tests.ui.conftest import LOAD_TIMEOUT_MS, choose_pair
from ui.chat.panel import LOADING_MESSAGE


def test_each_phase_has_one_monotonic_bar_whose_text_agrees(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    picker = window.picker
    picker.set_loading(True)
    seen: list[tuple[int, str]] = []
    for stage, fraction in (("target", 0.5), ("target", 0.3), ("target", 1.0), ("drafter", 0.2),
                            ("drafter", 0.9), ("timing", 0.4)):
        picker.load_box.show_progress(LoadProgress(stage, fraction))
        for bar in (picker.load_box.progress, window.load_bar):
            assert bar.text() == picker.load_box.status_label.text()  # the bar's text is the status line
            assert bar.text().endswith(f"{bar.value()}%")  # and says the bar's own value
        seen.append((picker.load_box.progress.value(), picker.load_box.status_label.text()))
    assert [v for v, _ in seen] == [50, 50, 100, 20, 90, 40]  # back to 0 only at a new phase
    assert seen[3][1] == "Loading the drafter… 20%"
    picker.set_loading(False)
    assert not window.load_bar.isVisible()


def test_the_load_is_in_view_and_a_message_sent_meanwhile_waits_for_it(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    window.resize(1366, 768)
    window.show()
    qtbot.waitExposed(window)
    choose_pair(qtbot, window, tiny_target)
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        assert window.picker.request_load()
        bar = window.load_bar
        assert bar.isVisible()
        top_left = bar.mapTo(window, bar.rect().topLeft())
        assert window.rect().contains(top_left)
        assert top_left.y() + bar.height() <= window.height()
        assert not window.chat.send("hello")
        assert window.notifier.last_message == LOADING_MESSAGE
    assert not window.load_bar.isVisible()
