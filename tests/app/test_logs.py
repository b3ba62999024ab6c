"""Logging: one rotating file in the log folder, and engine logs that outlive a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import logs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.process
def test_setup_logging_writes_to_the_log_folder_once(tmp_path: Path) -> None:
    script = (
        "import logging\n"
        "from app.logs import setup_logging\n"
        "first = setup_logging()\n"
        "second = setup_logging(logging.DEBUG)\n"
        "assert first == second, (first, second)\n"
        "logging.getLogger('app.test').info('hello from the test')\n"
        "logging.getLogger('app.test').debug('debug after the level changed')\n"
        "print(first)\n"
    )
    env = {**os.environ, "SPECDECK_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path == tmp_path / "logs" / "specdeck.log"
    text = path.read_text()
    assert "INFO app.test: hello from the test" in text
    assert "DEBUG app.test: debug after the level changed" in text
    assert text.count("\n") == 2  # one handler, so each record once


@pytest.mark.process
def test_an_unwritable_log_folder_gives_no_log_and_no_error(tmp_path: Path) -> None:
    blocker = tmp_path / "home"
    blocker.write_text("a file where the folder would be")
    script = "from app.logs import setup_logging\nprint(setup_logging())\n"
    env = {**os.environ, "SPECDECK_HOME": str(blocker)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_engine_logs_are_kept_and_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    made = []
    for i in range(7):
        path = logs.new_engine_log_path(keep=3)
        path.write_text(f"log {i}\n")
        stamp = time.time() - 100 + i  # distinct ages, whatever the clock's resolution
        os.utime(path, (stamp, stamp))
        made.append(path)
    assert len(set(made)) == 7
    assert all(p.parent == tmp_path / "logs" / "engine" for p in made)
    kept = logs.engine_logs()
    # The newest three survive; the newest is first.
    assert kept == [made[6], made[5], made[4]]
    logs.prune_engine_logs(0)
    assert logs.engine_logs() == []


def test_a_crashed_workers_log_survives_the_next_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    crashed = logs.new_engine_log_path()
    crashed.write_text("GGML_ASSERT failed\n")
    logs.new_engine_log_path()
    assert crashed.read_text() == "GGML_ASSERT failed\n"
    assert crashed in logs.engine_logs()


def test_engine_logs_in_a_folder_of_their_own(tmp_path: Path) -> None:
    made = [logs.new_engine_log_path(tmp_path, keep=2) for _ in range(3)]
    assert all(p.parent == tmp_path for p in made)
    assert len(logs.engine_logs(tmp_path)) == 2
    assert made[-1] in logs.engine_logs(tmp_path)


@pytest.mark.process
def test_the_root_logger_is_not_touched_by_import() -> None:
    # Importing app.logs must not configure logging: only an entry point does.
    done = subprocess.run([sys.executable, "-c", "import logging, app.logs; print(len(logging.getLogger().handlers))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


@pytest.mark.process
def test_httpx_requests_stay_out_of_the_log(tmp_path: Path) -> None:
    """The Remote engine dock reads a server once a second: httpx's INFO line per request filled the log."""
    script = (
        "import logging\n"
        "from app.logs import setup_logging\n"
        "path = setup_logging()\n"
        "logging.getLogger('httpx').info('HTTP Request: GET http://127.0.0.1:8642/metrics')\n"
        "logging.getLogger('httpx').warning('a warning is kept')\n"
        "print(path)\n"
    )
    env = {**os.environ, "SPECDECK_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    text = Path(done.stdout.strip()).read_text()
    assert "HTTP Request" not in text
    assert "a warning is kept" in text
