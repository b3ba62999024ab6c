"""Run blocking work (disk scans, downloads, probes, file writes) off the GUI thread and get the result back
as a signal. The one mechanism for background work in ``ui/`` besides the engine bridge's reader thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot


class _TaskSignals(QObject):
    done = Signal(object)
    failed = Signal(Exception)


class _Runnable(QRunnable):
    def __init__(self, fn: Callable[[], Any], signals: _TaskSignals) -> None:
        super().__init__()
        self.fn = fn
        self.signals = signals

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as exc:
            self.signals.failed.emit(exc)
        else:
            self.signals.done.emit(result)


class TaskRunner(QObject):
    """Owns a small thread pool; ``wait()`` before the app exits so no thread outlives the window."""

    def __init__(self, parent: QObject | None = None, *, max_threads: int = 2) -> None:
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)  # 1: tasks run one at a time, in the order given
        self._live: set[_TaskSignals] = set()

    def run(
        self,
        fn: Callable[[], Any],
        on_done: Callable[[Any], None],
        on_failed: Callable[[Exception], None],
    ) -> None:
        signals = _TaskSignals(self)  # lives on the GUI thread: its signals arrive there, queued
        self._live.add(signals)

        @Slot(object)
        def done(result: Any) -> None:
            self._forget(signals)
            on_done(result)

        @Slot(Exception)
        def failed(exc: Exception) -> None:
            self._forget(signals)
            on_failed(exc)

        signals.done.connect(done)
        signals.failed.connect(failed)
        self.pool.start(_Runnable(fn, signals))

    def _forget(self, signals: _TaskSignals) -> None:
        self._live.discard(signals)
        signals.deleteLater()

    @property
    def busy(self) -> bool:
        return bool(self._live)

    def wait(self, msecs: int = 30_000) -> bool:
        return bool(self.pool.waitForDone(msecs))
