"""What the main window gets for serving and remote engines, wired in one place so its own edits stay small:
a "Remote engine" dock with the remote dashboard, Model → Connect to server… and Disconnect, and Model → Serve
the loaded model (the Server switch), whose requests the dock then watches live.

Serving never holds a second copy of the models: the switch unloads the window's own (saying so), the server
loads them with the window's whole load settings, and the window chats through the server; stopping it loads
them back in the window's engine.

While connected, the picker lists the server's models (marked remote, with the server's host:port) after
the local ones; choosing one makes the chat answer through the server (``RemoteChat``), and choosing a local
model, or disconnecting, brings it back to the window's own engine. The switch waits for an answer being
written to end."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QDockWidget, QFrame, QMainWindow, QMenu, QScrollArea

from app.events import EngineError, Finished, Token
from app.params import LoadSettings
from app.remote.client import RemoteEngine, RemoteInfo, RemoteModel, remote_models
from ui.bridge import EngineBridge
from ui.chat.panel import ChatPanel
from ui.models.picker import ModelPicker
from ui.remote.connect import ConnectDialog, connect_in_background
from ui.remote.panel import RemoteDashboard
from ui.remote.route import RemoteChat
from ui.remote.server_switch import ServerSwitch
from ui.tasks import TaskRunner


class RemoteSide(QObject):
    def __init__(self, window: QMainWindow, menu: QMenu, connect_action: QAction, tasks: TaskRunner,
                 notifier: Any, last_load: Any, picker: ModelPicker, chat: ChatPanel) -> None:
        super().__init__(window)
        self.picker = picker
        self.chat = chat
        self.local_engine = chat.bridge  # the window's own engine, which the chat goes back to
        self.bridge = chat.bridge if isinstance(chat.bridge, EngineBridge) else None
        picker.tune_engine = self.bridge  # Tune measures on the window's engine, never a second one
        self._served_load: LoadSettings | None = None  # the window's load while the server holds it
        self._serve_when_unloaded: LoadSettings | None = None  # the server starts once the window's copy is gone
        if self.bridge is not None:
            self.bridge.model_unloaded.connect(self._on_bridge_model_unloaded)
            self.bridge.engine_crashed.connect(self._on_bridge_engine_crashed)
            self.bridge.model_loaded.connect(self._on_bridge_model_loaded)
        self.route: RemoteChat | None = None  # the chat's engine while a remote model is chosen
        self._wanted: RemoteModel | None = None  # the picker's remote choice, applied between answers
        self._key: str | None = None
        self.window = window
        self.tasks = tasks
        self.notifier = notifier
        self.last_load = last_load  # () -> LoadSettings | None: what the window has loaded
        self.dashboard = RemoteDashboard(tasks, window)
        self.dock = QDockWidget("Remote engine", window)
        self.dock.setObjectName("remote_dock")
        # In a scroll area: the dashboard's own minimum height must not grow the window past a small screen
        # (at 1024×700 it made the window 1049×721, and it never shrank back).
        scroll = QScrollArea(self.dock)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.dashboard)
        self.dock.setWidget(scroll)
        window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dock)
        self.dock.hide()
        self.connect_action = connect_action
        connect_action.setEnabled(True)
        connect_action.setToolTip("Watch llama-server, vLLM, SGLang or another SpecDeck from its /metrics")
        self.disconnect_action = QAction("&Disconnect from server", window)
        self.disconnect_action.setEnabled(False)
        self.disconnect_action.triggered.connect(self.disconnect_server)
        menu.addAction(self.disconnect_action)
        self.switch = ServerSwitch(self)
        self.serve_action = QAction("&Serve the loaded model (OpenAI API)", window)
        self.serve_action.setCheckable(True)
        self.serve_action.setToolTip("specdeck serve on 127.0.0.1: an OpenAI-compatible endpoint and /metrics")
        menu.addAction(self.serve_action)
        self.serve_action.toggled.connect(self._on_serve_action_toggled)
        self.switch.started.connect(self._on_switch_started)
        self.switch.failed.connect(self._on_switch_failed)
        self.switch.stopped.connect(self._on_switch_stopped)
        picker.remote_chosen.connect(self._on_picker_remote_chosen)
        chat.generation_state_changed.connect(self._on_chat_generation_state_changed)
        self._url = ""

    # --- connect ------------------------------------------------------------------------------------

    def open_connect_dialog(self) -> None:
        dialog = ConnectDialog(self.window, self._url or "http://127.0.0.1:8080")
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return
        self.connect_to(dialog.url.text(), dialog.key.text())

    def connect_to(self, url: str, key: str | None = None) -> None:
        self._url = url
        self._key = key or None
        self.connect_action.setEnabled(False)
        connect_in_background(self.tasks, url, key or None, self._on_connected, self._on_connect_failed)

    def _on_connected(self, engine: RemoteEngine, info: RemoteInfo) -> None:
        self.connect_action.setEnabled(True)
        self.disconnect_action.setEnabled(True)
        self.dashboard.watch(engine, info)
        models = remote_models(info)
        self.picker.set_remote_models(models)
        if self.switch.running and info.base_url == self.switch.last_url and models:
            self.picker.select_remote(models[0])  # the window's own server: the chat answers through it
        if self.dock.isHidden() and not self.window.tabifiedDockWidgets(self.dock):
            # A tab beside the dashboard: a third column squeezed the chat to a sliver at 1366×768.
            dashboard = getattr(self.window, "dashboard_dock", None)
            if dashboard is not None and dashboard.isVisible():
                self.window.tabifyDockWidget(dashboard, self.dock)
        self.dock.show()
        self.dock.raise_()

    def disconnect_server(self) -> None:
        """Stop watching the server and take its models out of the picker; the chat goes back home."""
        self.dashboard.disconnect_server()
        self.picker.set_remote_models(())
        self.disconnect_action.setEnabled(False)
        self.dock.hide()

    # --- the chat's engine --------------------------------------------------------------------------

    @Slot(object)
    def _on_picker_remote_chosen(self, model: RemoteModel | None) -> None:
        self._wanted = model
        if not self.chat.generating:
            self._route_chat()

    @Slot(bool)
    def _on_chat_generation_state_changed(self, generating: bool) -> None:
        if not generating:
            self._route_chat()

    def _route_chat(self) -> None:
        model = self._wanted
        if self.route is not None and self.route.model == model:
            return
        old, self.route = self.route, None
        if model is not None:
            info = self.dashboard.info
            n_ctx = info.n_ctx if info is not None and info.base_url == model.base_url else None
            # The window's own server is told not to save what the window's chat saves itself.
            self.route = RemoteChat(model, self._key, n_ctx, self, headers=self.switch.own_headers(model.base_url))
            self.route.engine_error.connect(self._on_route_engine_error)
            self.route.generation_started.connect(self._on_route_generation_started)
            self.route.token_received.connect(self._on_route_token_received)
            self.route.generation_finished.connect(self._on_route_generation_finished)
        self.chat.use_engine(self.route or self.local_engine)
        if old is not None:
            old.close()

    def _watching(self) -> bool:
        """Whether the dock watches the server the chat answers from (its answer is then the dock's live rate)."""
        info = self.dashboard.info
        return self.route is not None and info is not None and info.base_url == self.route.model.base_url

    @Slot(int)
    def _on_route_generation_started(self, _request_id: int) -> None:
        if self._watching():
            self.dashboard.stream_started()

    @Slot(Token)
    def _on_route_token_received(self, event: Token) -> None:
        if self._watching():
            self.dashboard.stream_tokens(len(event.token_ids) or 1)  # a server's stream: about a token a chunk

    @Slot(Finished)
    def _on_route_generation_finished(self, _event: Finished) -> None:
        self.dashboard.stream_ended()

    def _on_connect_failed(self, exc: Exception) -> None:
        self.connect_action.setEnabled(True)
        self.notifier.error(f"Could not connect to the server: {exc}")

    # --- serve --------------------------------------------------------------------------------------

    @Slot(bool)
    def _on_serve_action_toggled(self, on: bool) -> None:
        if on and not self.switch.running:
            self._serve()
        elif not on and self.switch.running:
            self.switch.stop()

    def _serve(self) -> None:
        """Hand the window's load to the server: unloaded here first, so the models are held once."""
        settings = self.last_load()
        if settings is not None and self.chat.generating:
            self._on_switch_failed("An answer is being written; serve when it has finished.")
            return
        if settings is not None and self.bridge is not None and self.bridge.tuning:
            self._on_switch_failed("Tune is measuring on the loaded model; serve when it has finished.")
            return
        if settings is not None and self.bridge is not None and self.bridge.worker_pid is not None:
            self._served_load = self._serve_when_unloaded = settings
            self.bridge.unload()  # the worker's Unloaded reply starts the server (_on_bridge_model_unloaded)
            return
        self.switch.start(settings)

    @Slot()
    def _on_bridge_model_unloaded(self) -> None:
        settings, self._serve_when_unloaded = self._serve_when_unloaded, None
        if settings is not None and self.serve_action.isChecked():
            self.switch.start(settings)

    @Slot(object)
    def _on_bridge_engine_crashed(self, _event: object) -> None:
        self._on_bridge_model_unloaded()  # a worker that died while unloading holds nothing either

    @Slot(object)
    def _on_bridge_model_loaded(self, _event: object) -> None:
        if self.switch.running and self._serve_when_unloaded is None:
            self._served_load = None  # the window loaded a model of its own: stopping the server keeps that one

    @Slot(str)
    def _on_switch_started(self, url: str) -> None:
        handed = (" The window unloaded its own copy and now chats through the server."
                  if self._served_load is not None else "")
        self.notifier.info(f"Serving the loaded model at {url}/v1 (OpenAI API; /metrics for Prometheus).{handed}")
        self.connect_to(url)

    @Slot(EngineError)
    def _on_route_engine_error(self, event: EngineError) -> None:
        self.dashboard.stream_ended()
        self.notifier.error(event.message)  # the chat ends the answer; the message is the window's to show

    @Slot()
    def _on_switch_stopped(self) -> None:
        info = self.dashboard.info
        if info is not None and self.switch.last_url == info.base_url:
            self.disconnect_server()  # the dock was watching the server that just stopped
        self._load_back("The server is stopped; the window loads its model again.")

    def _load_back(self, sentence: str) -> None:
        """The window's load, which the server held, back in the window's engine."""
        settings, self._served_load = self._served_load, None
        if settings is None or self.bridge is None:
            self.notifier.info("The server is stopped.")
            return
        self.notifier.info(sentence)
        self.bridge.load(settings)

    @Slot(str)
    def _on_switch_failed(self, message: str) -> None:
        self.serve_action.blockSignals(True)
        self.serve_action.setChecked(False)
        self.serve_action.blockSignals(False)
        self.notifier.error(message)
        if self._served_load is not None:  # the server did not start: the window's model comes back
            self._load_back("The window loads its model again.")

    def shutdown(self) -> None:
        self.dashboard.stop()
        if self.route is not None:
            self.chat.use_engine(self.local_engine)
            self.route.close()
            self.route = None
        self._served_load = self._serve_when_unloaded = None  # the window is closing: nothing to load back
        self.switch.stop()
