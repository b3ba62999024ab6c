"""`specdeck serve` and the connections it holds: request bodies that never arrive, queued clients that leave,
bursts of connections past the file limit. A real server (uvicorn, the engine worker on a tiny model) and
real sockets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.app.test_serve import MESSAGES, start_server
from tests.app.test_serve_cli import ROOT, free_port

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n")


def _read_to_close(sock: socket.socket, bound: float) -> bytes:
    """Everything the server sends until it closes the connection; TimeoutError past ``bound`` seconds."""
    sock.settimeout(bound)
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


@pytest.mark.server
def test_a_body_that_never_arrives_is_answered_408_and_frees_its_connection(tiny_target: Path,
                                                                             tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "b.sqlite3", max_connections=8, body_timeout_seconds=1.0)
    held: list[socket.socket] = []
    try:
        for _ in range(7):  # one short of the cap: every new connection is over uvicorn's limit meanwhile
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(HEAD + b"{")  # one byte of the thousand announced
            held.append(s)
        for s in held:
            answer = _read_to_close(s, 30)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert b'"request_timeout"' in answer
        assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200
    finally:
        for s in held:
            s.close()
        server.stop()


@pytest.mark.server
def test_a_body_sent_a_byte_at_a_time_is_cut_off_at_the_body_deadline(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "d.sqlite3", body_timeout_seconds=1.0)
    s = socket.create_connection(("127.0.0.1", server.port))
    try:
        s.sendall(HEAD)
        s.settimeout(0.2)
        deadline = time.monotonic() + 30
        answer = b""
        while time.monotonic() < deadline:  # a byte every 0.2 s: each one is in time, the whole body is not
            try:
                s.sendall(b" ")
            except OSError:
                break  # closed by the server
            try:
                chunk = s.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        else:
            raise AssertionError("the connection was still open after 30 s")
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    finally:
        s.close()
        server.stop()


def _metric(base_url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} is not in /metrics")


@pytest.mark.server
def test_queued_clients_that_leave_give_their_places_back_at_once(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "q.sqlite3", max_waiting=2)
    admission = server.web.admission
    assert server.loop is not None
    # The slot is held, as a long answer holds it, for the whole test: the queue must empty without it.
    asyncio.run_coroutine_threadsafe(admission.acquire(), server.loop).result(10)
    queued: list[socket.socket] = []
    answers: list[httpx.Response] = []
    try:
        body = json.dumps({"messages": MESSAGES, "max_tokens": 2, "temperature": 0}).encode()
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            queued.append(s)
        _wait_for(lambda: admission.waiting == 2, 30)
        assert _metric(server.base_url, "specdeck:requests_deferred") == 2
        for s in queued:
            s.close()  # both give up while they wait
        _wait_for(lambda: admission.waiting == 0, 30)
        assert _metric(server.base_url, "specdeck:requests_deferred") == 0
        # The next client is queued, not refused with 429: its place is free.
        client = threading.Thread(target=lambda: answers.append(httpx.post(
            server.base_url + "/v1/chat/completions", timeout=120,
            json={"messages": MESSAGES, "max_tokens": 2, "temperature": 0})))
        client.start()
        _wait_for(lambda: admission.waiting == 1 or bool(answers), 30)
        assert not answers, answers[0].text
    finally:
        server.loop.call_soon_threadsafe(admission.release)
    try:
        client.join(120)
        assert [r.status_code for r in answers] == [200]
    finally:
        server.stop()


def _wait_for(predicate: Callable[[], bool], bound: float) -> None:
    deadline = time.monotonic() + bound
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform == "win32", reason="the file limit is set with setrlimit")
@pytest.mark.process
def test_a_burst_past_the_file_limit_writes_one_line_not_tracebacks(tmp_path: Path, tiny_target: Path) -> None:
    import resource

    def low_file_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    port = free_port()
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--target", str(tiny_target), "--port",
                                 str(port), "--ctx", "256", "--no-history"], cwd=ROOT,
                                env=dict(os.environ, SPECDECK_HOME=str(tmp_path / "home")), stdout=subprocess.DEVNULL,
                                stderr=err, preexec_fn=low_file_limit)
    url = f"http://127.0.0.1:{port}"
    held: list[socket.socket] = []
    try:
        _wait_for(lambda: proc.poll() is not None or _healthy(url), 180)
        assert proc.poll() is None, err_path.read_text()
        for _ in range(300):  # far past the 64 descriptors the server has
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            held.append(s)
        time.sleep(3)  # the burst lasts: the server keeps failing to accept meanwhile
        for s in held:
            s.close()
        held.clear()
        _wait_for(lambda: _healthy(url), 60)  # it serves again once they are gone
    finally:
        for s in held:
            s.close()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    err_text = err_path.read_text()
    assert "Traceback" not in err_text
    assert "Logging error" not in err_text
    notes = [line for line in err_text.splitlines() if "file descriptors" in line]
    assert 1 <= len(notes) <= 2, err_text[-3000:]
    assert len(err_text) < 5000, err_text[-3000:]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
