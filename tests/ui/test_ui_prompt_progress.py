"""A long prompt is processed in n_batch chunks: the chat shows "Processing prompt n / N" with a progress bar
for each chunk, then the prompt's size and time."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.events import PromptProgress
from tests.ui.conftest import LOAD_TIMEOUT_MS, choose_pair, set_sampling

N_BATCH = 32  # small: a prompt of a few hundred tokens takes many chunks (a draft of 16 still fits)


def test_prompt_progress_per_chunk(qtbot: QtBot, make_window, tiny_target: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(folders=(tiny_target.parent,))
    window.show()
    choose_pair(qtbot, window, tiny_target)
    settings = dataclasses.replace(window.picker.load_settings(), n_batch=N_BATCH)
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.bridge.load(settings)
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=2)
    progress: list[PromptProgress] = []
    seen: list[tuple[str, int, int, bool]] = []

    def on_progress(event: PromptProgress) -> None:
        progress.append(event)
        seen.append((chat.progress_label.text(), chat.prompt_bar.value(), chat.prompt_bar.maximum(),
                     chat.prompt_bar.isVisible()))

    window.bridge.prompt_progress.connect(on_progress)  # connected after the panel: sees its update
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=60_000):
        assert chat.send("a long question " * 20)  # byte-level tokens: about 300
    assert len(progress) >= 3
    total = progress[0].total
    assert total > 3 * N_BATCH
    assert [e.done for e in progress] == sorted({e.done for e in progress})  # rising, once per chunk
    assert all(e.total == total for e in progress)
    assert all(b - a <= N_BATCH for a, b in pairwise([0, *(e.done for e in progress)]))
    assert progress[-1].done == total - 1  # the last prompt token goes with the first verify pass
    for event, (text, value, maximum, visible) in zip(progress, seen, strict=True):
        assert text == f"Processing prompt {event.done:,} / {total:,}"
        assert (value, maximum, visible) == (event.done, total, True)
    assert not chat.prompt_bar.isVisible()
