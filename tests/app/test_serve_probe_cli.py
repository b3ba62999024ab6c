"""`specdeck serve` as a user starts it: API keys in any script, given without the process list seeing them, and
a port already in use. Real processes, real HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.cli.exit_codes import EXIT_BAD_OPTIONS
from tests.app.test_serve import MESSAGES, start_server
from tests.app.test_serve_cli import ROOT, free_port

KEY = "ключ-🔑-clé"


def _chat(url: str, headers: dict[str, bytes]) -> int:
    return httpx.post(url + "/v1/chat/completions", timeout=120, headers=headers,
                      json={"messages": MESSAGES, "max_tokens": 2, "temperature": 0}).status_code


@pytest.mark.server
def test_a_key_with_any_characters_matches_its_utf8_bytes(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "k.sqlite3", api_key=KEY)
    try:
        url = server.base_url
        assert _chat(url, {"Authorization": b"Bearer " + KEY.encode()}) == 200
        assert _chat(url, {"X-Api-Key": KEY.encode()}) == 200
        assert _chat(url, {"Authorization": b"Bearer " + KEY.encode("utf-8").replace(b"\xd0", b"\xd1")}) == 401
        assert _chat(url, {"Authorization": b"Bearer " + KEY.encode()[:-1]}) == 401
        assert _chat(url, {}) == 401
    finally:
        server.stop()


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port), "--ctx", "256",
                             "--no-history", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**os.environ, "SPECDECK_HOME": str(tmp_path / "home"), **(env or {})})
    return proc, f"http://127.0.0.1:{port}"


def _until_ready(proc: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["file", "environment"])
def test_the_key_can_come_from_a_file_or_the_environment(tiny_target: Path, tmp_path: Path, how: str) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n", encoding="utf-8")
    args, env = (["--api-key-file", str(key_file)], None) if how == "file" else ([], {"SPECDECK_API_KEY": KEY})
    proc, url = _serve(tmp_path, "--target", str(tiny_target), *args, env=env)
    try:
        _until_ready(proc, url)
        assert _chat(url, {"Authorization": b"Bearer " + KEY.encode()}) == 200
        assert _chat(url, {}) == 401
        assert httpx.get(url + "/metrics", timeout=30).status_code == 401
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


@pytest.mark.process
def test_help_names_every_way_to_give_the_key(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "app", "serve", "--help"], cwd=ROOT, text=True, capture_output=True,
                         env={**os.environ, "SPECDECK_HOME": str(tmp_path)}, timeout=60)
    assert out.returncode == 0
    assert "--api-key-file" in out.stdout
    assert "SPECDECK_API_KEY" in out.stdout


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xff\xfe\xfa"])
def test_an_unusable_key_file_is_refused_before_anything_loads(tiny_target: Path, tmp_path: Path,
                                                                content: bytes) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_bytes(content)
    proc, _url = _serve(tmp_path, "--target", str(tiny_target), "--api-key-file", str(key_file))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "API key file" in err
    assert "Traceback" not in err


def test_a_key_no_header_can_carry_is_refused() -> None:
    from app.errors import SettingsError
    from app.serve.server import ServeOptions

    with pytest.raises(SettingsError, match="control characters"):
        ServeOptions(api_key="line one\nline two").check()


@pytest.mark.process
def test_a_port_in_use_is_refused_before_the_model_loads(tiny_target: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--target", str(tiny_target), "--port",
                                 str(port), "--ctx", "256", "--no-history"], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "SPECDECK_HOME": str(tmp_path / "home")})
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_BAD_OPTIONS, err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "--port" in err
    assert "loaded" not in err  # the model was never loaded
    assert "Traceback" not in err
