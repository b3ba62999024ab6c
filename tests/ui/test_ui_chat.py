"""The window end to end on the SmolLM2 demo model with the n-gram drafter: stream, stats, stop,
regenerate, new chat and the history list."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.events import Finished
from tests.ui.conftest import load_pair, set_sampling

pytestmark = [pytest.mark.demo, pytest.mark.slow]
ANSWER_TIMEOUT_MS = 60_000


def test_chat_streams_stops_regenerates_and_keeps_history(
    qtbot: QtBot, make_window, demo_models: tuple[Path, Path]  # type: ignore[no-untyped-def]
) -> None:
    smollm2, _gemma = demo_models
    window = make_window()
    load_pair(qtbot, window, smollm2, ngram=3)
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=40)

    # Tokens stream into the view before the answer is finished; the stats line follows.
    tokens: list[str] = []
    window.bridge.token_received.connect(lambda e: tokens.append(e.text))
    chat.input.setPlainText("Name three colours.")
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        chat.send_button.click()
        assert chat.generating
        assert chat.messages[-1].role == "user"
        assert window.store is not None
        stored = window.store.messages(chat.chat_id)  # written before generation started
        assert [m.role for m in stored] == ["user", "assistant"]
        assert stored[0].text == "Name three colours."
    event: Finished = finished.args[0]
    assert tokens
    assert "".join(tokens) == event.text
    assert not chat.generating
    assert len(window.dashboard.snapshot().t) > 0  # the dashboard follows the bridge by itself
    answer = chat.messages[-1]
    assert answer.role == "assistant"
    assert answer.text == event.text
    assert answer.status == "complete"
    words = [w for w in answer.text.replace("*", " ").split() if w.isalpha()]
    assert words
    assert all(w in chat.view.toPlainText() for w in words[:5])
    lines = chat.view.stats_lines()
    assert len(lines) == 1
    assert "TTFT" in lines[0]
    assert "decode" in lines[0]
    # The speedup is shown only for an answer that drafted, over the plain rate measured at load.
    assert ("× the plain rate" in lines[0]) == (answer.stats.drafted > 0 and window.bridge.loaded.plain_tps > 0)
    saved = window.store.messages(chat.chat_id)[-1]
    assert saved.status == "complete"
    assert saved.stop_reason == event.reason
    assert saved.text == event.text
    assert saved.stats is not None

    # Stop ends a long generation early.
    set_sampling(window, max_tokens=600)
    chat.input.setPlainText("Write a long story about a dragon who learns to bake bread.")
    with qtbot.waitSignal(window.bridge.token_received, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send()
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as stopped:
        chat.stop_button.click()
    assert stopped.args[0].reason == "cancelled"
    assert chat.messages[-1].status == "cancelled"
    assert window.store.messages(chat.chat_id)[-1].status == "cancelled"
    assert chat.view.stats_lines()[-1].startswith("stopped · ")
    assert window.store.messages(chat.chat_id)[-1].stop_reason == "cancelled"

    # Regenerate replaces the last answer (same question, one answer).
    set_sampling(window, max_tokens=12, temperature=0.8, seed=7)
    before = len(chat.messages)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.regenerate()
    assert len(chat.messages) == before
    assert chat.messages[-1].status == "complete"
    assert [m.role for m in window.store.messages(chat.chat_id)] == ["user", "assistant"] * 2
    assert window.store.messages(chat.chat_id)[-1].text == chat.messages[-1].text

    # Edit-and-resend takes the question back into the box.
    assert chat.edit_last()
    assert chat.input.toPlainText().startswith("Write a long story")
    assert len(window.store.messages(chat.chat_id)) == 4  # nothing deleted until the edit is sent
    chat.input.setPlainText("Say hi.")
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send()
    assert [m.role for m in window.store.messages(chat.chat_id)] == ["user", "assistant"] * 2
    assert [m.text for m in chat.messages if m.role == "user"] == ["Name three colours.", "Say hi."]

    # New chat, then the history list reopens the first one.
    first_chat = chat.chat_id
    chat.new_chat_button.click()
    assert chat.chat_id is None
    assert chat.messages == []
    assert chat.view.toPlainText() == ""
    chat.input.setPlainText("Hello again.")
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send()
    qtbot.waitUntil(lambda: chat.history_list.count() == 2, timeout=10_000)  # the list is read off the GUI thread
    item = next(chat.history_list.item(i) for i in range(chat.history_list.count())
                if chat.history_list.item(i).text() == "Name three colours.")
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # the chat is read off the GUI thread
        chat.history_list.setCurrentItem(item)
    assert chat.chat_id == first_chat
    assert [m.text for m in chat.messages if m.role == "user"] == ["Name three colours.", "Say hi."]
    assert "Say hi." in chat.view.toPlainText()
