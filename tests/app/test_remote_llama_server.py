"""A real llama-server (built by packaging/build_llama_server from the llama.cpp that llama-cpp-python
vendors) on 127.0.0.1 with --metrics and n-gram speculation, watched through app.remote.client.

Skipped, with the reason, where the binary has not been built: building it takes minutes, so CI builds it
in a cached step of its own or not at all.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.events import Finished, Token
from app.remote.client import RemoteEngine
from app.remote.scrape import rates, reported

pytestmark = pytest.mark.llama_server

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Repeat after me: abc abc abc abc abc abc abc abc abc abc abc abc abc abc"


def llama_server_binary() -> Path | None:
    out = subprocess.run([sys.executable, str(ROOT / "packaging" / "build_llama_server"), "--print"],
                         capture_output=True, text=True, timeout=60)
    path = Path(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else None
    return path if out.returncode == 0 and path is not None and path.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_llama_server(model: Path, log_dir: Path, *extra: str) -> Iterator[str]:
    """llama-server on 127.0.0.1 with --metrics and --slots and ``extra`` arguments, until the block ends."""
    binary = llama_server_binary()
    if binary is None:
        pytest.skip("llama-server is not built; run packaging/build_llama_server (several minutes, once)")
    port = free_port()
    log = (log_dir / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--metrics", "--slots",
         "-c", "1024", "-np", "1", "-t", "1", *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, f"llama-server exited with {proc.returncode}; see {log.name}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def llama_server(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """With n-gram speculation (ngram-simple, up to 4 draft tokens)."""
    with running_llama_server(tiny_target, tmp_path_factory.mktemp("llama-server"), "--spec-type", "ngram-simple",
                              "--spec-draft-n-max", "4") as url:
        yield url


@pytest.fixture(scope="module")
def llama_server_plain(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Without speculation."""
    with running_llama_server(tiny_target, tmp_path_factory.mktemp("llama-server-plain")) as url:
        yield url


def test_discovers_llama_server(llama_server: str, tiny_target: Path) -> None:
    with RemoteEngine(llama_server) as remote:
        info = remote.discover()
    assert info.engine == "llama-server"
    assert info.has_metrics
    assert info.has_slots
    assert info.n_ctx == 1024
    assert len(info.models) == 1
    assert info.speculating is True  # its /slots say so
    assert info.speculation == "on (its /slots say so)"


def test_llama_server_without_speculation_says_so(llama_server_plain: str) -> None:
    """Its spec-decode counters are there but stay still; /slots says it does not speculate."""
    with RemoteEngine(llama_server_plain) as remote:
        info = remote.discover()
        before = remote.scrape()
        events = list(remote.chat([{"role": "user", "content": PROMPT}], max_tokens=16, temperature=0))
        after = remote.scrape()
    assert info.speculating is False
    assert info.speculation == "off (its /slots say so)"
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.stats.drafted == 0
    figures = rates(before, after)
    assert figures.tokens_per_second is not None
    assert figures.acceptance is None


def test_rates_from_llama_server_counters(llama_server: str) -> None:
    with RemoteEngine(llama_server) as remote:
        remote.discover()
        before = remote.scrape()
        events = list(remote.chat([{"role": "user", "content": PROMPT}], max_tokens=64, temperature=0))
        after = remote.scrape()
    assert any(isinstance(e, Token) for e in events)
    finished = events[-1]
    assert isinstance(finished, Finished)
    figures = rates(before, after)
    exposed = reported(after)
    assert figures.tokens_per_second is not None
    assert figures.tokens_per_second > 0
    assert "llamacpp:tokens_predicted_seconds_total" in figures.sources["tokens_per_second"]
    assert exposed["acceptance"]  # this build has the spec-decode counters
    delta_drafted = after.counters["draft_tokens"] - before.counters["draft_tokens"]
    delta_accepted = after.counters["accepted"] - before.counters["accepted"]
    # The stream's own timings (timings_per_token) agree with the server's counters.
    assert finished.stats.drafted == delta_drafted
    assert finished.stats.accepted == delta_accepted
    if delta_drafted:
        assert figures.acceptance == delta_accepted / delta_drafted
    else:
        assert figures.acceptance is None
    assert figures.kv_usage is not None  # estimated from /slots: llama-server has no KV metric
    assert "/slots" in after.sources["kv_usage"]
    assert not exposed["plain_tokens_per_second"]
