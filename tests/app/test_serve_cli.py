"""`specdeck serve` as a user runs it: a real process, then curl-like requests, then Ctrl+C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def specdeck(*args: str, home: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, SPECDECK_HOME=str(home))
    return subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.process
def test_refuses_another_address_without_a_key(tmp_path: Path, tiny_target: Path) -> None:
    proc = specdeck("serve", "--target", str(tiny_target), "--host", "0.0.0.0", home=tmp_path)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--api-key" in err
    assert "Traceback" not in err


@pytest.mark.process
def test_serves_until_interrupted(tmp_path: Path, tiny_target: Path) -> None:
    port = free_port()
    proc = specdeck("serve", "--target", str(tiny_target), "--port", str(port), "--ctx", "512", "--ngram", "2",
                    home=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        answer = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "abc abc abc abc abc abc"}], "max_tokens": 16, "temperature": 0})
        assert answer.status_code == 200
        text = httpx.get(url + "/metrics").text
        names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
        assert "specdeck:spec_decode_num_draft_tokens_total" in names
        assert "specdeck:tokens_predicted_total" in names
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "serving tiny-target.gguf" in err
    assert "Traceback" not in err
