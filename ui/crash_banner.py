"""The banner above the chat when the engine stopped: what happened, its last log lines, and Restart."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.engine.supervisor import gave_up_sentence, may_restart
from app.events import EngineCrashed


class CrashBanner(QFrame):
    """What happened to the engine, its last log lines, and a Restart button."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setObjectName("crash_banner")
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.headline = QLabel(self)
        self.headline.setWordWrap(True)
        self.headline.setTextFormat(Qt.TextFormat.PlainText)
        row.addWidget(self.headline, 1)
        self.details_button = QPushButton("Details", self)
        self.details_button.setCheckable(True)
        self.restart_button = QPushButton("Restart engine", self)
        self.dismiss_button = QPushButton("Dismiss", self)
        for b in (self.details_button, self.restart_button, self.dismiss_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.details = QPlainTextEdit(self)
        self.details.setReadOnly(True)
        self.details.setMaximumHeight(160)
        self.details.setVisible(False)
        layout.addWidget(self.details)
        self.details_button.toggled.connect(self.details.setVisible)
        self.dismiss_button.clicked.connect(self.hide)
        self.hide()

    def show_crash(self, event: EngineCrashed, crashes_on_load: int, restarting: bool) -> None:
        how = (f"killed by {event.signal_name}" if event.signal_name
               else f"exit status {event.exit_code}" if event.exit_code is not None else "unknown exit")
        text = f"The engine stopped ({how}, while {event.during}). {event.message}"
        if not may_restart(crashes_on_load):
            text += f" {gave_up_sentence(crashes_on_load)} Then press Restart."
        elif restarting:
            text += " Restarting it and reloading the models…"
        self.headline.setText(text)
        self.details.setPlainText("\n".join(event.last_log_lines) or "(the engine logged nothing)")
        self.show()
