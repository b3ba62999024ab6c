"""The window's Server switch: it serves the loaded model, the Remote engine dock watches it live, and a
request through the real HTTP API shows up there with the answer's own acceptance, and in the history
marked as an API request."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pytestqt.qtbot import QtBot

from app.storage.history import HistoryStore
from tests.ui.conftest import load_pair

PROMPT = "abc abc abc abc abc abc abc abc abc abc abc abc"


def test_server_switch_serves_the_loaded_model_and_the_dock_watches_it(
    qtbot: QtBot, make_window: object, tiny_target: Path, specdeck_home: Path
) -> None:
    window = make_window(folders=(tiny_target.parent,))  # type: ignore[operator]
    load_pair(qtbot, window, tiny_target, ngram=2)
    side = window.remote
    side.switch.port = 0  # any free port: tests may run beside a real server
    with qtbot.waitSignal(side.switch.started, timeout=30_000) as started:
        side.serve_action.setChecked(True)
    url = started.args[0]
    qtbot.waitUntil(lambda: side.dashboard.info is not None and not side.dock.isHidden(), timeout=30_000)
    assert "SpecDeck" in side.dashboard.header.text()
    assert tiny_target.name in side.dashboard.header.text()

    # /health is 503 until the server's own engine has loaded the model.
    qtbot.waitUntil(lambda: httpx.get(url + "/health").status_code == 200, timeout=60_000)
    # One reading just before the request and one just after, so the interval holds the whole answer
    # (the timer's own readings could split it).
    dock = side.dashboard
    dock.timer.stop()
    qtbot.waitUntil(lambda: not dock.reading, timeout=15_000)
    dock.read_now()
    qtbot.waitUntil(lambda: not dock.reading, timeout=15_000)
    answer = httpx.post(url + "/v1/chat/completions", timeout=120,
                        json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48,
                              "temperature": 0}).json()
    dock.read_now()
    qtbot.waitUntil(lambda: not dock.reading, timeout=15_000)
    stats, timings = answer["stats"], answer["timings"]
    assert stats["total_draft_tokens_count"] > 0
    figures = dock.latest
    assert figures is not None
    # The dock's acceptance and tok/s, from the server's counter deltas, are the answer's own.
    assert figures.acceptance == stats["accepted_draft_tokens_count"] / stats["total_draft_tokens_count"]
    assert figures.tokens_per_second == pytest.approx(timings["predicted_per_second"], rel=1e-9)
    assert dock.values["acceptance"].text() == f"{figures.acceptance:.0%}"
    assert dock.values["tokens_per_second"].text() == f"{figures.tokens_per_second:.1f}"

    side.serve_action.setChecked(False)
    assert not side.switch.running
    with HistoryStore(specdeck_home / "data" / "history.sqlite3") as store:
        api = [c for c in store.list_chats() if c.origin == "api"]
    assert len(api) == 1
    assert api[0].title == PROMPT


def test_serving_needs_a_loaded_model(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    side = window.remote
    with qtbot.waitSignal(side.switch.failed, timeout=5_000) as failed:
        side.serve_action.setChecked(True)
    assert "Load a model first" in failed.args[0]
    assert not side.serve_action.isChecked()
    assert not side.switch.running
