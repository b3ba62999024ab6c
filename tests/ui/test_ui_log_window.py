"""View → Log shows llama.cpp's own lines: they go to the engine worker's log file, which the window reads
while it is open."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair


def test_the_log_window_shows_llama_cpps_lines(qtbot: QtBot, make_window, tiny_target: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    log = window.log_window
    log.show()
    qtbot.waitUntil(lambda: "llama.cpp: llama_" in log.text(), timeout=10_000)  # e.g. llama_context: ...
    shown = log.text().count("llama.cpp: ")
    log.read_engine_file()  # nothing new in the file: nothing is shown twice
    assert log.text().count("llama.cpp: ") == shown
    log.hide()
    assert not log._file_timer.isActive()
