"""The window's engine worker yields the CPU to the window: on a busy machine the GUI thread must not wait for a
core behind the decode threads (the soak's freezes were mostly that)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair
from ui.bridge import WORKER_NICE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are read from /proc")
def test_every_worker_thread_runs_below_the_window(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)  # llama.cpp's threads exist once a model is loaded
    pid = window.bridge.worker_pid
    assert pid is not None
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    assert threads
    expected = min(ours + WORKER_NICE, 19)
    assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads} == {expected}
