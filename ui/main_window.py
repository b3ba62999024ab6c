"""The main window: chat in the centre, models and settings on the left, the dashboard on the right.

Window layout lives in QSettings (``ui.window_state``); user settings in ``app.storage.settings``
(``settings.json``). Engine crashes show a banner (``ui.crash_banner``); the chat and settings stay. Over 500
lines: it is the one place that wires the parts together (menus, docks, engine events, the history), and each
piece is short.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QGroupBox,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

import app
from app.ceiling.backend import BackendInfo, probe_backend_isolated
from app.ceiling.backend_modules import describe_modules
from app.errors import AppError, SettingsError, StorageError
from app.events import EngineCrashed, EngineError, Loaded, LoadProgress, MessageStats, PromptProcessed
from app.library.discovery import LibraryEntry
from app.library.model_details import model_details
from app.params import LoadSettings, threads_beside_window
from app.storage.atomic import atomic_write_text
from app.storage.history_writer import HistoryThread
from app.storage.measured import keep_loaded_answer
from app.storage.settings import load_settings, save_settings
from ui.bridge import EngineBridge
from ui.chat.message import ChatMessage
from ui.chat.panel import LOADING_MESSAGE, NEED_MODEL_MESSAGE, WAITING_MESSAGE, ChatPanel
from ui.crash_banner import CrashBanner
from ui.dashboard.panel import DashboardPanel
from ui.first_run import FirstRunPanel
from ui.history_reads import ReadDelivery
from ui.hub.window_side import FindModelsSide
from ui.log_window import LogWindow
from ui.models.details import ModelDetailsDialog
from ui.models.picker import ModelPicker
from ui.models.sampling_form import SamplingForm
from ui.notifier import Notifier
from ui.remote.window_side import RemoteSide
from ui.shortcuts import (
    KEY_CONTINUE,
    KEY_COPY_ANSWER,
    KEY_EDIT_LAST,
    KEY_MESSAGE_BOX,
    KEY_REGENERATE,
    KEY_RENAME,
    SHORTCUTS_HTML,
)
from ui.tasks import TaskRunner
from ui.theme import follow_colour_scheme
from ui.wheel_guard import guard_wheel
from ui.window_state import SIDE_DOCK_MIN_WIDTH, WindowState

logger = logging.getLogger(__name__)

HISTORY_REOPEN_SECONDS = 30


def describe_build(info: BackendInfo) -> str:
    """The About box's lines on the llama.cpp build: version, commit, backend, CPU features."""
    if not info.available:
        return f"llama.cpp build information is not available: {info.error}"
    offload = "GPU offload" if info.gpu_offload else "no GPU offload"
    lines = [
        f"llama.cpp {info.llama_cpp} (ggml {info.ggml_version}, commit {info.ggml_commit})",
        f"llama-cpp-python {info.llama_cpp_python}",
        f"Backend: {info.backend} ({offload})",
        f"CPU features: {' '.join(info.cpu_features) or 'none reported'}",
    ]
    modules = describe_modules(info.modules, info.left_out_modules)
    if modules:
        lines.append(modules[0].upper() + modules[1:])
    lines += [f"Device: {d.name} {d.description}".rstrip() for d in info.devices]
    if info.gpu_fallback:
        lines.append(f"No GPU: {info.gpu_fallback}")
    return "\n".join(lines)


