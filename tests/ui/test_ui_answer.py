"""An answer in the real window on tiny models: focus goes to the message box after a load, the view
follows the answer (and stops following when the user scrolls up), the stop reason is shown and stored
with Continue offered after Max tokens, the footer names the model file, and the dashboard's strip ends on
the same totals as the stats line."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from tests.ui.conftest import LOAD_TIMEOUT_MS, choose_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def test_focus_follow_stop_reason_and_strip_totals(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    window.resize(1100, 700)
    window.show()
    window.activateWindow()
    qtbot.waitActive(window)
    window.sampling_form.spins["temperature"].setFocus()
    choose_pair(qtbot, window, tiny_target, tiny_drafter_same)
    window.picker.load_box.ctx_spin.setValue(4096)  # room for several answers
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        assert window.picker.request_load()
    chat = window.chat
    qtbot.waitUntil(lambda: QApplication.focusWidget() is chat.input, timeout=5000)

    # Fill the view so the answer starts below the visible area, then scroll up before sending.
    chat.view.show_messages([])
    set_sampling(window, temperature=0, max_tokens=300)
    bar = chat.view.verticalScrollBar()
    for _ in range(5):  # how many answers fill it depends on the view's width (the docks' layout)
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
            assert chat.send("Write a long answer.")
        if bar.maximum() > 0:
            break
    assert bar.maximum() > 0
    bar.setValue(0)
    assert not chat.view.following
    values: list[tuple[int, int]] = []
    window.bridge.token_received.connect(lambda _e: values.append((bar.value(), bar.maximum())))
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        assert chat.send("And another one.")  # Send scrolls to the end and follows the answer
        assert chat.progress_label.text().startswith("Processing the prompt")  # a sign of life at once
        assert chat.progress_label.isVisible()
    assert not chat.progress_label.isVisible()
    assert values
    assert all(v == m for v, m in values[1:])
    assert bar.value() == bar.maximum()

    event = finished.args[0]
    assert event.reason == "max_tokens"
    answer = chat.messages[-1]
    assert answer.stop_reason == "max_tokens"
    assert window.store.messages(chat.chat_id)[-1].stop_reason == "max_tokens"
    line = chat.view.stats_lines()[-1]
    # The drafter is credited only where it drafted (the depth policy may leave it idle on a short answer).
    writer = (f"{tiny_target.name} + {tiny_drafter_same.name}" if event.stats.model_drafted > 0
              else f"{tiny_target.name} ({tiny_drafter_same.name} drafted nothing)")
    assert line.startswith(f"cut at Max tokens · {writer} · "), line
    assert chat.continue_button.isVisible()

    # The strip now shows this answer's totals, written exactly as the stats line writes them.
    window.dashboard._paint()
    labels = window.dashboard.labels
    assert labels["scope"].text() == "answer:"
    assert f"decode {labels['tps'].text()}" in line
    assert f"{labels['tau'].text().removeprefix('τ ')} tokens/pass" in line
    if event.stats.drafted:
        assert f"acceptance {labels['acceptance'].text().removeprefix('accept ')}" in line

    # Scrolled up while an answer streams: the view stays where the user put it.
    set_sampling(window, max_tokens=200)
    with qtbot.waitSignal(window.bridge.token_received, timeout=ANSWER_TIMEOUT_MS):
        assert chat.continue_answer()
    bar.setValue(0)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        pass
    assert bar.value() == 0
    assert chat.messages[-2].text == "And another one."  # Continue went on in the same answer
    assert chat.messages[-1] is answer


def test_a_model_without_a_chat_template_is_called_a_base_model(
    qtbot: QtBot, make_window, tiny_model_factory  # type: ignore[no-untyped-def]
) -> None:
    base = tiny_model_factory("tiny-base.gguf", chat_template=None)
    window = make_window(folders=(base.parent,))
    assert window.picker.select_target(base) or window.picker.target_path() == str(base)
    assert "looks like a base model" in window.picker.target_info.text()
