"""The window's Server switch: `specdeck serve` on the loaded model, from inside the window.

The server runs its own engine worker with the loaded model's settings (the window's worker stays the
chat's), on 127.0.0.1 only. Its requests are saved to the history marked as API requests, and the remote
dashboard watches it, so served requests show live.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.params import LoadSettings
from app.paths import data_dir
from app.serve.metrics import ServeMetrics
from app.serve.runner import EngineRunner
from app.serve.server import DEFAULT_PORT, ServeOptions, Server
from app.storage.history import FILE_NAME


class ServerSwitch(QObject):
    started = Signal(str)  # base URL
    stopped = Signal()
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None, port: int = DEFAULT_PORT) -> None:
        super().__init__(parent)
        self.port = port
        self.server: Server | None = None
        self.last_url = ""  # the base URL of the server started last

    @property
    def running(self) -> bool:
        return self.server is not None

    def start(self, settings: LoadSettings | None) -> None:
        if self.server is not None:
            return
        if settings is None:
            self.failed.emit("Load a model first: the server serves the loaded model.")
            return
        metrics = ServeMetrics()
        runner = EngineRunner(settings, metrics, history_path=data_dir() / FILE_NAME)
        server = Server(runner, metrics, ServeOptions(host="127.0.0.1", port=self.port))
        try:
            server.start_in_thread()
        except (OSError, TimeoutError) as exc:
            server.stop()
            self.failed.emit(f"The server could not start: {exc}")
            return
        self.server = server
        self.last_url = server.base_url
        self.started.emit(server.base_url)

    def stop(self) -> None:
        if self.server is None:
            return
        server, self.server = self.server, None
        server.stop()
        self.stopped.emit()
