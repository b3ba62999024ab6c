"""The window's engine worker runs at the user's own priority: the answer the user waits for must not yield to
background jobs (at nice +10 a compile slowed it, and the slowed passes misled the depth policy)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are read from /proc")
def test_every_worker_thread_runs_at_the_windows_priority(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)  # llama.cpp's threads exist once a model is loaded
    pid = window.bridge.worker_pid
    assert pid is not None
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    assert threads
    assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads} == {ours}
