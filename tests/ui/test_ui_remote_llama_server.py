"""The window on a real llama-server (built by packaging/build_llama_server) on 127.0.0.1 with --metrics and
n-gram speculation: its model in the picker, the chat through it, and the Remote engine dock's tok/s and
acceptance from the server's counters around that answer; what llama-server does not expose reads "not
reported by this server". Skipped, with the reason, where the binary has not been built."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.events import MessageStats
from app.remote.scrape import NOT_REPORTED
from tests.app.test_remote_llama_server import PROMPT, llama_server, llama_server_plain  # noqa: F401  (fixtures)
from tests.ui.conftest import set_sampling

pytestmark = pytest.mark.llama_server


def test_window_chats_through_llama_server_and_the_dock_plots_it(qtbot: QtBot, make_window: object,
                                                                 llama_server: str,  # noqa: F811
                                                                 tiny_target: Path) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    picker, chat, side = window.picker, window.chat, window.remote
    side.connect_to(llama_server)
    qtbot.waitUntil(lambda: bool(picker.remote_models), timeout=30_000)
    dock = side.dashboard
    assert "llama-server" in dock.header.text()
    model = picker.remote_models[0]
    assert picker.target_combo.itemText(picker.target_combo.count() - 1).endswith(
        "— remote, " + llama_server.removeprefix("http://"))
    assert picker.select_remote(model)
    assert not picker.drafter_combo.isEnabled()

    dock.timer.stop()  # one reading before the answer and one after: the interval holds all of it
    qtbot.waitUntil(lambda: not dock.reading, timeout=15_000)
    dock.read_now()
    qtbot.waitUntil(lambda: not dock.reading, timeout=15_000)
    set_sampling(window, temperature=0, max_tokens=64)
    with qtbot.waitSignal(chat.answer_finished, timeout=120_000) as finished:
        assert chat.send(PROMPT)
    answer = finished.args[0]
    assert answer.status == "complete", answer.text
    assert isinstance(answer.stats, MessageStats)
    dock.read_now()
    qtbot.waitUntil(lambda: not dock.reading, timeout=15_000)
    figures = dock.latest
    assert figures is not None
    assert figures.tokens_per_second is not None
    assert figures.tokens_per_second > 0
    assert dock.values["tokens_per_second"].text() == f"{figures.tokens_per_second:.1f}"
    assert len(dock.tps_curve.getData()[1]) >= 1  # plotted
    if answer.stats.drafted:  # the stream's own counts are the server's counter deltas
        assert figures.acceptance == answer.stats.accepted / answer.stats.drafted
        assert dock.values["acceptance"].text() == f"{figures.acceptance:.0%}"
    for key in ("read_bytes_per_second", "plain_tokens_per_second"):  # llama-server has neither
        assert dock.values[key].text() == NOT_REPORTED
    assert "/slots" in dock.sources.text()  # KV use estimated from /slots: there is no KV metric


def test_dock_on_a_llama_server_without_speculation(qtbot: QtBot, make_window: object,
                                                    llama_server_plain: str) -> None:  # noqa: F811
    window = make_window(start_engine=False)  # type: ignore[operator]
    side = window.remote
    side.connect_to(llama_server_plain)
    dock = side.dashboard
    qtbot.waitUntil(lambda: dock.latest is not None, timeout=30_000)
    assert "off (its /slots say so)" in dock.header.text()
    for key in ("acceptance", "mean_accepted_length"):
        assert dock.values[key].text() == "speculation is off on this server"
    assert dock.values["plain_tokens_per_second"].text() == NOT_REPORTED
