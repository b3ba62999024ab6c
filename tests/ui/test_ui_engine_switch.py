"""The chat switches between the window's own engine and a server's model (SpecDeck's own real server,
`specdeck serve` on 127.0.0.1) and back: each answer comes from the engine chosen at the time, and the engine
switched away from no longer reaches the chat."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.events import Finished
from app.serve.server import Server
from app.storage.history import HistoryStore
from tests.ui.conftest import load_pair, set_sampling
from tests.ui.test_dashboard import make_finished
from ui.chat.message import ChatMessage

PROMPT = "abc abc abc abc abc abc abc abc abc abc abc abc"
INTRUDER = "sent by the engine the chat left"


def _served_answers(tmp_path: Path) -> int:
    """Requests the server answered: it writes each to its own history as a chat of its own."""
    with HistoryStore(tmp_path / "served.sqlite3", check_damage=False) as store:
        return len(store.list_chats())


def _ask(qtbot: QtBot, chat: object, text: str, old_engine: object = None) -> ChatMessage:
    """Send ``text`` and wait for the answer. ``old_engine``: the engine the chat switched away from says, while
    the answer waits to start, that it started and finished one of its own, which the chat must not take."""
    with qtbot.waitSignal(chat.answer_finished, timeout=120_000) as finished:  # type: ignore[attr-defined]
        assert chat.send(text)  # type: ignore[attr-defined]
        if old_engine is not None:
            request_id = 7
            old_engine.generation_started.emit(request_id)  # type: ignore[attr-defined]
            done = make_finished(request_id)
            old_engine.generation_finished.emit(  # type: ignore[attr-defined]
                Finished(request_id, "eog", done.stats, INTRUDER))
    answer = finished.args[0]
    assert isinstance(answer, ChatMessage)
    assert answer.status == "complete", answer.text
    assert answer.text != INTRUDER
    return answer


def test_the_chat_switches_between_the_local_engine_and_a_server_and_back(
    qtbot: QtBot, make_window, tiny_target: Path, served: Server, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    picker, chat, side = window.picker, window.chat, window.remote
    local = window.bridge
    local_path = local.loaded.target.path
    where = served.base_url.removeprefix("http://")
    set_sampling(window, temperature=0, max_tokens=16)

    # The window's own engine answers; the server is not asked.
    assert chat.bridge is local
    answer = _ask(qtbot, chat, PROMPT)
    assert answer.model == local_path
    assert _served_answers(tmp_path) == 0

    # A server's model chosen: the server answers, and the window's engine no longer reaches the chat.
    side.connect_to(served.base_url)
    qtbot.waitUntil(lambda: bool(picker.remote_models), timeout=30_000)
    assert picker.select_remote(picker.remote_models[0])
    route = side.route
    assert route is not None
    assert chat.bridge is route
    answer = _ask(qtbot, chat, PROMPT, old_engine=local)
    assert answer.model == f"{tiny_target.name} (remote, {where})"
    assert _served_answers(tmp_path) == 1

    # The local model chosen again: the window's engine answers, and the server's route no longer reaches it.
    assert picker.select_target(tiny_target)
    assert side.route is None
    assert chat.bridge is local
    answer = _ask(qtbot, chat, PROMPT, old_engine=route)
    assert answer.model == local_path
    assert _served_answers(tmp_path) == 1
    assert [m.model for m in chat.messages if m.role == "assistant"] == [
        local_path, f"{tiny_target.name} (remote, {where})", local_path]
