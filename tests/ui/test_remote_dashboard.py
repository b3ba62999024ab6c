"""The remote dashboard on a real HTTP server that serves recorded vLLM /metrics texts (tests/data), one
scrape after another, and on servers that go away or answer garbage: figures from counter deltas, "not
reported by this server" for what vLLM lacks, a message (never a crash) when the server fails."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.remote.client import RemoteEngine
from app.remote.scrape import NOT_REPORTED, RemoteRates
from ui.remote.connect import connect_in_background
from ui.remote.panel import RemoteDashboard
from ui.tasks import TaskRunner

DATA = Path(__file__).resolve().parent.parent / "data"
MODELS = {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]}


@pytest.fixture
def vllm_like() -> Iterator[tuple[str, dict[str, object]]]:
    """A server whose /metrics answers metrics_vllm_1.txt first, then metrics_vllm_2.txt from then on."""
    state: dict[str, object] = {"scrapes": 0, "garbage": False}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                body, ctype = json.dumps(MODELS).encode(), "application/json"
            elif self.path == "/metrics":
                n = int(state["scrapes"])  # type: ignore[call-overload]
                state["scrapes"] = n + 1
                name = "metrics_vllm_1.txt" if n == 0 else "metrics_vllm_2.txt"
                body = b"<html>gateway error</html>" if state["garbage"] else (DATA / name).read_bytes()
                ctype = "text/plain"
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def test_dashboard_plots_a_vllm_server_from_its_counters(qtbot: QtBot,
                                                         vllm_like: tuple[str, dict[str, object]]) -> None:
    url, state = vllm_like
    owner = QWidget()  # the runner lives as long as the widgets, as in the window
    qtbot.addWidget(owner)
    tasks = TaskRunner(owner)
    panel = RemoteDashboard(tasks, owner)
    got: list[object] = []
    connect_in_background(tasks, url, None, lambda engine, info: got.append((engine, info)),
                          lambda exc: got.append(exc))
    qtbot.waitUntil(lambda: bool(got), timeout=10_000)
    engine, info = got[0]  # type: ignore[misc]
    assert isinstance(engine, RemoteEngine)
    state["scrapes"] = 0  # discovery read one; the dashboard's first two readings are _1 then _2
    panel.watch(engine, info)
    assert "vLLM" in panel.header.text()
    assert "Qwen/Qwen3-8B" in panel.header.text()
    qtbot.waitUntil(lambda: panel.latest is not None, timeout=10_000)
    panel.timer.stop()  # hold the labels of that first interval
    # Between the two recorded scrapes: +600 draft tokens, +360 accepted.
    assert panel.values["acceptance"].text() == "60%"
    assert panel.values["kv_usage"].text() == "25%"
    assert panel.values["plain_tokens_per_second"].text() == NOT_REPORTED
    assert panel.values["tokens_per_second"].text() != NOT_REPORTED
    assert "vllm:generation_tokens_total" in panel.sources.text()
    tips = " ".join(label.toolTip() for label in panel.values.values())
    assert "vllm:generation_tokens_total" in tips  # where a figure comes from: in its tooltip
    assert not panel.sources.isVisibleTo(panel)  # raw metric names are not drawn over the plots

    state["garbage"] = True  # the server starts answering garbage: a message, the panel keeps running
    panel.timer.start()
    qtbot.waitUntil(lambda: "failed" in panel.status.text(), timeout=10_000)
    assert "metric" in panel.status.text()
    panel.stop()
    tasks.wait()


def test_connecting_to_nothing_is_a_message(qtbot: QtBot) -> None:
    owner = QWidget()
    qtbot.addWidget(owner)
    tasks = TaskRunner(owner)
    errors: list[Exception] = []
    connect_in_background(tasks, "http://127.0.0.1:9", None, lambda *a: None, errors.append)
    qtbot.waitUntil(lambda: bool(errors), timeout=15_000)
    assert "reach" in str(errors[0])
    tasks.wait()


def test_a_figure_keeps_its_last_value_while_the_counters_stand_still(qtbot: QtBot) -> None:
    """llama-server counts an answer when it ends: between two answers' ends the dock keeps the last rate and
    says for how long the counters have not moved, instead of a blank or a 0."""
    owner = QWidget()
    qtbot.addWidget(owner)
    panel = RemoteDashboard(TaskRunner(owner), owner)
    exposed = {"tokens_per_second": True, "acceptance": True}
    busy = RemoteRates(1.0, 42.0, 0.5, None, None, None, None, None, {"tokens_per_second": "Δa / Δb"})
    still = RemoteRates(1.0, None, None, None, None, None, None, None, {})
    panel.show_rates(busy, exposed, 10.0)
    panel.show_rates(still, exposed, 13.0)
    assert panel.values["tokens_per_second"].text() == "42.0 (counters unchanged for 3 s)"
    assert panel.values["acceptance"].text() == "50% (counters unchanged for 3 s)"
    assert panel.values["kv_usage"].text() == NOT_REPORTED
    assert "tokens_per_second: Δa / Δb" in panel.sources.text()  # the kept value keeps its source
