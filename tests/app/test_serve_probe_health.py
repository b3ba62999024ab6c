"""`specdeck serve`'s /health and errors when the engine worker is stopped, killed or restarted: the truth, and
words an API client can act on. A real server and worker; the worker is signalled as a user or the kernel would."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.serve.server import Server
from tests.app.test_serve import MESSAGES, start_server


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP is POSIX")
@pytest.mark.server
def test_health_is_503_while_the_worker_is_stopped(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "h.sqlite3")
    pid = server.runner.worker_pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while (r := httpx.get(server.base_url + "/health", timeout=30)).status_code == 200:
            assert time.monotonic() < deadline, "/health said ok for a stopped worker"
            time.sleep(0.05)
        assert r.status_code == 503
        assert r.json()["status"] == "error"
        assert "stopped" in r.json()["message"]
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        deadline = time.monotonic() + 30
        while httpx.get(server.base_url + "/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "/health did not recover once the worker ran again"
            time.sleep(0.05)
    finally:
        server.stop()


@pytest.mark.server
def test_health_never_says_ok_while_a_killed_worker_is_restarted(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "h.sqlite3")
    try:
        before = server.runner.loaded
        pid = server.runner.worker_pid
        assert pid is not None
        assert before is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while server.runner.worker_pid == pid:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        seen = []
        while True:  # asked as often as a client could, through the restart and the load
            r = httpx.get(server.base_url + "/health", timeout=30)
            seen.append(r.json()["status"])
            if r.status_code == 200:
                # "ok" only once the model is loaded again in the new worker
                assert server.runner.loaded is not before, seen
                break
            assert time.monotonic() < deadline, seen
        assert "loading" in seen
        assert server.runner.restarts == 1
    finally:
        server.stop()


def _crash_mid_answer(server: Server) -> list[dict[str, Any]]:
    """The errors in a streamed answer whose worker is killed while it generates."""
    body = {"messages": MESSAGES, "max_tokens": 4000, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # generating now
        pid = server.runner.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # thousands of tokens are still to come
        rest = [line for line in lines if line.startswith("data: {")]
    return [json.loads(line[6:])["error"] for line in rest if '"error"' in line]


@pytest.mark.server
def test_health_is_503_right_after_a_crash_mid_answer(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "h.sqlite3", n_ctx=4096, max_tokens=4000)
    try:
        before = server.runner.loaded
        assert len(_crash_mid_answer(server)) == 1
        r = httpx.get(server.base_url + "/health", timeout=30)  # the client heard of the crash: not ready now
        assert r.status_code == 503 or server.runner.loaded is not before, r.text
    finally:
        server.stop()


@pytest.mark.server
def test_a_crash_tells_the_client_the_server_restarts_the_engine_and_to_retry(tiny_target: Path,
                                                                            tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "h.sqlite3", n_ctx=4096, max_tokens=4000)
    try:
        streamed = _crash_mid_answer(server)
        assert len(streamed) == 1
        _wait_ready(server)
        client = httpx.Client(timeout=120)
        pending = client.build_request("POST", server.base_url + "/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 4000, "temperature": 0})
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(client.send(pending)))
        sender.start()
        deadline = time.monotonic() + 60
        while not server.runner.metrics.requests_processing._value.get():  # generating now
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pid = server.runner.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        sender.join(120)
        client.close()
        assert answers[0].status_code == 500
        plain = answers[0].json()["error"]
        assert plain["code"] == "engine_crashed"
        for error in (streamed[0], plain):
            assert "SIGKILL" in error["message"]
            assert "restart the engine" not in error["message"]
            assert "The server restarts it" in error["message"]
            assert "retried" in error["message"]
        _wait_ready(server)
        assert server.runner.restarts == 2
    finally:
        server.stop()


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + 120
    while httpx.get(server.base_url + "/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, server.runner.message
        time.sleep(0.1)
