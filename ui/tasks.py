"""Run blocking work (disk scans, downloads, probes, file writes) off the GUI thread and get the result back
as a signal. The one mechanism for background work in ``ui/`` besides the engine bridge's reader thread."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot


class _TaskSignals(QObject):
    """One per TaskRunner, made once and owned by it: tasks report through it by id, so no per-task Qt
    object has to outlive (or be deleted under) a queued signal."""

    done = Signal(int, object)
    failed = Signal(int, Exception)


class _Runnable(QRunnable):
    def __init__(self, task_id: int, fn: Callable[[], Any], signals: _TaskSignals) -> None:
        super().__init__()
        self.task_id = task_id
        self.fn = fn
        self.signals = signals

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as exc:
            self.signals.failed.emit(self.task_id, exc)
        else:
            self.signals.done.emit(self.task_id, result)


class TaskRunner(QObject):
    """Owns a small thread pool; ``wait()`` before the app exits so no thread outlives the window."""

    def __init__(self, parent: QObject | None = None, *, max_threads: int = 2) -> None:
        super().__init__(parent)
        # The pool first: children are deleted in order, so the pool waits for its tasks before the
        # signals object they emit through goes.
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)  # 1: tasks run one at a time, in the order given
        self._signals = _TaskSignals(self)  # lives on the GUI thread: its signals arrive there, queued
        self._signals.done.connect(self._on_signals_done)
        self._signals.failed.connect(self._on_signals_failed)
        self._ids = itertools.count(1)
        self._live: dict[int, tuple[Callable[[Any], None], Callable[[Exception], None]]] = {}

    def run(
        self,
        fn: Callable[[], Any],
        on_done: Callable[[Any], None],
        on_failed: Callable[[Exception], None],
    ) -> None:
        task_id = next(self._ids)
        self._live[task_id] = (on_done, on_failed)
        self.pool.start(_Runnable(task_id, fn, self._signals))

    @Slot(int, object)
    def _on_signals_done(self, task_id: int, result: Any) -> None:
        callbacks = self._live.pop(task_id, None)
        if callbacks is not None:
            callbacks[0](result)

    @Slot(int, Exception)
    def _on_signals_failed(self, task_id: int, exc: Exception) -> None:
        callbacks = self._live.pop(task_id, None)
        if callbacks is not None:
            callbacks[1](exc)

    @property
    def busy(self) -> bool:
        return bool(self._live)

    def wait(self, msecs: int = 30_000) -> bool:
        return bool(self.pool.waitForDone(msecs))
