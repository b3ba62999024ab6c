"""Remote models in the model picker, against SpecDeck's own real server (`specdeck serve` on 127.0.0.1):
connected, the picker lists the server's models marked remote with its host:port; choosing one turns the
drafter controls off with the reason and sends the chat through the server's /v1/chat/completions (its
counters move by the answer's own drafted and accepted counts); disconnecting takes them away and the chat
goes back to the window's engine."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pytestqt.qtbot import QtBot

from app.events import MessageStats
from app.remote.client import RemoteModel
from app.serve.server import Server
from tests.ui.conftest import set_sampling
from ui.models.picker import REMOTE_NOTE

PROMPT = "abc abc abc abc abc abc abc abc abc abc abc abc"
DRAFTED = "specdeck:spec_decode_num_draft_tokens_total"
ACCEPTED = "specdeck:spec_decode_num_accepted_tokens_total"


def counters(url: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
            for s in f.samples if not s.labels}


def test_remote_models_in_the_picker_chat_through_the_server(qtbot: QtBot, make_window: object, tiny_target: Path,
                                                            served: Server) -> None:
    window = make_window(start_engine=False, folders=(tiny_target.parent,))  # type: ignore[operator]
    picker, chat, side = window.picker, window.chat, window.remote
    local = picker.target_combo.count()
    assert local >= 1
    side.connect_to(served.base_url)
    qtbot.waitUntil(lambda: bool(picker.remote_models), timeout=30_000)

    # Listed after the local models, marked remote with the server's host:port.
    where = served.base_url.removeprefix("http://")
    assert picker.target_combo.count() == local + 1
    label = picker.target_combo.itemText(local)
    assert label == f"{tiny_target.name} — remote, {where}"
    assert picker.remote_model() is None  # listing a server's models does not choose one
    model = picker.target_combo.itemData(local)
    assert model == RemoteModel(tiny_target.name, served.base_url, "SpecDeck")

    drafting = (picker.drafter_combo, picker.ngram_check, picker.ngram_spin, picker.adaptive_check, picker.k_spin,
                picker.k_max_spin)
    assert all(w.isEnabled() for w in drafting if w is not picker.k_spin)
    assert picker.select_remote(model)
    assert not any(w.isEnabled() for w in drafting)
    assert not picker.remote_note.isHidden()
    assert picker.remote_note.text() == REMOTE_NOTE
    for label_widget in (picker.remote_note, picker.target_info):
        assert label_widget.textFormat() == label_widget.textFormat().PlainText  # server text is untrusted
    assert where in picker.target_info.text()
    assert not picker.load_box.load_button.isEnabled()
    assert not picker.request_load()  # nothing to load: it says so
    assert "server" in picker.load_box.status_label.text()
    assert side.route is not None
    assert chat.bridge is side.route
    with qtbot.waitSignal(picker.library_changed, timeout=30_000):
        picker.rescan()  # a rescan of the local folders keeps the remote choice
    assert picker.remote_model() == model
    assert chat.bridge is side.route

    # The chat answers through the server: its counters move by the answer's own counts.
    set_sampling(window, temperature=0, max_tokens=48)
    before = counters(served.base_url)
    with qtbot.waitSignal(chat.answer_finished, timeout=120_000) as finished:
        assert chat.send(PROMPT)
    answer = finished.args[0]
    after = counters(served.base_url)
    assert answer.status == "complete", answer.text
    assert answer.text
    stats = answer.stats
    assert isinstance(stats, MessageStats)
    assert stats.drafted == after[DRAFTED] - before[DRAFTED] > 0
    assert stats.accepted == after[ACCEPTED] - before[ACCEPTED]
    assert answer.model == f"{tiny_target.name} (remote, {where})"
    assert answer.drafter is None
    assert window.store is not None
    qtbot.waitUntil(lambda: window.store.messages(chat.chat_id)[-1].status == "complete", timeout=10_000)
    assert window.store.messages(chat.chat_id)[-1].target_model == answer.model

    # Disconnecting takes the server's models away; the chat and the controls are the window's again.
    side.disconnect_server()
    assert picker.remote_models == ()
    assert picker.target_combo.count() == local
    assert picker.remote_model() is None
    assert picker.target_path() is not None  # a local model again
    assert picker.drafter_combo.isEnabled()
    assert picker.ngram_check.isEnabled()
    assert picker.remote_note.isHidden()
    assert side.route is None
    assert chat.bridge is window.bridge


@pytest.fixture
def dying_server() -> Iterator[str]:
    """Lists one model whose id is markup, and dies in the middle of every chat answer (no [DONE])."""
    models = json.dumps({"object": "list", "data": [{"id": "<b>bold</b> model", "object": "model"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path != "/v1/models":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(models)))
            self.end_headers()
            self.wfile.write(models)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_a_remote_model_whose_server_dies_mid_answer(qtbot: QtBot, make_window: object, dying_server: str) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    picker, chat = window.picker, window.chat
    window.remote.connect_to(dying_server)
    qtbot.waitUntil(lambda: bool(picker.remote_models), timeout=30_000)
    model = picker.remote_models[0]
    assert picker.select_remote(model)
    assert picker.target_combo.currentText().startswith("<b>bold</b> model — remote, 127.0.0.1:")
    header = window.remote.dashboard.header
    assert "<b>bold</b> model" in header.text()  # shown as the characters it is
    assert header.textFormat() == header.textFormat().PlainText

    for attempt in range(2):  # the window goes on working: a second question fails the same way
        with qtbot.waitSignal(chat.answer_finished, timeout=30_000) as finished:
            assert chat.send(f"hello {attempt}")
        answer = finished.args[0]
        assert answer.status == "error"
        assert answer.text == "Hel"  # what arrived is kept
        assert "before it finished" in window.notifier.last_message or "broke" in window.notifier.last_message
        assert not chat.generating
        assert chat.send_button.isEnabled()
