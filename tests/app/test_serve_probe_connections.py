"""`specdeck serve` and the connections it holds: request bodies that never arrive, queued clients that leave,
bursts of connections past the file limit. A real server (uvicorn, the engine worker on a tiny model) and
real sockets."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.app.test_serve import start_server

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
