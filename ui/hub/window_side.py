"""What the main window gets for the Hub, wired in one place so its own edit stays one line: Model → Find
models… (and the picker's Find models… button, and the first-start panel's Find models on the Hub…) opening
the view, a download an earlier run left unfinished resumed in it at the start, the picker rescanned after a
download so the model is listed at once, and the view's Load choosing that model in the picker and loading it
once the picker has ranked its drafters, so it loads with the drafter the picker would choose."""

from __future__ import annotations

import logging

from PySide6.QtCore import QEvent, QObject, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMainWindow, QMenu

from app.hub.pending import PendingPull, pending_pulls
from ui.first_run import FirstRunPanel
from ui.hub.find_models import FindModelsDialog
from ui.models.picker import ModelPicker
from ui.tasks import TaskRunner

logger = logging.getLogger(__name__)

VIEW_SHARE = 0.9  # of the window: the view opens over it, never larger than the screen the window fits
VIEW_MAX = (1200, 800)


class FindModelsSide(QObject):
    def __init__(self, window: QMainWindow, menu: QMenu, picker: ModelPicker) -> None:
        super().__init__(window)
        self.window = window
        self.picker = picker
        self.dialog: FindModelsDialog | None = None
        self._load_wanted: str | None = None
        self._ranked_for: str | None = None  # the target the picker's drafter list was last ranked for
        menu.addSeparator()
        self.action = QAction("&Find models…", window)
        self.action.setToolTip("Search the Hugging Face Hub for GGUF models, see which fit, and download one")
        self.action.triggered.connect(self.open)
        menu.addAction(self.action)
        picker.find_models_button.clicked.connect(self.open)
        first_run = window.findChild(FirstRunPanel)  # the panel a new user sees while there are no models
        if first_run is not None:
            first_run.hub_button.clicked.connect(self.open)
        # After the picker's own slot: its ranking for the new target has started when this one runs.
        picker.target_combo.currentIndexChanged.connect(self._on_picker_target_changed)
        picker.drafters_ranked.connect(self._on_picker_drafters_ranked)
        picker.library_changed.connect(self._on_picker_library_changed)
        window.installEventFilter(self)
        # Downloads an earlier run left unfinished resume now, one after another, in the view.
        self._unfinished: list[PendingPull] = []
        self._tasks = TaskRunner(self, max_threads=1)
        self._tasks.run(pending_pulls, self._on_unfinished_found, self._on_unfinished_failed)

    def open(self) -> FindModelsDialog:
        if self.dialog is None:
            self.dialog = FindModelsDialog(self.window, context=self.picker.load_box.ctx_spin.value(),
                                           library=lambda: self.picker.entries)
            self.dialog.download_finished.connect(self._on_dialog_download_finished)
            self.dialog.load_requested.connect(self.load)
            self.dialog.download_failed.connect(self._on_dialog_download_failed)
            w, h = self.window.width(), self.window.height()
            self.dialog.resize(min(VIEW_MAX[0], int(w * VIEW_SHARE)), min(VIEW_MAX[1], int(h * VIEW_SHARE)))
        elif self.dialog.isHidden():
            # the context the picker loads with now
            self.dialog.ctx_spin.setValue(self.picker.load_box.ctx_spin.value())
        self.dialog.show()
        self.dialog.raise_()
        self.dialog.activateWindow()
        self.dialog.query_edit.setFocus()
        return self.dialog

    @Slot(str)
    def _on_dialog_download_finished(self, _path: str) -> None:
        self.picker.rescan()  # discovery looks in the models folder: the new file is listed when the scan ends
        self._resume_next()

    # --- downloads left unfinished --------------------------------------------------------------------

    def _on_unfinished_found(self, found: list[PendingPull]) -> None:
        self._unfinished = list(found)
        if found:
            logger.info("Resuming %d unfinished download(s) from the Hub", len(found))
            self._resume_next()

    def _on_unfinished_failed(self, exc: Exception) -> None:
        logger.warning("The models folder could not be checked for unfinished downloads: %s", exc)

    @Slot(str)
    def _on_dialog_download_failed(self, _message: str) -> None:
        self._resume_next()  # the next unfinished one, if any: the view says why this one stopped

    def _resume_next(self) -> None:
        while self._unfinished:
            pending = self._unfinished.pop(0)
            if self.open().resume(pending):
                return

    @Slot(list)
    def _on_picker_library_changed(self, _entries: list[object]) -> None:
        if self.dialog is not None:
            self.dialog.library_changed()

    # --- Load ---------------------------------------------------------------------------------------

    @Slot(str)
    def load(self, path: str) -> bool:
        """Choose ``path`` in the picker and load it with the drafter the picker ranks first for it."""
        self._load_wanted = path
        if self.picker.target_path() == path and self._ranked_for == path:
            return self._load_now()
        if self.picker.target_path() != path and not self.picker.select_target(path):
            self._load_wanted = None
            return False
        return True  # the ranking for it is under way: drafters_ranked loads it

    def _load_now(self) -> bool:
        self._load_wanted = None
        if self.dialog is not None:
            self.dialog.hide()  # the picker's progress bar and the chat are where the load goes on
        self.window.raise_()
        return self.picker.request_load()

    @Slot(int)
    def _on_picker_target_changed(self, _index: int) -> None:
        self._ranked_for = None

    @Slot()
    def _on_picker_drafters_ranked(self) -> None:
        self._ranked_for = self.picker.target_path()
        if self._load_wanted is not None and self._ranked_for == self._load_wanted:
            self._load_now()

    # --- closing ------------------------------------------------------------------------------------

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.window and event.type() == QEvent.Type.Close:
            self._unfinished.clear()
            self._tasks.wait()
            if self.dialog is not None:
                self.dialog.hide()
                self.dialog.shutdown()  # a download stops at its next chunk, its partial file kept for the next start
        return super().eventFilter(watched, event)
