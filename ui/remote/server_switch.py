"""The window's Server switch: `specdeck serve` on the loaded model, from inside the window.

The server runs its own engine worker with the window's whole load settings, on 127.0.0.1 only; the window
unloads its own copy first (``ui.remote.window_side``), so the models are held once; a server whose engine
cannot load them is stopped, so the window gets them back at once. Its requests are saved
to the history marked as API requests, but for the window's own chat through it (``own_headers``), which the
window saves itself; the remote dashboard watches it, so served requests show live.
"""

from __future__ import annotations

import secrets

from PySide6.QtCore import QObject, Signal

from app.params import LoadSettings
from app.paths import data_dir
from app.serve.metrics import ServeMetrics
from app.serve.runner import EngineRunner
from app.serve.server import CLIENT_SAVES_HEADER, DEFAULT_PORT, ServeOptions, Server
from app.storage.history import FILE_NAME


class ServerSwitch(QObject):
    started = Signal(str)  # base URL
    stopped = Signal()
    failed = Signal(str)
    _engine_unusable = Signal(str)  # emitted on the server's engine thread, handled on the GUI thread

    def __init__(self, parent: QObject | None = None, port: int = DEFAULT_PORT) -> None:
        super().__init__(parent)
        self._engine_unusable.connect(self._on_engine_unusable)
        self.port = port
        self.server: Server | None = None
        self.last_url = ""  # the base URL of the server started last
        self._token = ""  # what the window's own requests carry so that the server does not save them too

    @property
    def running(self) -> bool:
        return self.server is not None

    def own_headers(self, base_url: str) -> dict[str, str]:
        """The headers of the window's own requests to ``base_url``: none unless it is this running server."""
        if self.server is None or base_url != self.last_url:
            return {}
        return {CLIENT_SAVES_HEADER: self._token}

    def start(self, settings: LoadSettings | None) -> None:
        if self.server is not None:
            return
        if settings is None:
            self.failed.emit("Load a model first: the server serves the loaded model.")
            return
        metrics = ServeMetrics()
        runner = EngineRunner(settings, metrics, history_path=data_dir() / FILE_NAME,
                              on_unusable=self._engine_unusable.emit)
        token = secrets.token_urlsafe(16)
        server = Server(runner, metrics, ServeOptions(host="127.0.0.1", port=self.port, client_saves_token=token))
        try:
            server.start_in_thread()
        except (OSError, TimeoutError) as exc:
            server.stop()
            self.failed.emit(f"The server could not start: {exc}")
            return
        self.server = server
        self._token = token
        self.last_url = server.base_url
        self.started.emit(server.base_url)

    def _on_engine_unusable(self, message: str) -> None:
        """The server is up but its engine could not load the model: a server that can only answer 503 is stopped,
        and the window is told why (it then loads its own copy back)."""
        if self.server is None:
            return
        server, self.server = self.server, None
        server.stop()
        self.failed.emit(f"The server stopped: it could not load the model ({message.rstrip('.')}).")

    def stop(self) -> None:
        if self.server is None:
            return
        server, self.server = self.server, None
        server.stop()
        self.stopped.emit()
