"""Continue after Max tokens goes on in the same answer (one message, one stored answer); a base model (no
chat template) chats in completion mode (the text sent is the raw prompt), and a switch of mode is
remembered per model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytestqt.qtbot import QtBot

from tests.ui.conftest import LOAD_TIMEOUT_MS, choose_pair, load_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


def test_continue_extends_the_same_answer(qtbot: QtBot, make_window, tiny_target: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=8)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("Tell me a story.")
    first = chat.messages[-1]
    assert first.stop_reason == "max_tokens"
    partial = first.text
    assert partial
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        assert chat.continue_answer()
    more = finished.args[0].text
    assert more
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    assert chat.messages[-1] is first
    assert first.text == partial + more
    assert len(chat.view.stats_lines()) == 1  # one answer in the view
    stored = window.store.messages(chat.chat_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[-1].text == partial + more


def test_base_model_uses_completion_and_the_switch_is_remembered(
    qtbot: QtBot, make_window, tiny_model_factory: Any, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    base = tiny_model_factory("base.gguf", chat_template=None)
    window = make_window(folders=(base.parent, tiny_target.parent))
    load_pair(qtbot, window, base)
    chat = window.chat
    assert chat.completion_check.isChecked()  # no chat template: completion by default
    set_sampling(window, temperature=0, max_tokens=4)
    text = "Once upon"
    raw_bound = 1 + len(text.encode())  # BOS, then at most one byte-level token per byte

    def prompt_size() -> int:
        with qtbot.waitSignal(window.bridge.prompt_processed, timeout=ANSWER_TIMEOUT_MS) as processed, \
                qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
            chat.new_chat()
            assert chat.send(text)
        return int(processed.args[0].prompt_tokens)

    assert prompt_size() <= raw_bound  # the raw prompt: no template around it
    chat.completion_check.setChecked(False)  # the user switches this model to chat
    assert prompt_size() > raw_bound  # the fallback chat format wraps the message
    assert str(base) in window.settings.switched_mode_models

    # Another model, then this one again: the switch comes back with it.
    choose_pair(qtbot, window, tiny_target)
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        assert window.picker.request_load()
    assert not chat.completion_check.isChecked()  # a chat model chats
    load_pair(qtbot, window, base)
    assert not chat.completion_check.isChecked()
    chat.completion_check.setChecked(True)  # back to its default
    assert str(base) not in window.settings.switched_mode_models
