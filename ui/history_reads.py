"""History reads handed to the GUI thread when they are done, so the GUI thread never waits for one.

The window's history runs on its writer thread (``app.storage.history_writer.HistoryThread``): a read queues
behind the writes before it, an fsync'd commit among them. Waiting there for its result held painting and
input; instead the read's Future is given to :class:`ReadDelivery`, which calls back on the GUI thread (a
queued signal) once the result is there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import TypeVar

from PySide6.QtCore import QObject, Signal, Slot

T = TypeVar("T")


def read_now(read: Callable[[], T]) -> Future[T]:
    """A read run here, as a finished Future: a store without a writer thread (a test's) answers at once."""
    future: Future[T] = Future()
    try:
        future.set_result(read())
    except Exception as exc:  # handed to the failure callback, as the writer thread's would be
        future.set_exception(exc)
    return future


class ReadDelivery(QObject):
    """Create it on the GUI thread: the callbacks given to :meth:`deliver` run there."""

    _arrived = Signal(object)  # a Callable[[], None]: a callback bound to its result, emitted on the writer thread

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._arrived.connect(self._on_arrived)

    def deliver(self, future: Future[T], done: Callable[[T], None],
                failed: Callable[[BaseException], None]) -> None:
        """``done(result)`` or ``failed(exception)`` on the GUI thread, once ``future`` is done (at once when it
        already is)."""

        def hand_over(finished: Future[T]) -> None:
            exc = finished.exception()
            call = partial(failed, exc) if exc is not None else partial(done, finished.result())
            with contextlib.suppress(RuntimeError):  # the receiver is gone (the window closed meanwhile)
                self._arrived.emit(call)

        future.add_done_callback(hand_over)

    @Slot(object)
    def _on_arrived(self, call: Callable[[], None]) -> None:
        call()
