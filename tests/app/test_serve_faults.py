"""`specdeck serve` when things go wrong around it (issue 28): a dead idle worker, queued clients that leave,
a history that cannot open at start, a home where no log can be written, an unusable or hostile model file."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from app.engine.client import EngineClient
from app.engine.supervisor import MAX_LOAD_CRASHES, gave_up_sentence
from app.events import EngineError, Loaded
from app.params import DraftSettings, LoadSettings
from app.serve import runner as runner_module
from app.serve.metrics import ServeMetrics
from app.serve.runner import EngineRunner
from tests.app.test_serve import MESSAGES, start_server
from tests.app.test_serve_cli import free_port, specdeck
from tests.gguf_fixtures import write_tiny_model


def _wait(predicate, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


@pytest.mark.server
def test_health_says_when_the_idle_worker_died_and_it_is_restarted(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "h.sqlite3")
    try:
        pid = server.runner.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not server.runner._client.alive)  # type: ignore[union-attr]
        first = httpx.get(server.base_url + "/health")
        assert first.status_code == 503
        assert "restarted" in first.json()["message"]
        # /health started the restart: the model is back without any request waiting on it.
        _wait(lambda: httpx.get(server.base_url + "/health").status_code == 200)
        assert server.runner.worker_pid not in (None, pid)
        assert server.runner.restarts == 1
    finally:
        server.stop()


@pytest.mark.server
def test_a_queued_client_that_leaves_is_not_answered(tiny_target: Path, tmp_path: Path) -> None:
    history = tmp_path / "q.sqlite3"
    server = start_server(tiny_target, history, n_ctx=2048, max_tokens=2000, max_waiting=2)
    try:
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=120, json={
                "messages": MESSAGES, "max_tokens": 2000, "stream": True, "temperature": 1.0}) as first:
            lines = first.iter_lines()
            next(lines)  # the first client is being answered
            body = json.dumps({"messages": [{"role": "user", "content": "queued and gone"}],
                               "max_tokens": 4}).encode()
            queued = socket.create_connection(("127.0.0.1", server.port))
            queued.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            _wait(lambda: server.web.admission.waiting == 1, 30)
            queued.close()
            time.sleep(0.5)
        _wait(lambda: server.web.admission.waiting == 0 and server.runner.metrics.requests_processing._value.get() == 0)
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                       json={"messages": MESSAGES, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
        with sqlite3.connect(history) as db:
            saved = [row[0] for row in db.execute("SELECT text FROM messages WHERE role = 'user'")]
        assert "queued and gone" not in saved
    finally:
        server.stop()


@pytest.mark.server
def test_a_history_that_could_not_open_is_opened_later(tiny_target: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "HISTORY_RETRY_SECONDS", 0.0)
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be")  # the history cannot be created
    history = blocker / "history.sqlite3"
    server = start_server(tiny_target, history)
    try:
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                       json={"messages": MESSAGES, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200  # answered without a history
        blocker.unlink()  # space freed, folder fixed
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "saved after all"}], "max_tokens": 2,
                             "temperature": 0})
        assert r.status_code == 200
        _wait(lambda: history.exists(), 30)

        def saved() -> list[str]:
            with sqlite3.connect(history) as db:
                return [row[0] for row in db.execute("SELECT text FROM messages WHERE role = 'user'")]

        _wait(lambda: "saved after all" in saved(), 30)  # written on the history's own thread, after the answer
    finally:
        server.stop()


@pytest.mark.process
def test_the_engine_loads_where_no_log_file_can_be_created(tiny_target: Path, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "logs"
    not_a_folder.write_text("x")
    client = EngineClient(log_dir=not_a_folder / "engine")
    try:
        client.load(LoadSettings(target_path=str(tiny_target), n_ctx=256, draft=DraftSettings(ngram=0)))
        events = list(client.events(timeout=120))
        assert any(isinstance(e, Loaded) for e in events), [e for e in events if isinstance(e, EngineError)]
    finally:
        client.close()


def _serve(tmp_path: Path, target: Path, *extra: str) -> tuple[int, str]:
    proc = specdeck("serve", "--target", str(target), "--port", str(free_port()), "--ctx", "256", *extra,
                    home=tmp_path / "home")
    try:
        _out, err = proc.communicate(timeout=180)
    except Exception:
        proc.kill()
        raise
    return proc.returncode, err


def test_serve_exits_when_the_model_cannot_be_loaded(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    code, err = _serve(tmp_path, broken)
    assert code != 0
    assert "cannot be served" in err or "specdeck serve:" in err
    assert "Traceback" not in err


@pytest.mark.process
def test_serve_prints_no_control_characters_from_the_model_and_says_when_its_template_is_refused(
        tmp_path: Path, tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    name = "evil\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[8mhidden.gguf"
    hostile = tiny_model_factory(name, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    port = free_port()
    proc = specdeck("serve", "--target", str(hostile), "--port", str(port), "--ctx", "256", "--no-history",
                    home=tmp_path / "home")
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: proc.poll() is not None or _healthy(url), 180)
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "\\x1b" in err  # the name is shown, its escapes written out
    assert "template is refused" in err


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _blocked_home(tmp_path: Path) -> Path:
    """A SpecDeck home where no folder can be created (a file in each place): what a read-only home does to a
    user who is not root, and root too."""
    home = tmp_path / "home"
    home.mkdir()
    for kind in ("logs", "data", "cache", "config"):
        (home / kind).write_text("not a folder")
    return home


@pytest.mark.process
def test_chat_and_bench_run_where_nothing_can_be_written(tmp_path: Path, tiny_target: Path) -> None:
    import subprocess
    import sys

    from tests.app.test_serve_cli import ROOT

    home = _blocked_home(tmp_path)
    env = dict(os.environ, SPECDECK_HOME=str(home))
    chat = subprocess.run([sys.executable, "-m", "app", "chat", "--target", str(tiny_target), "--ctx", "256",
                           "--max-tokens", "8"], input="abc abc\n", cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=180)
    assert chat.returncode == 0, chat.stderr
    assert "Traceback" not in chat.stderr
    assert "loaded" in chat.stdout + chat.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    bench = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(tiny_target), "--prompts",
                            str(prompts), "--max-tokens", "8"], cwd=ROOT, env=env, text=True, capture_output=True,
                           timeout=180)
    assert "Traceback" not in bench.stderr
    assert "None" not in bench.stderr
    assert bench.returncode == 0, bench.stderr


@pytest.mark.process
def test_a_model_that_crashes_every_load_is_given_up_after_the_supervisors_limit(tmp_path: Path) -> None:
    aborts = write_tiny_model(tmp_path / "aborts.gguf", name="aborts", aborting=True)
    lines: list[str] = []
    unusable: list[str] = []
    runner = EngineRunner(LoadSettings(target_path=str(aborts), n_ctx=512, n_threads=1), ServeMetrics(),
                          history_path=None, log=lines.append, on_unusable=unusable.append)
    runner.start()
    try:
        _wait(lambda: runner.state == "error")
        assert runner.message.endswith(gave_up_sentence(MAX_LOAD_CRASHES))
        assert unusable == [runner.message]  # `specdeck serve` exits with this sentence
        attempts = [line for line in lines if "the engine died while loading" in line]
        assert len(attempts) == MAX_LOAD_CRASHES
    finally:
        runner.stop()
