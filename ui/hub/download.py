"""One download at a time into the models folder (``app.hub.transfer.pull``) on a worker of its own, shown as a
progress bar with the rate and the time left. Cancel stops it before the next chunk is written and keeps the
partial file, which the next download of the same model resumes."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget

from app.hub.files import ModelFiles
from app.hub.pending import on_disk
from app.hub.transfer import Progress, Pulled, pull
from app.units import format_bytes
from ui.hub.results import error_text, eta_text
from ui.tasks import TaskRunner

PROGRESS_EVERY_S = 0.1  # a chunk arrives every few ms: the bar is repainted ten times a second, not per chunk
BAR_STEPS = 1000


class _ProgressRelay(QObject):
    """Lives on the GUI thread: the download's worker emits through it, and the progress arrives queued."""

    progress = Signal(object)  # Progress


class DownloadBar(QWidget):
    finished = Signal(str, object, object)  # repo, ModelFiles, Pulled
    # repo, ModelFiles, the sentence, and what is on disk now: (every part in place, bytes), None if unknown
    failed = Signal(str, object, str, object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._tasks = TaskRunner(self, max_threads=1)
        self.downloading: tuple[str, ModelFiles] | None = None
        self._stop = threading.Event()
        self.last_progress: Progress | None = None
        self._relay = _ProgressRelay(self)
        self._relay.progress.connect(self._on_relay_progress)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.progress_bar = QProgressBar(self)
        self.progress_bar.setRange(0, BAR_STEPS)
        self.progress_bar.setFormat("%p%")
        self.rate_label = QLabel(self)
        self.rate_label.setTextFormat(Qt.TextFormat.PlainText)  # a file name from the Hub: never markup
        self.rate_label.setWordWrap(True)
        self.rate_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        row.addWidget(self.progress_bar, 2)
        row.addWidget(self.rate_label, 3)
        self.setVisible(False)  # until the first download

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self, repo: str, group: ModelFiles, revision: str = "main") -> bool:
        if self.downloading is not None:
            return False
        self.downloading = (repo, group)
        self._stop.clear()
        self.last_progress = None
        self.progress_bar.setValue(0)
        self.progress_bar.setFormat("%p%")
        self.rate_label.setText(f"Starting {group.label}…")
        self.setVisible(True)
        relay, stop = self._relay, self._stop
        last = [0.0]

        def report(p: Progress) -> None:  # on the worker, after every chunk
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or p.done >= p.total:
                last[0] = now
                relay.progress.emit(p)

        self._tasks.run(lambda: pull(repo, group, revision=revision, progress=report, stop=stop.is_set),
                        lambda done: self._on_pulled(repo, group, done),
                        lambda exc: self._on_pull_failed(repo, group, exc))
        return True

    def cancel(self) -> None:
        """Ask the download to stop before its next chunk; the partial file stays for the next one."""
        if self.downloading is not None:
            self._stop.set()
            self.rate_label.setText("Stopping the download…")

    @Slot(object)
    def _on_relay_progress(self, p: Progress) -> None:
        if self.downloading is None:
            return
        self.last_progress = p
        self.progress_bar.setValue(int(BAR_STEPS * p.done / p.total) if p.total else BAR_STEPS)
        self.progress_bar.setFormat(f"%p%  {format_bytes(p.done)} of {format_bytes(p.total)}")
        self.rate_label.setText(f"{p.file}: {format_bytes(p.rate)}/s, {eta_text(p.eta)}")

    def _on_pulled(self, repo: str, group: ModelFiles, done: Pulled) -> None:
        self.downloading = None
        self.progress_bar.setValue(BAR_STEPS)
        self.progress_bar.setFormat(f"%p%  {format_bytes(group.size)}")
        self.rate_label.setText("")
        self.finished.emit(repo, group, done)

    def _on_pull_failed(self, repo: str, group: ModelFiles, exc: Exception) -> None:
        message = error_text(exc)
        self.rate_label.setText("")
        if self.last_progress is None:
            self.setVisible(False)
        # What is on disk now (a stop or a dropped connection keeps the partial file, a bad checksum deletes it)
        # is looked at again, so the view can say whether the next download resumes.
        self._tasks.run(lambda: on_disk(repo, group),
                        lambda state: self._after_failure(repo, group, message, state),
                        lambda _exc: self._after_failure(repo, group, message, None))

    def _after_failure(self, repo: str, group: ModelFiles, message: str, state: tuple[bool, int] | None) -> None:
        self.downloading = None
        self._stop.clear()
        self.failed.emit(repo, group, message, state)

    def shutdown(self, msecs: int = 30_000) -> None:
        """Stop a download (its partial file stays) and wait for the worker."""
        self._stop.set()
        self._tasks.wait(msecs)
