"""View → Log: the app's own log records and the engine's (llama.cpp's) lines, newest last, as plain text.

Records from any thread reach the window through a queued signal; the view keeps the last MAX_LINES.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QDialog, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.events import Log

MAX_LINES = 5000
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
