"""A hybrid model in the real window: it loads with the n-gram drafter on, answers over two turns with
drafts verified, and the dashboard's memory counts its recurrent state."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.gguf_fixtures import write_tiny_model
from tests.ui.conftest import load_pair, set_sampling

ANSWER_TIMEOUT_MS = 60_000


@pytest.mark.parametrize("arch", ["qwen35", "granitehybrid"])
def test_a_hybrid_model_answers_in_the_window(
    qtbot: QtBot, make_window, tmp_path: Path, arch: str  # type: ignore[no-untyped-def]
) -> None:
    model = write_tiny_model(tmp_path / "models" / f"tiny-{arch}.gguf", arch=arch, n_layer=4, name=f"tiny-{arch}")
    window = make_window(folders=(model.parent,))
    loaded: list[object] = []
    window.bridge.model_loaded.connect(loaded.append)
    load_pair(qtbot, window, model, ngram=3)
    assert loaded[0].kv_bytes_total > 0  # type: ignore[attr-defined]
    set_sampling(window, temperature=0, max_tokens=40)
    chat = window.chat
    drafted = 0
    for text in ("alpha beta gamma, alpha beta gamma, alpha beta gamma", "Once more: alpha beta gamma"):
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
            assert chat.send(text)
        event = finished.args[0]
        assert event.reason in ("max_tokens", "eog")
        assert event.stats.completion_tokens > 0
        drafted += event.stats.drafted
    assert drafted > 0
    assert [m.role for m in window.store.messages(chat.chat_id)] == ["user", "assistant"] * 2
