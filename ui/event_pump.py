"""Events from worker threads to the GUI thread: pushed from any thread, emitted on the GUI thread by a
timer, with the tokens of one request merged (``coalesce``) and under a time budget per tick, so a backlog of
tokens never holds up input. The window's engine bridge and its remote route use the same pump."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Slot

from app.events import PassStats, Token

PAINT_INTERVAL_MS = 33  # ~30 Hz
DRAIN_BUDGET_SECONDS = 0.015  # leave the rest of a backlog for the next tick, so input stays responsive


def merge_tokens(first: Token, second: Token) -> Token:
    """Two Token events of one request as one (text, ids, sources and pieces concatenated)."""
    return Token(
        request_id=first.request_id,
        text=first.text + second.text,
        token_ids=first.token_ids + second.token_ids,
        sources=first.sources + second.sources,
        pieces=first.pieces + second.pieces,
    )


def coalesce(events: list[Any]) -> list[Any]:
    """Tokens of one request merged into one, across the PassStats between them (those keep their order);
    any other event (Finished, errors, ...) closes the run, so nothing moves past it."""
    out: list[Any] = []
    open_token: int | None = None  # index in out of the Token that later tokens merge into
    for event in events:
        if isinstance(event, Token):
            if open_token is not None and out[open_token].request_id == event.request_id:
                out[open_token] = merge_tokens(out[open_token], event)
                continue
            open_token = len(out)
        elif not isinstance(event, PassStats):
            open_token = None
        out.append(event)
    return out


class EventPump(QObject):
    """``push`` from any thread; ``emit`` is called on the GUI thread with each item, in order."""

    def __init__(self, emit: Callable[[Any], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._emit = emit
        self._pending: deque[Any] = deque()
        self._lock = threading.Lock()
        self._timer = QTimer(self)
        self._timer.setInterval(PAINT_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)

    def push(self, item: Any) -> None:
        with self._lock:
            self._pending.append(item)

    def start(self) -> None:
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def drain(self) -> None:
        """Emit what was pushed, merged, until the tick's budget is spent; the rest waits for the next tick."""
        with self._lock:
            items = list(self._pending)
            self._pending.clear()
        if not items:
            return
        items = coalesce(items)
        deadline = time.perf_counter() + DRAIN_BUDGET_SECONDS
        for index, item in enumerate(items):
            self._emit(item)
            if time.perf_counter() > deadline and index + 1 < len(items):
                with self._lock:
                    self._pending.extendleft(reversed(items[index + 1:]))
                return

    @Slot()
    def _on_timer_timeout(self) -> None:
        self.drain()