class MainWindow(QMainWindow):
    history_write_failed = Signal(str)  # emitted on the history's writer thread, delivered on the GUI thread
    export_done = Signal(str)  # the file an export wrote, or "" when it failed (the notifier says why)

    def __init__(
        self,
        bridge: EngineBridge | None = None,
        notifier: Notifier | None = None,
        *,
        start_engine: bool = True,
    ) -> None:
        super().__init__()
        self.setWindowTitle("SpecDeck")
        app = QApplication.instance()
        if isinstance(app, QApplication):
            follow_colour_scheme(app)  # before any widget reads the palette
        self.notifier = notifier if notifier is not None else Notifier(self)
        self.settings, warning = load_settings()
        self.bridge = bridge if bridge is not None else EngineBridge(parent=self)
        self.tasks = TaskRunner(self)
        self.writes = TaskRunner(self, max_threads=1)  # settings and pair stats: fsyncs, in order, off the GUI thread
        self.store = self._open_store()
        self._reads = ReadDelivery(self)  # history reads (an export) reach the GUI thread when they are done
        self._history_reopen_ticks = 0  # seconds since the last try to open a history that would not open
        self._prompt_warnings_shown: set[str] = set()  # template warnings already told for this model
        # Writes the history could not take (another program held its lock) are retried until written.
        self._history_retry = QTimer(self)
        self._history_retry.timeout.connect(self._on_history_retry_timeout)
        self._history_retry.start(1000)
        self._reload_pending = self.settings.reload_last_pair_on_start and bool(self.settings.load.target_path)
        self._send_load_pending = False  # a message waits for the drafters' ranking, then the load it starts
        self._closed = False
        self.window_state = WindowState(self)
        self._build()
        guard_wheel(self)
        self.notifier.attach(self)
        if warning:
            self.notifier.warning(warning)
        if self.store is not None and self.store.warning:
            self.notifier.warning(self.store.warning)
        self._connect()
        self._update_unload_action()
        self.window_state.restore()
        self._build_info: BackendInfo | None = None
        self._about_box: QMessageBox | None = None
        self._shortcuts_box: QMessageBox | None = None
        self._sampling_message: str | None = None  # a sampling error on the status bar, until fixed
        self._probing_build = False
        if start_engine:
            self.bridge.start()
            self._probe_build()
            self.bridge.list_devices(self.settings.load.rpc_servers)  # the picker's GPU choice and RPC servers
        self.picker.rescan()

    def _open_store(self, *, quiet: bool = False) -> HistoryThread | None:
        if not quiet:
            self.history_write_failed.connect(self._on_history_write_failed)
        try:
            return HistoryThread(on_error=lambda exc: self.history_write_failed.emit(str(exc)))
        except StorageError as exc:
            if not quiet:
                self.notifier.error(f"{exc} Chats are kept in memory only until this is fixed; SpecDeck tries "
                                    f"again every {HISTORY_REOPEN_SECONDS} s.")
            return None

    @Slot()
    def _on_history_retry_timeout(self) -> None:
        if self.store is not None:
            self.store.flush_pending()  # queued on the writer thread; nothing to do when nothing waits
            return
        # A history that could not open at start (a full disk, an I/O error) is tried again, so the chats
        # sent meanwhile are saved once it can be, not lost on close.
        self._history_reopen_ticks += 1
        if self._history_reopen_ticks < HISTORY_REOPEN_SECONDS or self.chat.generating:
            return
        self._history_reopen_ticks = 0
        store = self._open_store(quiet=True)
        if store is None:
            return
        self.store = store
        self.chat.attach_store(store)
        self.notifier.info("The chat history opened; this chat and the next ones are saved again.")

    @Slot(str)
    def _on_history_write_failed(self, message: str) -> None:
        self.notifier.error(message)

    # --- layout -------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.picker = ModelPicker(self.tasks, self)
        self.picker.apply_settings(self.settings)
        self.sampling_form = SamplingForm(self.settings.sampling, self)
        side = QWidget(self)
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(self.picker)
        sampling_box = QGroupBox("Sampling", side)
        box_layout = QVBoxLayout(sampling_box)
        box_layout.addWidget(self.sampling_form)
        side_layout.addWidget(sampling_box)
        side_layout.addStretch(1)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setWidget(side)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # Never narrower than what its widgets need: below that they would be cut, not wrapped.
        scroll.setMinimumWidth(max(SIDE_DOCK_MIN_WIDTH, side.minimumSizeHint().width()
                                   + scroll.verticalScrollBar().sizeHint().width() + 2 * scroll.frameWidth()))
        # Load and Cancel stay below the scroll area: in the form they were below the fold at 1366×768.
        dock_body = QWidget(self)
        dock_layout = QVBoxLayout(dock_body)
        dock_layout.setContentsMargins(0, 0, 0, 0)
        dock_layout.setSpacing(0)
        dock_layout.addWidget(scroll, 1)
        dock_layout.addWidget(self.picker.load_box.take_load_row())
        self.models_dock = QDockWidget("Models and settings", self)
        self.models_dock.setObjectName("models_dock")
        self.models_dock.setWidget(dock_body)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.models_dock)

        self.dashboard = DashboardPanel(self, tasks=self.tasks)
        self.dashboard.attach(self.bridge)
        self.dashboard_dock = QDockWidget("Dashboard", self)
        self.dashboard_dock.setObjectName("dashboard_dock")
        self.dashboard_dock.setWidget(self.dashboard)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dashboard_dock)

        central = QWidget(self)
        layout = QVBoxLayout(central)
        self.banner = CrashBanner(central)
        layout.addWidget(self.banner)
        self.chat = ChatPanel(self.bridge, self.sampling_form, self.store, central)
        self.chat.system_prompt.setText(self.settings.system_prompt)
        self.chat.presets.set_presets(self.settings.system_prompt_presets)
        self.first_run = FirstRunPanel(central)
        self.stack = QStackedWidget(central)
        self.stack.addWidget(self.chat)
        self.stack.addWidget(self.first_run)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.log_window = LogWindow(self)
        self.log_window.follow_engine_file(lambda: self.bridge.engine_log_path)
        self._build_menus()
        # The load's progress in the status bar too: the Models dock's own bar is below the fold on a short
        # screen (1366×768), where nothing visible moved for the whole load.
        self.load_bar = QProgressBar(self)
        self.load_bar.setObjectName("status_load_bar")
        self.load_bar.setRange(0, 100)
        self.load_bar.setMaximumWidth(320)
        self.load_bar.setVisible(False)
        self.statusBar().addPermanentWidget(self.load_bar)
        self.picker.load_box.progress_bars.append(self.load_bar)
        self.chat.model_loading = lambda: self.picker.loading
        self.chat.load_for_send = self._load_for_send
        self.chat.overflow_policy = lambda: str(self.picker.load_box.overflow_combo.currentData() or "stop")

    def _action(self, menu: QMenu, text: str, slot: Callable[[], object],
                keys: QKeySequence | QKeySequence.StandardKey | str | None = None) -> QAction:
        action = QAction(text, self)
        if keys is not None:
            action.setShortcut(QKeySequence(keys))
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self.new_chat_action = self._action(file_menu, "&New chat", self._on_new_chat_action_triggered,
                                            QKeySequence.StandardKey.New)
        self.export_action = self._action(file_menu, "&Export chat…", self._on_export_action_triggered)
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit_menu = bar.addMenu("&Edit")
        # The key is the chat's window-wide shortcut (a text box with focus keeps Ctrl+Z): shown, not bound twice.
        self.undo_action = self._action(edit_menu, "&Undo delete or edit\tCtrl+Z", lambda: self.chat.undo())
        self._action(edit_menu, "&Copy", self._on_copy_action_triggered)  # Ctrl+C stays with the focused widget
        view_menu = bar.addMenu("&View")
        self._action(view_menu, "&Log", self._on_log_action_triggered)
        view_menu.addAction(self.models_dock.toggleViewAction())
        view_menu.addAction(self.dashboard_dock.toggleViewAction())
        chat_menu = bar.addMenu("&Chat")
        chat = self.chat
        self.regenerate_action = self._action(chat_menu, "&Regenerate", lambda: chat.regenerate(), KEY_REGENERATE)
        self.continue_action = self._action(chat_menu, "&Continue", lambda: chat.continue_answer(), KEY_CONTINUE)
        self.edit_last_action = self._action(chat_menu, "&Edit last message", lambda: chat.edit_last(),
                                             KEY_EDIT_LAST)
        self.copy_answer_action = self._action(chat_menu, "Copy last &answer", lambda: chat.copy_last_answer(),
                                               KEY_COPY_ANSWER)
        self.message_box_action = self._action(chat_menu, "&Message box", lambda: chat.focus_input(),
                                               KEY_MESSAGE_BOX)
        self.rename_action = self._action(chat_menu, "Re&name chat", lambda: chat.rename_current_chat(), KEY_RENAME)
        model_menu = bar.addMenu("&Model")
        self.load_action = self._action(model_menu, "&Load", self._on_load_action_triggered)
        self.unload_action = self._action(model_menu, "&Unload", self._on_unload_action_triggered)
        self.details_action = self._action(model_menu, "&Details of the target…", self._on_details_action_triggered)
        self.details_dialog: ModelDetailsDialog | None = None
        self.connect_server_action = self._action(model_menu, "&Connect to server…",
                                                  self._on_connect_server_action_triggered)
        self.remote = RemoteSide(self, model_menu, self.connect_server_action, self.tasks, self.notifier,
                                 lambda: self.bridge.last_load, self.picker, self.chat)
        self.find_models = FindModelsSide(self, model_menu, self.picker)
        help_menu = bar.addMenu("&Help")
        self._action(help_menu, "&Keyboard shortcuts", self._on_shortcuts_action_triggered)
        self._action(help_menu, "&About SpecDeck", self._on_about_action_triggered)

    def _connect(self) -> None:
        b = self.bridge
        b.model_loaded.connect(self._on_bridge_model_loaded)
        b.load_progress.connect(self._on_bridge_load_progress)
        b.load_cancelled.connect(self._on_bridge_load_cancelled)
        b.engine_error.connect(self._on_bridge_engine_error)
        b.engine_crashed.connect(self._on_bridge_engine_crashed)
        b.engine_restarting.connect(self._on_bridge_engine_restarting)
        b.prompt_processed.connect(self._on_bridge_prompt_processed)
        b.devices_listed.connect(self.picker.show_devices)
        self.picker.load_box.device_choice.devices_wanted.connect(self._on_device_choice_devices_wanted)
        self.picker.load_requested.connect(self._on_picker_load_requested)
        self.picker.cancel_load_requested.connect(self._on_picker_cancel_load_requested)
        self.picker.library_changed.connect(self._on_picker_library_changed)
        self.picker.drafters_ranked.connect(self._on_picker_drafters_ranked)
        self.picker.folders_changed.connect(self._on_picker_folders_changed)
        self.picker.error_raised.connect(self.notifier.error)
        self.picker.demo_install_finished.connect(self._on_picker_demo_install_finished)
        self.chat.error_raised.connect(self._on_chat_error_raised)
        self.chat.notice_raised.connect(self.notifier.info)
        self.chat.presets.changed.connect(self.save_app_settings)
        b.model_unloaded.connect(self._update_unload_action)
        self.chat.answer_finished.connect(self._on_chat_answer_finished)
        self.chat.chat_opened.connect(self._on_chat_chat_opened)
        self.chat.completion_mode_toggled.connect(self._on_chat_completion_mode_toggled)
        self.chat.generation_state_changed.connect(self._on_chat_generation_state_changed)
        self.sampling_form.changed.connect(self._on_sampling_form_changed)
        b.log_received.connect(self.log_window.append_engine_line)
        self.banner.restart_button.clicked.connect(self._on_banner_restart_clicked)
        self.first_run.demo_button.clicked.connect(self._on_first_run_demo_clicked)
        self.first_run.folder_button.clicked.connect(self.picker._on_add_folder_button_clicked)

    def save_app_settings(self) -> None:
        """Save the settings shown, on the writer thread (the fsync stays off the GUI thread)."""
        settings = self.picker.update_settings(self.settings)
        try:
            sampling = self.sampling_form.settings()
        except SettingsError:
            sampling = self.settings.sampling  # keep the last valid values
        settings = replace(settings, sampling=sampling, system_prompt=self.chat.system_prompt.text(),
                           system_prompt_presets=self.chat.presets.presets)
        self.settings = settings
        self.writes.run(lambda: save_settings(settings), self._on_write_done, self._on_settings_save_failed)

    def _on_write_done(self, _result: object) -> None:
        pass

    def _on_settings_save_failed(self, exc: Exception) -> None:
        self.notifier.error(f"Settings could not be saved: {exc}")

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.window_state.on_show()

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._closed:
            self._closed = True
            self.chat.flush()
            self.chat.commit_pending_delete()
            self.save_app_settings()
            self.window_state.save()
            self.remote.shutdown()
            self.bridge.close()
            self.tasks.wait()
            self.writes.wait()
            self.log_window.detach()
            self._history_retry.stop()
            if self.store is not None:
                self.store.close()
        super().closeEvent(event)

    # --- picker -------------------------------------------------------------------------------------

    @Slot(LoadSettings)
    def _on_picker_load_requested(self, settings: LoadSettings) -> None:
        if self.remote.switch.running:  # the server holds the models: a second load here would hold them twice
            self.notifier.error("The server is serving the loaded model; stop it (Model → Serve the loaded model) "
                                "before loading a model here.")
            return
        if settings.n_threads == 0:  # auto: leave the window a core of its own
            settings = replace(settings, n_threads=threads_beside_window())
        try:
            self.bridge.load(settings)
        except AppError as exc:
            self.notifier.error(exc)
            return
        self.banner.hide()
        self.picker.set_loading(True, "Loading…")
        self._update_unload_action()
        self.dashboard.reset()
        self.save_app_settings()

    @Slot()
    def _on_picker_cancel_load_requested(self) -> None:
        self.bridge.cancel_load()

    @Slot(list)
    def _on_picker_library_changed(self, entries: list[LibraryEntry]) -> None:
        has_models = any(e.is_model for e in entries) or bool(self.picker.remote_models)
        self.stack.setCurrentWidget(self.chat if has_models else self.first_run)

    @Slot()
    def _on_picker_drafters_ranked(self) -> None:
        if self._reload_pending and self.picker.target_path() == self.settings.load.target_path:
            self._reload_pending = False
            self.picker.request_load()
        if self._send_load_pending:
            self._send_load_pending = False
            self.chat.send_waiting = self._start_load_for_send()

    def _load_for_send(self) -> bool:
        """A message sent with a model chosen but not loaded: load it as Load would (once the drafters are
        ranked, so the drafter Load would take is the one loaded), then the message goes."""
        picker = self.picker
        if picker.remote_model() is None and picker.target_path() is None:
            self.notifier.info(NEED_MODEL_MESSAGE)  # not a box: nothing failed, a choice is missing
            return False
        if picker.ranking:
            self._send_load_pending = True
            self.notifier.info(WAITING_MESSAGE)
            return True
        return self._start_load_for_send()

    def _start_load_for_send(self) -> bool:
        if not self.picker.request_load() or not self.picker.loading:
            return False  # refused: the picker or the engine said why, as for the Load button
        self.notifier.info(WAITING_MESSAGE)
        return True

    def _give_up_waiting_send(self) -> None:
        """The load a message waited for did not finish: the message stays in the input box, not sent."""
        self._send_load_pending = False
        self.chat.send_waiting = False

    @Slot(tuple)
    def _on_picker_folders_changed(self, _folders: tuple[str, ...]) -> None:
        self.save_app_settings()

    @Slot()
    def _on_first_run_demo_clicked(self) -> None:
        self.first_run.demo_button.setEnabled(False)
        self.picker.install_demo_models()

    # --- engine -------------------------------------------------------------------------------------

    @Slot(Loaded)
    def _on_bridge_model_loaded(self, event: Loaded) -> None:
        self._prompt_warnings_shown.clear()
        if self.window_state.raise_dashboard_on_load:
            self.window_state.raise_dashboard_on_load = False
            self.dashboard_dock.raise_()
        self.picker.show_loaded(event)
        note = self.bridge.last_load.context_note(event.n_ctx) if self.bridge.last_load else None
        if note:
            self.notifier.info(note)
        self.notifier.resolve(NEED_MODEL_MESSAGE)
        self.notifier.resolve(LOADING_MESSAGE)
        self.chat.input.setFocus()  # the first thing typed after a load is a message, not a setting
        # A base model (no chat template) starts in completion mode; a switch by the user is remembered.
        switched = event.target.path in self.settings.switched_mode_models
        self.chat.set_completion_mode(event.target.has_chat_template == switched)
        self._update_unload_action()
        if self.chat.send_waiting:
            self._give_up_waiting_send()  # done waiting: an input box emptied meanwhile sends nothing
            self.notifier.resolve(WAITING_MESSAGE)
            self.chat.send()

    @Slot(bool)
    def _on_chat_completion_mode_toggled(self, on: bool) -> None:
        loaded = self.bridge.loaded
        if loaded is None:
            return
        path = loaded.target.path
        others = tuple(p for p in self.settings.switched_mode_models if p != path)
        switched = on == loaded.target.has_chat_template  # completion on a chat model, or chat on a base one
        self.settings = replace(self.settings, switched_mode_models=(*others, path) if switched else others)
        self.save_app_settings()

    @Slot(PromptProcessed)
    def _on_bridge_prompt_processed(self, event: PromptProcessed) -> None:
        # A refused chat template (and the format used instead) is said once per loaded model, not per message.
        if event.warning and event.warning not in self._prompt_warnings_shown:
            self._prompt_warnings_shown.add(event.warning)
            # A notice, not a dialog: it comes as the answer starts, and a box would cover the stream.
            self.notifier.info(event.warning)

    @Slot(LoadProgress)
    def _on_bridge_load_progress(self, event: LoadProgress) -> None:
        self.picker.load_box.show_progress(event)

    @Slot()
    def _on_bridge_load_cancelled(self) -> None:
        self._give_up_waiting_send()
        self.picker.set_loading(False, "Loading cancelled.")

    @Slot(int)
    def _on_chat_chat_opened(self, _chat_id: int) -> None:
        self.dashboard.forget_answer()  # its totals were another chat's answer

    @Slot(object)
    def _on_chat_answer_finished(self, answer: ChatMessage) -> None:
        loaded = self.chat.bridge.loaded  # the engine that answered (a remote server's model has no drafter here)
        stats = answer.stats
        if loaded is None or not isinstance(stats, MessageStats):
            return
        # The next ranking of drafters for this target uses what was measured, not a default.
        self.writes.run(lambda: keep_loaded_answer(loaded, stats), self._on_write_done, self._on_pair_stats_failed)

    def _on_pair_stats_failed(self, exc: Exception) -> None:
        logger.warning("measured acceptance not saved: %s", exc)

    @Slot(str)
    def _on_chat_error_raised(self, text: str) -> None:
        if text == self.sampling_form.error():
            self._sampling_message = text
        self.notifier.error(text)

    @Slot()
    def _on_sampling_form_changed(self) -> None:
        if self._sampling_message is not None and self.sampling_form.error() is None:
            self.notifier.resolve(self._sampling_message)
            self._sampling_message = None

    @Slot(bool)
    def _on_chat_generation_state_changed(self, generating: bool) -> None:
        for action in (self.new_chat_action, self.load_action):
            action.setEnabled(not generating)
        self._update_unload_action()

    @Slot()
    def _update_unload_action(self) -> None:
        self.unload_action.setEnabled(self.bridge.loaded is not None and not self.chat.generating)

    @Slot(bool)
    def _on_picker_demo_install_finished(self, ok: bool) -> None:
        self.first_run.demo_button.setEnabled(True)
        if ok:
            self.notifier.info("The demo models are installed.")

    # --- menus --------------------------------------------------------------------------------------

    @Slot()
    def _on_new_chat_action_triggered(self) -> None:
        self.chat.new_chat()

    @Slot()
    def _on_export_action_triggered(self) -> None:
        if self.store is None or self.chat.chat_id is None:
            self.notifier.info("Nothing to export yet: send a message first.")
            return
        path, _filter = QFileDialog.getSaveFileName(self, "Export chat", "chat.md",
                                                    "Markdown (*.md);;JSON (*.json)")
        if path:
            self.export_chat(path)

    def export_chat(self, path: str) -> bool:
        """Export the open chat (Markdown, or JSON for a .json name): read behind the history's queued writes
        and written to the file off the GUI thread, the outcome shown on the status bar (``export_done``)."""
        if self.store is None or self.chat.chat_id is None:
            return False
        try:
            future = self.store.export_later(self.chat.chat_id, as_json=path.endswith(".json"))
        except StorageError as exc:
            self._on_export_failed(f"The chat could not be exported: {exc}")
            return False
        self._reads.deliver(future, lambda text: self._write_export(path, text),
                            lambda exc: self._on_export_read_failed(exc))
        return True

    def _on_export_read_failed(self, exc: BaseException) -> None:
        if not isinstance(exc, KeyError | StorageError):
            raise exc
        self._on_export_failed(f"The chat could not be exported: {exc}")

    def _write_export(self, path: str, text: str) -> None:
        self.writes.run(lambda: atomic_write_text(Path(path), text), lambda _r: self._on_exported(path),
                        lambda exc: self._on_export_failed(f"The chat could not be exported to {path}: {exc}"))

    def _on_exported(self, path: str) -> None:
        self.notifier.info(f"Exported to {path}.")
        self.export_done.emit(path)

    def _on_export_failed(self, message: str) -> None:
        self.notifier.error(message)
        self.export_done.emit("")

    @Slot()
    def _on_copy_action_triggered(self) -> None:
        widget = QApplication.focusWidget()
        copy = getattr(widget, "copy", None)
        if callable(copy):
            copy()
        else:
            self.chat.view.copy()

    @Slot()
    def _on_log_action_triggered(self) -> None:
        self.log_window.show()
        self.log_window.raise_()

    @Slot()
    def _on_load_action_triggered(self) -> None:
        self.models_dock.show()
        self.picker.request_load()

    @Slot()
    def _on_details_action_triggered(self) -> None:
        entry = self.picker.target_entry()
        if entry is None:
            self.notifier.info("Choose a target model first: its details are those of a file in the library.")
            return
        switched = entry.path in self.settings.switched_mode_models
        completion = None if entry.info is None else (not entry.info.has_chat_template) != switched
        if self.details_dialog is not None:
            self.details_dialog.close()
        self.details_dialog = ModelDetailsDialog(model_details(entry, completion_mode=completion), self)
        self.details_dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.details_dialog.destroyed.connect(self._on_details_dialog_destroyed)
        self.details_dialog.open()

    def _on_details_dialog_destroyed(self) -> None:
        self.details_dialog = None

    def _on_unload_action_triggered(self) -> None:
        loaded = self.bridge.loaded
        if loaded is None:
            return
        self._give_up_waiting_send()
        self.bridge.unload()
        text = f"Unloaded {Path(loaded.target.path).name}; Load (or Send) loads it again."
        self.picker.set_loading(False, text)
        self.notifier.info(text)
        self._update_unload_action()

    @Slot()
    def _on_connect_server_action_triggered(self) -> None:
        self.remote.open_connect_dialog()

    @Slot()
    def _on_shortcuts_action_triggered(self) -> None:
        box = QMessageBox(QMessageBox.Icon.Information, "Keyboard shortcuts", SHORTCUTS_HTML,
                          QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.RichText)  # a table: columns line up in any font (our own text only)
        box.open()
        self._shortcuts_box = box

    @Slot(EngineError)
    def _on_bridge_engine_error(self, event: EngineError) -> None:
        if self.picker.loading:
            self._give_up_waiting_send()
            self.picker.set_loading(False, event.message)
        if event.kind == "PromptTooLongError" and event.request_id == self.chat.overflowed_request:
            return  # the chat handled it (asked again without the oldest turns, or said so itself)
        self.notifier.error(event.message)

    @Slot(tuple)
    def _on_device_choice_devices_wanted(self, rpc_servers: tuple[str, ...]) -> None:
        self.bridge.list_devices(rpc_servers)

    @Slot(EngineCrashed)
    def _on_bridge_engine_crashed(self, event: EngineCrashed) -> None:
        self.banner.show_crash(event, self.bridge.crashes_on_load, self.bridge.restarts_after_crash)
        self._give_up_waiting_send()
        self._update_unload_action()
        self.picker.set_loading(False, "The engine stopped.")
        self.notifier.info("The engine stopped; see the banner above the chat.")

    @Slot()
    def _on_bridge_engine_restarting(self) -> None:
        self.picker.set_loading(True, "Restarting the engine and reloading the models…")

    @Slot()
    def _on_banner_restart_clicked(self) -> None:
        self.bridge.restart()
        if self.bridge.last_load is not None:
            self.picker.set_loading(True, "Restarting the engine and reloading the models…")
        self.banner.hide()

    # --- about --------------------------------------------------------------------------------------

    def about_text(self) -> str:
        build = describe_build(self._build_info) if self._build_info else "Reading the llama.cpp build…"
        return f"SpecDeck {app.__version__}\n\n{build}"

    def _on_build_info_ready(self, info: BackendInfo) -> None:
        self._build_info = info
        if info.available:
            self.picker.set_gpu_offload_available(info.gpu_offload)
        if self._about_box is not None:
            self._about_box.setText(self.about_text())

    def _on_build_info_failed(self, exc: Exception) -> None:
        self._on_build_info_ready(BackendInfo(available=False, error=str(exc)))

    def _probe_build(self) -> None:
        if self._build_info is None and not self._probing_build:
            self._probing_build = True
            # In a child process and off the GUI thread: this process never loads llama.cpp.
            self.tasks.run(probe_backend_isolated, self._on_build_info_ready, self._on_build_info_failed)

    @Slot()
    def _on_about_action_triggered(self) -> None:
        self._probe_build()
        box = QMessageBox(QMessageBox.Icon.Information, "About SpecDeck", self.about_text(),
                          QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.finished.connect(self._on_about_box_finished)
        self._about_box = box
        box.open()

    @Slot(int)
    def _on_about_box_finished(self, _result: int) -> None:
        self._about_box = None
