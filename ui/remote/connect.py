"""Model → Connect to server…: ask for a base URL and an optional API key, discover off the GUI thread,
then hand the engine to the remote dashboard."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLineEdit, QWidget

from app.remote.client import RemoteEngine, RemoteInfo
from ui.tasks import TaskRunner

DEFAULT_URL = "http://127.0.0.1:8080"


class ConnectDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, url: str = DEFAULT_URL) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        form = QFormLayout(self)
        self.url = QLineEdit(url, self)
        self.url.setPlaceholderText("http://host:port (llama-server, vLLM, SGLang or specdeck serve)")
        # Wide enough for the whole placeholder and a typical URL: the start was cut off ("ttp://…").
        self.url.setMinimumWidth(self.url.fontMetrics().horizontalAdvance(self.url.placeholderText()) + 24)
        self.key = QLineEdit(self)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("optional")
        form.addRow("Server URL", self.url)
        form.addRow("API key", self.key)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel,
                                   parent=self)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)


def connect_in_background(tasks: TaskRunner, url: str, key: str | None,
                          on_done: Callable[[RemoteEngine, RemoteInfo], None],
                          on_failed: Callable[[Exception], None]) -> None:
    """Discover the server off the GUI thread; a bad URL or a dead server arrives as ``on_failed``."""

    def discover() -> tuple[RemoteEngine, RemoteInfo]:
        engine = RemoteEngine(url, key or None)
        try:
            return engine, engine.discover()
        except Exception:
            engine.close()
            raise

    tasks.run(discover, lambda result: on_done(*result), on_failed)
