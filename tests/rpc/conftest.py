"""The `rpc` tests split a model over two real llama.cpp `rpc-server` processes on this machine, against
llama.cpp built with -DGGML_RPC=ON: `packaging/rpc_tests` builds both (once, cached) and runs them with
SPECDECK_RPC_TESTS=1 and SPECDECK_RPC_SERVER set to the server binary. Without that variable they are skipped;
with it, a build without the RPC backend or a missing server fails them instead of skipping."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ENABLED = os.environ.get("SPECDECK_RPC_TESTS") == "1"
START_TIMEOUT_S = 30.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rpc: needs llama.cpp built with RPC and rpc-server (packaging/rpc_tests)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="RPC tests: run packaging/rpc_tests (llama.cpp built with -DGGML_RPC=ON and "
                            "rpc-server, cached; SPECDECK_RPC_TESTS=1)")
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.rpc)
            if not ENABLED:
                item.add_marker(skip)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RpcServer:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def start_server(binary: Path, log_dir: Path) -> RpcServer:
    """One rpc-server on a free loopback port, one thread, answering once it accepts connections."""
    port = free_port()
    log = log_dir / f"rpc-server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                                   stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"rpc-server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return RpcServer(f"127.0.0.1:{port}", process, log)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"rpc-server did not listen on {port} within {START_TIMEOUT_S:.0f} s")


@pytest.fixture
def rpc_servers(tmp_path: Path) -> Iterator[list[RpcServer]]:
    """Two rpc-server processes (fresh for each test: one test kills one)."""
    binary = Path(os.environ.get("SPECDECK_RPC_SERVER", ""))
    if not binary.is_file():
        pytest.fail(f"SPECDECK_RPC_TESTS is set but SPECDECK_RPC_SERVER ({binary}) is not an rpc-server binary; "
                    "run packaging/rpc_tests.")
    servers: list[RpcServer] = []
    try:
        servers = [start_server(binary, tmp_path) for _ in range(2)]
        yield servers
    finally:
        for server in servers:
            server.stop()
