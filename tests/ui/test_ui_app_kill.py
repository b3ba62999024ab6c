"""Kill -9 of the whole app mid-answer: the chat survives in the history file.

The real `specdeck` window runs in a subprocess (offscreen), driven by its autopilot; the test follows
the stream on its stdout, kills the process group with SIGKILL, and reopens the history store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.storage.history import HistoryStore

LONG_PROMPT = "Write a long essay about the history of computing, with at least ten paragraphs."


@pytest.mark.demo
def test_kill_9_mid_answer_keeps_every_message(demo_models: tuple[Path, Path], tmp_path: Path) -> None:
    smollm2, _ = demo_models
    home = tmp_path / "home"
    env = dict(os.environ, SPECDECK_HOME=str(home), SPECDECK_MODELS_DIR=str(smollm2.parent),
               QT_QPA_PLATFORM="offscreen", PYTHONUNBUFFERED="1")
    env["SPECDECK_AUTOPILOT"] = json.dumps({
        "target": str(smollm2), "ngram": 0, "threads": 1, "n_ctx": 2048,
        "prompts": [LONG_PROMPT], "max_tokens": 1500, "quit": False,
    })
    code = "import sys; from ui.launch import main; sys.exit(main([]))"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    streamed: list[tuple[float, int]] = []  # (time, characters the window had received)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            if line.startswith("autopilot: streamed"):
                streamed.append((time.monotonic(), int(line.split()[2])))
                if streamed[-1][1] > 200 and streamed[-1][0] - streamed[0][0] > 1.5:
                    break
            assert "finished" not in line, "the answer ended before the kill; make it longer"
            assert time.monotonic() < deadline, "no stream within the time limit"
        killed_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    # What the window had one second before it died must be on disk.
    had_a_second_before = max((chars for t, chars in streamed if t <= killed_at - 1.0), default=0)
    assert had_a_second_before > 0
    with HistoryStore(home / "data" / "history.sqlite3") as store:
        assert store.integrity_ok()
        chats = store.list_chats()
        assert len(chats) == 1
        messages = store.messages(chats[0].id)
        assert [m.role for m in messages] == ["user", "assistant"]
        assert messages[0].text == LONG_PROMPT
        answer = messages[1]
        assert answer.status == "interrupted"
        assert len(answer.text) >= had_a_second_before
        assert answer.text.strip()
