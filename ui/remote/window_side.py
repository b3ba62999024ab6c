"""What the main window gets for serving and remote engines, wired in one place so its own edits stay small:
a "Remote engine" dock with the remote dashboard, Model → Connect to server…, and Model → Serve the loaded
model (the Server switch), whose requests the dock then watches live."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QDockWidget, QMainWindow, QMenu

from app.serve.remote import RemoteEngine, RemoteInfo
from ui.remote.connect import ConnectDialog, connect_in_background
from ui.remote.panel import RemoteDashboard
from ui.remote.server_switch import ServerSwitch
from ui.tasks import TaskRunner


class RemoteSide(QObject):
    def __init__(self, window: QMainWindow, menu: QMenu, connect_action: QAction, tasks: TaskRunner,
                 notifier: Any, last_load: Any) -> None:
        super().__init__(window)
        self.window = window
        self.tasks = tasks
        self.notifier = notifier
        self.last_load = last_load  # () -> LoadSettings | None: what the window has loaded
        self.dashboard = RemoteDashboard(tasks, window)
        self.dock = QDockWidget("Remote engine", window)
        self.dock.setObjectName("remote_dock")
        self.dock.setWidget(self.dashboard)
        window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dock)
        self.dock.hide()
        self.connect_action = connect_action
        connect_action.setEnabled(True)
        connect_action.setToolTip("Watch llama-server, vLLM, SGLang or another SpecDeck from its /metrics")
        self.switch = ServerSwitch(self)
        self.serve_action = QAction("&Serve the loaded model (OpenAI API)", window)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip("specdeck serve on 127.0.0.1: an OpenAI-compatible endpoint and /metrics")
        menu.addAction(self.serve_action)
        self.serve_action.toggled.connect(self._on_serve_action_toggled)
        self.switch.started.connect(self._on_switch_started)
        self.switch.failed.connect(self._on_switch_failed)
        self._url = ""

    # --- connect ------------------------------------------------------------------------------------

    def open_connect_dialog(self) -> None:
        dialog = ConnectDialog(self.window, self._url or "http://127.0.0.1:8080")
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return
        self.connect_to(dialog.url.text(), dialog.key.text())

    def connect_to(self, url: str, key: str | None = None) -> None:
        self._url = url
        self.connect_action.setEnabled(False)
        connect_in_background(self.tasks, url, key or None, self._on_connected, self._on_connect_failed)

    def _on_connected(self, engine: RemoteEngine, info: RemoteInfo) -> None:
        self.connect_action.setEnabled(True)
        self.dashboard.watch(engine, info)
        self.dock.show()
        self.dock.raise_()

    def _on_connect_failed(self, exc: Exception) -> None:
        self.connect_action.setEnabled(True)
        self.notifier.error(f"Could not connect to the server: {exc}")

    # --- serve --------------------------------------------------------------------------------------

    @Slot(bool)
    def _on_serve_action_toggled(self, on: bool) -> None:
        if on and not self.switch.running:
            self.switch.start(self.last_load())
        elif not on and self.switch.running:
            self.switch.stop()
            self.notifier.info("The server is stopped.")

    @Slot(str)
    def _on_switch_started(self, url: str) -> None:
        self.notifier.info(f"Serving the loaded model at {url}/v1 (OpenAI API; /metrics for Prometheus). "
                           "It runs its own engine with the same model and settings.")
        self.connect_to(url)

    @Slot(str)
    def _on_switch_failed(self, message: str) -> None:
        self.serve_action.blockSignals(True)
        self.serve_action.setChecked(False)
        self.serve_action.blockSignals(False)
        self.notifier.error(message)

    def shutdown(self) -> None:
        self.dashboard.stop()
        self.switch.stop()
