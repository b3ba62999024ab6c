"""The Server switch never holds a second copy of the model: the window unloads its own first (and says so),
the server loads the window's whole load settings, the window chats through the server, and stopping the
server loads the model back in the window's own engine. Serve waits for an answer or Tune to end, a server
that cannot start (or whose engine cannot load the model) gives the model back, a load in the window while serving
is refused, closing the window while serving loads nothing, and a chat through the window's own server is saved
once."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import psutil
import pytest
from pytestqt.qtbot import QtBot

from app.storage.history import HistoryStore
from app.storage.settings import AppSettings, save_settings, with_settings
from tests.ui.conftest import LOAD_TIMEOUT_MS, load_pair, set_sampling

QUESTION = "abc abc abc abc"


def holders(model: Path) -> set[int]:
    """The processes under this one that have ``model`` mapped (llama.cpp maps the weights it loaded)."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if any(Path(m.path) == model for m in process.memory_maps(grouped=True)):
                found.add(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_serving_holds_the_model_once_and_the_window_chats_through_the_server(
    qtbot: QtBot, make_window: object, tiny_target: Path, specdeck_home: Path,
) -> None:
    save_settings(with_settings(AppSettings(), {"load.n_batch": 128}))  # a load field no widget shows
    window = make_window(folders=(tiny_target.parent,))  # type: ignore[operator]
    load_pair(qtbot, window, tiny_target, ngram=2)
    bridge, side, chat = window.bridge, window.remote, window.chat
    load = bridge.last_load
    assert load is not None
    assert load.n_batch == 128
    assert holders(tiny_target.resolve()) == {bridge.worker_pid}

    side.switch.port = 0
    with qtbot.waitSignal(side.switch.started, timeout=LOAD_TIMEOUT_MS) as started:
        side.serve_action.setChecked(True)
    url = started.args[0]
    assert bridge.loaded is None  # the window's copy went first
    server = side.switch.server
    assert server is not None
    assert server.runner.settings == load  # the window's whole load, not a few of its fields
    qtbot.waitUntil(lambda: httpx.get(url + "/health").status_code == 200, timeout=LOAD_TIMEOUT_MS)
    served_by = holders(tiny_target.resolve())
    assert len(served_by) == 1  # one copy, in the server's worker
    assert bridge.worker_pid not in served_by

    # The window chats through its own server.
    qtbot.waitUntil(lambda: side.route is not None and chat.bridge is side.route, timeout=30_000)
    set_sampling(window, temperature=0, max_tokens=8)
    with qtbot.waitSignal(chat.answer_finished, timeout=120_000) as finished:
        assert chat.send(QUESTION)
    assert finished.args[0].status == "complete"
    assert len(holders(tiny_target.resolve())) == 1

    # Stopping the server puts the model back in the window's engine, once.
    with qtbot.waitSignal(bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        side.serve_action.setChecked(False)
    assert bridge.last_load == load
    qtbot.waitUntil(lambda: holders(tiny_target.resolve()) == {bridge.worker_pid}, timeout=30_000)
    assert chat.bridge is bridge

    # The window saved its chat; its own server, told so, did not save it again.
    window.close()
    with HistoryStore(specdeck_home / "data" / "history.sqlite3") as store:
        asked = [c for c in store.list_chats()
                 if any(m.role == "user" and m.text == QUESTION for m in store.messages(c.id))]
    assert len(asked) == 1
    assert asked[0].origin != "api"


def test_serve_waits_for_an_answer_and_for_tune(qtbot: QtBot, make_window: object, tiny_target: Path) -> None:
    window = make_window(folders=(tiny_target.parent,))  # type: ignore[operator]
    load_pair(qtbot, window, tiny_target, ngram=2)
    bridge, side, chat = window.bridge, window.remote, window.chat
    side.switch.port = 0
    set_sampling(window, temperature=0, max_tokens=256)
    with qtbot.waitSignal(chat.answer_finished, timeout=120_000):
        assert chat.send(QUESTION)
        assert chat.generating  # pressed while the answer streams
        side.serve_action.setChecked(True)
        assert "answer is being written" in window.notifier.last_message
        assert not side.serve_action.isChecked()
        assert not side.switch.running
        chat.stop()
    assert bridge.loaded is not None  # the window kept its model

    bridge.tuning = True  # as Tune sets it while it measures on the window's engine
    try:
        side.serve_action.setChecked(True)
    finally:
        bridge.tuning = False
    assert "Tune is measuring" in window.notifier.last_message
    assert not side.serve_action.isChecked()
    assert not side.switch.running
    assert bridge.loaded is not None


def test_a_server_that_cannot_start_gives_the_model_back(
    qtbot: QtBot, make_window: object, tiny_target: Path,
) -> None:
    window = make_window(folders=(tiny_target.parent,))  # type: ignore[operator]
    load_pair(qtbot, window, tiny_target, ngram=2)
    bridge, side = window.bridge, window.remote
    load = bridge.last_load
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        side.switch.port = taken.getsockname()[1]
        with qtbot.waitSignal(side.switch.failed, timeout=LOAD_TIMEOUT_MS), \
                qtbot.waitSignal(bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
            side.serve_action.setChecked(True)
    assert not side.switch.running
    assert not side.serve_action.isChecked()
    assert bridge.last_load == load
    assert chat_engine_is_local(window)


def chat_engine_is_local(window: object) -> bool:
    return window.chat.bridge is window.bridge  # type: ignore[attr-defined]


def test_loading_here_while_serving_is_refused_and_closing_the_window_loads_nothing_back(
    qtbot: QtBot, make_window: object, tiny_target: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    window = make_window(folders=(tiny_target.parent,))  # type: ignore[operator]
    load_pair(qtbot, window, tiny_target, ngram=2)
    bridge, side = window.bridge, window.remote
    side.switch.port = 0
    with qtbot.waitSignal(side.switch.started, timeout=LOAD_TIMEOUT_MS):
        side.serve_action.setChecked(True)
    loads: list[object] = []
    monkeypatch.setattr(bridge, "load", loads.append)
    assert window.picker.request_load()  # Load pressed while serving: refused, the server keeps the one copy
    assert "stop it" in window.notifier.last_message
    window.close()
    assert not side.switch.running
    assert loads == []


def test_a_server_whose_engine_cannot_load_the_model_stops_and_says_why(
    qtbot: QtBot, tmp_path: Path, specdeck_home: Path,
) -> None:
    from app.params import LoadSettings
    from ui.remote.server_switch import ServerSwitch

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # a header cut short: the engine refuses it, the HTTP side is up
    switch = ServerSwitch(port=0)
    with qtbot.waitSignal(switch.started, timeout=LOAD_TIMEOUT_MS) as started, \
            qtbot.waitSignal(switch.failed, timeout=LOAD_TIMEOUT_MS) as failed:
        switch.start(LoadSettings(target_path=str(broken)))
    assert started.args[0] == switch.last_url
    assert failed.args[0].startswith("The server stopped: it could not load the model (")
    assert not switch.running
    with pytest.raises(httpx.TransportError):  # not a server left answering 503 for ever
        httpx.get(switch.last_url + "/health", timeout=5)
