"""The one event pump (worker thread → GUI thread) of the engine bridge and the remote route: order kept,
one request's tokens merged, and a tick that runs past its budget leaves the rest for the next tick."""

from __future__ import annotations

import threading
import time
from typing import Any

from pytestqt.qtbot import QtBot

from app.events import Finished, Token
from ui.event_pump import DRAIN_BUDGET_SECONDS, EventPump


def _token(text: str) -> Token:
    return Token(1, text, (len(text),), ("target",), (text,))


def test_items_pushed_from_a_thread_arrive_merged_and_in_order(qtbot: QtBot) -> None:
    got: list[Any] = []
    pump = EventPump(got.append)
    pushing = threading.Thread(target=lambda: [pump.push(_token(c)) for c in "abc"] + [pump.push("end")])
    pushing.start()
    pushing.join()
    pump.drain()
    assert [g.text if isinstance(g, Token) else g for g in got] == ["abc", "end"]


def test_a_slow_tick_leaves_the_rest_for_the_next(qtbot: QtBot) -> None:
    got: list[Any] = []

    def slow(item: Any) -> None:
        got.append(item)
        time.sleep(DRAIN_BUDGET_SECONDS * 1.5)  # each emit alone outlasts the tick's budget

    pump = EventPump(slow)
    ends = [Finished(i, "eog", None, "") for i in range(4)]  # type: ignore[arg-type]
    for end in ends:
        pump.push(end)
    pump.drain()
    assert got == ends[:1]
    pump.start()  # the timer drains the rest, in order
    qtbot.waitUntil(lambda: len(got) == len(ends), timeout=5_000)
    pump.stop()
    assert got == ends
