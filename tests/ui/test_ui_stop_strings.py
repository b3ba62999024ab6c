"""Stop strings in the real window: typed in the sampling form (one per line, \\n for a new line), they end
the answer before the first of them, the footer names the one that did, the history keeps the cut text, and
they are kept with the settings. A bad list is refused in one sentence and nothing is sent.

Which text a tiny random model writes is not known in advance, so the stop string is taken from a first
answer, and the cut is checked against the uncut text the engine streamed in the same run."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.events import Token
from app.params import stops_text
from app.storage.settings import load_settings
from tests.ui.conftest import load_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def _answer(qtbot: QtBot, window, question: str) -> str:  # type: ignore[no-untyped-def]
    """Send ``question`` in a new chat; the text the engine streamed, before any cut."""
    streamed: list[str] = []

    def on_token(event: Token) -> None:
        streamed.append(event.text)

    window.bridge.token_received.connect(on_token)
    window.chat.new_chat()
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert window.chat.send(question)
    window.bridge.token_received.disconnect(on_token)
    return "".join(streamed)


def test_stop_strings_cut_the_answer_and_are_kept(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    set_sampling(window, temperature=0, max_tokens=40)
    first = _answer(qtbot, window, "Say something.")
    assert window.chat.messages[-1].stop_reason != "stop"
    middle = len(first) // 2
    stop = first[middle:middle + 2] or "e"
    stops = (stop, "\nnever written")
    form = window.sampling_form
    form.stops_edit.setPlainText(stops_text(stops))  # as typed: the new line as \n
    assert form.settings().stops == stops

    streamed = _answer(qtbot, window, "Say something.")
    answer = window.chat.messages[-1]
    stored = window.store.messages(window.chat.chat_id)[-1]
    if stop in streamed:  # the same greedy answer, almost always: cut before the stop
        kept = streamed[:streamed.find(stop)]
        assert answer.text == kept
        assert (answer.stop_reason, answer.stop_sequence) == ("stop", stop)
        assert window.chat.view.stats_lines()[-1].startswith(f"stopped at “{stops_text([stop])}” · ")
    else:
        assert answer.text == streamed
        assert answer.stop_reason != "stop"
    assert stop not in answer.text
    assert (stored.text, stored.stop_reason) == (answer.text, answer.stop_reason)

    window.save_app_settings()
    qtbot.waitUntil(lambda: load_settings()[0].sampling.stops == stops, timeout=10_000)


def test_a_bad_stop_list_is_one_sentence_and_sends_nothing(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    form = window.sampling_form
    form.stops_edit.setPlainText("END\nEND")
    assert form.error() == "The stop string “END” is listed twice."
    assert not form.error_label.isHidden()
    before = len(window.chat.messages)
    assert not window.chat.send("Hello")
    assert len(window.chat.messages) == before
    QApplication.processEvents()
    form.stops_edit.setPlainText("END")
    assert form.error() is None
