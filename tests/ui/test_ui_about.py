"""The About box names SpecDeck's version and the llama.cpp build (version, commit, backend, CPU features)."""

from __future__ import annotations

import re

from pytestqt.qtbot import QtBot

import app


def test_about_box_shows_version_and_llama_cpp_build(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window._on_about_action_triggered()
    box = window._about_box
    assert box is not None
    assert f"SpecDeck {app.__version__}" in box.text()
    qtbot.waitUntil(lambda: "Backend:" in box.text(), timeout=60_000)
    text = box.text()
    assert "llama.cpp 0." in text
    assert "commit" in text
    assert re.search(r"Backend: (cpu|cuda|vulkan|metal)\b", text)  # every build the README supports
    assert "CPU features:" in text
    box.close()
