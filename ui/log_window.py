"""View → Log: the app's own log records and the engine's (llama.cpp's) lines, newest last, as plain text.

Records from any thread reach the window through a queued signal; the view keeps the last MAX_LINES.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QFontDatabase, QHideEvent, QShowEvent
from PySide6.QtWidgets import QDialog, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.events import Log

MAX_LINES = 5000
ENGINE_FILE_MS = 1000  # while the window is open, the engine's log file is read for new lines this often
ENGINE_FILE_CHUNK = 64 * 1024  # at most this much of it per read (the first read: its last part)
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Relay(QObject):
    line = Signal(str)


class QtLogHandler(logging.Handler):
    """A logging handler that hands formatted records to the GUI thread."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.relay = _Relay()
        self.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.relay.line.emit(self.format(record))
        except Exception:  # a log record must never break the code that logged it
            self.handleError(record)


class LogWindow(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("SpecDeck log")
        self.resize(820, 420)
        self.view = QPlainTextEdit(self)
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        clear = QPushButton("Clear", self)
        clear.clicked.connect(self.view.clear)
        close = QPushButton("Close", self)
        close.clicked.connect(self.hide)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(clear)
        buttons.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view)
        layout.addLayout(buttons)
        self.handler = QtLogHandler()
        self.handler.relay.line.connect(self.append_line, Qt.ConnectionType.QueuedConnection)
        logging.getLogger().addHandler(self.handler)
        # llama.cpp writes to the engine worker's log file, not through the pipe: its lines are read from there.
        self._engine_file: Callable[[], Path | None] = lambda: None
        self._file_path: Path | None = None
        self._file_offset = 0
        self._file_rest = b""
        self._file_timer = QTimer(self)
        self._file_timer.setInterval(ENGINE_FILE_MS)
        self._file_timer.timeout.connect(self.read_engine_file)

    def follow_engine_file(self, path_of: Callable[[], Path | None]) -> None:
        """Show the lines of the file ``path_of()`` names (the current engine worker's log) while open."""
        self._engine_file = path_of

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.read_engine_file()
        self._file_timer.start()

    def hideEvent(self, event: QHideEvent) -> None:
        self._file_timer.stop()
        super().hideEvent(event)

    @Slot()
    def read_engine_file(self) -> None:
        path = self._engine_file()
        if path is None:
            return
        try:
            with path.open("rb") as fh:
                if path != self._file_path:  # a new worker (a restart): its file from near its end
                    self._file_path, self._file_rest = path, b""
                    self._file_offset = max(0, fh.seek(0, 2) - ENGINE_FILE_CHUNK)
                fh.seek(self._file_offset)
                data = fh.read(ENGINE_FILE_CHUNK)
        except OSError:
            return  # not written yet, or pruned: nothing to show
        self._file_offset += len(data)
        *lines, self._file_rest = (self._file_rest + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", errors="replace").rstrip()
            if text:
                self.view.appendPlainText(f"llama.cpp: {text}")

    def detach(self) -> None:
        logging.getLogger().removeHandler(self.handler)

    @Slot(str)
    def append_line(self, line: str) -> None:
        self.view.appendPlainText(line)

    @Slot(Log)
    def append_engine_line(self, event: Log) -> None:
        self.view.appendPlainText(f"engine: {event.line.rstrip()}")

    def text(self) -> str:
        return self.view.toPlainText()
