"""The model picker: targets and drafters from the library (local and a connected server's), the drafter
ranking and compatibility, the drafting settings and Tune, and the Loading group (``ui.models.load_box``: the
load settings, the fit estimate, Load / Cancel and progress). Disk scans and downloads run on a worker thread.
Over 450 lines: the target, the drafter ranking and the settings Load sends depend on each other, and that
dependency is kept in one place."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.engine.chat_template import fallback_name
from app.engine_limits import DEPTH_CAP
from app.errors import AppError, IncompatibleDrafterError, SettingsError
from app.events import Devices, Loaded, drafted_by
from app.library.compat import CompatResult
from app.library.discovery import LibraryEntry, discover
from app.library.gguf_reader import GGUFInfo
from app.library.heads import OWN_MTP_HEADS, HeadOffer
from app.measure.recommend import DrafterReport, Recommendation, drafters_for
from app.params import (
    HISTORY_TOKENS,
    NGRAM_KEY_LENGTH,
    DraftSettings,
    LoadSettings,
)
from app.remote.client import RemoteModel
from app.storage.pair_stats import load_measured, measured_start
from app.storage.settings import AppSettings, setting, with_settings
from app.storage.tuned import TunedSettings, load_tuned
from app.units import format_bytes, format_count
from ui.dashboard.sweep import TuneDialog, TunePair
from ui.flow_layout import FlowLayout
from ui.models.load_box import LoadBox, show_note
from ui.plain_text import plain_tooltip
from ui.tasks import TaskRunner

if TYPE_CHECKING:
    from ui.bridge import EngineBridge

NO_DRAFTER = "(no drafter model)"
TOOLTIP_ROLE = Qt.ItemDataRole.ToolTipRole
REMOTE_NOTE = ("Speculation on a remote server is the server's own, configured there; SpecDeck shows what it "
               "reports.")


def base_model_note(architecture: str) -> str:
    """What a model without a chat template gets, in the words the chat's own notice uses."""
    return ("No chat template: this looks like a base model, which continues text rather than answering. "
            f"Completion mode is on for it; in chat mode its architecture's known format "
            f"({fallback_name(architecture)}) is used.")


def describe_model(info: GGUFInfo) -> str:
    """arch, parameters, quantization, file size, trained context: one line (and a base model says so)."""
    line = (f"{info.architecture}, {format_count(info.n_params)} params, {info.quantization}, "
            f"{format_bytes(info.file_size)}, ctx {info.context_length}")
    return line if info.has_chat_template else f"{line}\n{base_model_note(info.architecture)}"


class ModelPicker(QWidget):
    load_requested = Signal(LoadSettings)
    cancel_load_requested = Signal()
    library_changed = Signal(list)  # list[LibraryEntry], after each scan and when remote models come or go
    drafters_ranked = Signal()  # the drafter list and badge are up to date for the chosen target
    folders_changed = Signal(tuple)  # tuple[str, ...]: the user's extra model folders
    demo_install_finished = Signal(bool)  # ok?
    error_raised = Signal(str)
    remote_chosen = Signal(object)  # RemoteModel, or None when the choice moves back to a local model

    def __init__(self, tasks: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._tasks = tasks
        self.entries: list[LibraryEntry] = []
        self.folders: tuple[str, ...] = ()
        self._report: DrafterReport | None = None
        self._report_for: str | None = None
        self._wanted_target: str | None = None
        self._wanted_drafter: str | None = None
        # Until the user picks a drafter (or settings name a pair), the best compatible one predicted to pay
        # is chosen for them: speculation is on from the first answer.
        self._drafter_auto = True
        self._saved = AppSettings()  # the settings last applied: Load keeps what no widget shows (n_batch, main GPU)
        self._scan_serial = 0
        self._rank_serial = 0
        self.scanning = False
        self.ranking = False  # the drafters for the chosen target are being ranked (drafters_ranked ends it)
        self.loading = False
        self.gpu_offload_available: bool | None = None  # None: not known yet
        self.remote_models: tuple[RemoteModel, ...] = ()  # a connected server's, listed after the local ones
        self._chosen_remote: RemoteModel | None = None
        self._build()

    # --- layout -------------------------------------------------------------------------------------

    def _build(self) -> None:
        outer = QVBoxLayout(self)

        models = QGroupBox("Models", self)
        form = QFormLayout(models)
        self.target_combo = QComboBox(models)
        self.target_combo.currentIndexChanged.connect(self._on_target_combo_current_index_changed)
        self.target_info = QLabel(models)
        self.target_info.setWordWrap(True)
        self.target_info.setTextFormat(Qt.TextFormat.PlainText)
        self.drafter_combo = QComboBox(models)
        self.drafter_combo.currentIndexChanged.connect(self._on_drafter_combo_current_index_changed)
        self.drafter_combo.activated.connect(self._on_drafter_combo_activated)
        self.drafter_info = QLabel(models)
        self.drafter_info.setWordWrap(True)
        self.drafter_info.setTextFormat(Qt.TextFormat.PlainText)
        self.compat_badge = QLabel(models)
        self.compat_badge.setWordWrap(True)
        self.compat_badge.setObjectName("compat_badge")
        for label in (self.target_info, self.drafter_info, self.compat_badge):
            label.setTextFormat(Qt.TextFormat.PlainText)  # GGUF metadata is untrusted: never rich text
            label.setVisible(False)  # until there is something to say (show_note)
        # The wrapped texts are whole rows: an empty-label row of wrapped text is given too little height, and
        # the base-model note and the incompatible drafter's reason were cut off.
        form.addRow("Target", self.target_combo)
        form.addRow(self.target_info)
        form.addRow("Drafter", self.drafter_combo)
        form.addRow(self.drafter_info)
        form.addRow(self.compat_badge)
        self.remote_note = QLabel(REMOTE_NOTE, models)
        self.remote_note.setWordWrap(True)
        self.remote_note.setTextFormat(Qt.TextFormat.PlainText)
        self.remote_note.setVisible(False)
        form.addRow(self.remote_note)  # a whole row: an empty-label row of wrapped text is given too little height
        ngram_row = QHBoxLayout()
        self.ngram_check = QCheckBox("Suffix drafter, shortest match", models)
        self.ngram_check.setToolTip(
            "Drafts text that repeats: the longest earlier passage (the prompt, the answer so far and, when "
            "checked below, earlier answers) that ends like the text so far, matching at least this many tokens. "
            "Free to run; stacks with a drafter model (the suffix drafter first, the model fills the rest).")
        self.ngram_spin = QSpinBox(models)
        self.ngram_spin.setRange(1, 16)
        self.ngram_spin.setValue(NGRAM_KEY_LENGTH)
        ngram_row.addWidget(self.ngram_check)
        ngram_row.addWidget(self.ngram_spin)
        form.addRow(ngram_row)
        self.history_check = QCheckBox("Draft from earlier answers", models)
        self.history_check.setToolTip(
            "The suffix drafter also reads your earlier answers from the chat history when the model loads, so "
            "text you had the model write before is drafted again. Applies at the next Load.")
        form.addRow(self.history_check)
        folder_buttons = QWidget(models)
        folder_row = FlowLayout(folder_buttons, h_spacing=6, v_spacing=4)
        self.add_folder_button = QPushButton("Add folder…", models)
        self.add_folder_button.clicked.connect(self._on_add_folder_button_clicked)
        self.demo_button = QPushButton("Install demo models", models)
        self.demo_button.clicked.connect(self._on_demo_button_clicked)
        self.rescan_button = QPushButton("Rescan", models)
        self.rescan_button.clicked.connect(self._on_rescan_button_clicked)
        self.find_models_button = QPushButton("Find models…", models)  # opens the Hub view (ui.hub.window_side)
        for button in (self.add_folder_button, self.find_models_button, self.demo_button, self.rescan_button):
            folder_row.addWidget(button)
        form.addRow(folder_buttons)
        outer.addWidget(models)

        draft = QGroupBox("Drafting", self)
        dform = QFormLayout(draft)
        self.adaptive_check = QCheckBox("Adaptive draft depth", draft)
        self.k_spin = QSpinBox(draft)
        self.k_spin.setRange(0, DEPTH_CAP)
        self.k_max_spin = QSpinBox(draft)
        self.k_max_spin.setRange(0, DEPTH_CAP)
        self.adaptive_check.toggled.connect(self._on_adaptive_check_toggled)
        dform.addRow(self.adaptive_check)
        dform.addRow("Fixed depth k", self.k_spin)
        dform.addRow("Maximum depth", self.k_max_spin)
        self.tuned_label = QLabel(draft)  # what `specdeck tune` measured for the chosen pair
        self.tuned_label.setTextFormat(Qt.TextFormat.PlainText)
        self.tuned_label.setVisible(False)  # until a tune has been measured for the pair (show_note)
        self._tuned_for: tuple[str | None, str | None] | None = None
        self._tuned: TunedSettings | None = None
        dform.addRow(self.tuned_label)
        tune_row = QHBoxLayout()
        self.use_tuned_button = QPushButton("Use tuned settings", draft)
        self.use_tuned_button.setVisible(False)
        self.use_tuned_button.clicked.connect(self._on_use_tuned_button_clicked)
        self.tune_button = QPushButton("Tune…", draft)
        self.tune_button.setToolTip("Find the fastest drafting settings for the loaded pair on your own prompts")
        self.tune_button.setEnabled(False)
        self.tune_button.clicked.connect(self._on_tune_button_clicked)
        self.tune_dialog: TuneDialog | None = None
        self._loaded_pair: TunePair | None = None
        self.tune_engine: EngineBridge | None = None  # the window's engine, which Tune measures on
        tune_row.addWidget(self.use_tuned_button)
        tune_row.addWidget(self.tune_button)
        dform.addRow(tune_row)
        outer.addWidget(draft)

        self.load_box = LoadBox(self)
        box = self.load_box
        box.device_choice.choice_changed.connect(self._on_setting_changed)
        box.load_button.clicked.connect(self._on_load_button_clicked)
        box.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        outer.addWidget(box)
        outer.addStretch(1)
        for combo in (self.target_combo, self.drafter_combo):
            # Long file names must not widen the dock: the combo shows what fits, the list shows all.
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(12)
        for f in (form, dform):
            f.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)

        for spin in (box.ctx_spin, box.gpu_layers_spin):
            spin.valueChanged.connect(self._on_setting_changed)
        box.kv_combo.currentIndexChanged.connect(self._on_setting_changed)
        box.flash_combo.currentIndexChanged.connect(self._on_setting_changed)
        # The defaults live in AppSettings alone: a fresh home shows them, a saved file replaces them.
        defaults = AppSettings()
        for name, (_read, show) in self._bindings().items():
            show(setting(defaults, name))
        self._on_adaptive_check_toggled(self.adaptive_check.isChecked())

    # --- settings in and out ------------------------------------------------------------------------

    def _bindings(self) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
        """Each saved setting the picker shows, by its path in AppSettings: how to read it from its widgets and
        how to show it. The one map between widgets and settings (saving, restoring and Load all go through it)."""
        box = self.load_box
        return {
            "load.draft.ngram": (lambda: self.ngram_spin.value() if self.ngram_check.isChecked() else 0,
                                 self._show_ngram),
            "load.draft.history_tokens": (lambda: HISTORY_TOKENS if self.history_check.isChecked() else 0,
                                          lambda tokens: self.history_check.setChecked(tokens > 0)),
            "load.draft.adaptive": (self.adaptive_check.isChecked, self.adaptive_check.setChecked),
            "load.draft.k": (self.k_spin.value, self.k_spin.setValue),
            "load.draft.k_max": (self.k_max_spin.value, self.k_max_spin.setValue),
            "load.n_gpu_layers": (box.gpu_layers_spin.value, box.gpu_layers_spin.setValue),
            "load.n_ctx": (box.ctx_spin.value, lambda v: box.ctx_spin.setValue(max(box.ctx_spin.minimum(), v))),
            "load.kv_type": (box.kv_combo.currentText, box.kv_combo.setCurrentText),
            "load.flash_attn": (box.flash_combo.currentText, box.flash_combo.setCurrentText),
            "load.n_threads": (box.threads_spin.value, box.threads_spin.setValue),
            "load.main_gpu": (box.device_choice.main_gpu, box.device_choice.show_main_gpu),
            "load.rpc_servers": (box.device_choice.saved_rpc_servers, box.device_choice.show_rpc_servers),
            "reload_last_pair_on_start": (box.reload_check.isChecked, box.reload_check.setChecked),
            "context_overflow": (box.overflow_combo.currentData, self._show_overflow),
        }

    def _show_overflow(self, policy: str) -> None:
        self.load_box.overflow_combo.setCurrentIndex(max(0, self.load_box.overflow_combo.findData(policy)))

    def _show_ngram(self, ngram: int) -> None:
        self.ngram_check.setChecked(ngram > 0)
        if ngram > 0:
            self.ngram_spin.setValue(ngram)

    def shown_values(self) -> dict[str, Any]:
        return {name: read() for name, (read, _show) in self._bindings().items()}

    def apply_settings(self, s: AppSettings) -> None:
        self._saved = s
        self.folders = s.model_folders
        self._wanted_target = s.load.target_path or None
        self._wanted_drafter = OWN_MTP_HEADS if s.load.draft.mtp else s.load.draft.drafter_path
        self._drafter_auto = not s.load.target_path  # a saved pair is the user's choice, drafter or none
        for name, (_read, show) in self._bindings().items():
            show(setting(s, name))

    def update_settings(self, s: AppSettings) -> AppSettings:
        chosen = {} if self.remote_model() else {  # a remote model has no drafter here: keep the saved one
            "load.draft.drafter_path": self.drafter_path(), "load.draft.mtp": self.own_mtp_heads_chosen()}
        return replace(with_settings(s, {"load.target_path": self.target_path() or s.load.target_path, **chosen,
                                         **self.shown_values()}), model_folders=self.folders)

    def target_path(self) -> str | None:
        data = self.target_combo.currentData()
        return data if isinstance(data, str) and data else None

    def remote_model(self) -> RemoteModel | None:
        data = self.target_combo.currentData()
        return data if isinstance(data, RemoteModel) else None

    def set_remote_models(self, models: Sequence[RemoteModel]) -> None:
        """List a connected server's models after the local ones (none: it was disconnected)."""
        chosen = self.remote_model()
        self.remote_models = tuple(models)
        self.target_combo.blockSignals(True)
        for index in reversed(range(self.target_combo.count())):
            if isinstance(self.target_combo.itemData(index), RemoteModel):
                self.target_combo.removeItem(index)
        self._add_remote_items()
        self.target_combo.blockSignals(False)
        keep = self._remote_index(chosen) if chosen else -1
        if keep >= 0:
            self.target_combo.setCurrentIndex(keep)
        elif chosen is not None:  # its server is gone: back to the local model the settings name
            index = self.target_combo.findData(self._wanted_target) if self._wanted_target else -1
            self.target_combo.setCurrentIndex(-1)
            self.target_combo.setCurrentIndex(max(index, 0) if self.target_combo.count() else -1)
        self.library_changed.emit(self.entries)  # what can be chosen changed (the window may have no local model)

    def select_remote(self, model: RemoteModel) -> bool:
        index = self._remote_index(model)
        if index >= 0:
            self.target_combo.setCurrentIndex(index)
        return index >= 0

    def _remote_index(self, model: RemoteModel | None) -> int:
        return next((i for i in range(self.target_combo.count()) if self.target_combo.itemData(i) == model), -1)

    def _add_remote_items(self) -> None:
        for model in self.remote_models:
            self.target_combo.addItem(model.label, model)
            self.target_combo.setItemData(self.target_combo.count() - 1,
                                          plain_tooltip(f"{model.engine} at {model.base_url}"), TOOLTIP_ROLE)

    def drafter_path(self) -> str | None:
        data = self.drafter_combo.currentData()
        return str(data) if data and data != OWN_MTP_HEADS else None

    def own_mtp_heads_chosen(self) -> bool:
        return bool(self.drafter_combo.currentData() == OWN_MTP_HEADS)

    def target_entry(self) -> LibraryEntry | None:
        """The chosen target's library entry (None when none is chosen, or it is a remote model)."""
        return self._entry(self.target_path())

    def _entry(self, path: str | None) -> LibraryEntry | None:
        return next((e for e in self.entries if e.path == path), None) if path else None

    def compat_for(self, drafter: str | None) -> CompatResult | None:
        """The compatibility decision for a drafter with the chosen target; None when not known yet."""
        if drafter is None or self._report is None or self._report_for != self.target_path():
            return None
        for entry, result in self._report.refused:
            if entry.path == drafter:
                return result
        if any(r.kind == "model" and r.drafter_path == drafter for r in self._report.recommendations):
            return CompatResult(True, "", "same vocabulary")
        for offer in self._report.heads:
            if offer.path == drafter:
                return CompatResult(offer.fits, "" if offer.fits else "head", offer.refusal or "it fits this target")
        return None

    def load_settings(self) -> LoadSettings:
        """What Load would send; raises SettingsError or IncompatibleDrafterError with the reason."""
        target = self.target_path()
        if self.remote_model() is not None:
            raise SettingsError("The chosen model runs on its server: there is nothing to load. Choose a local "
                                "model to load one.")
        if target is None:
            raise SettingsError("Choose a target model first.")
        drafter = self.drafter_path()
        if drafter is not None:
            result = self.compat_for(drafter)
            if result is None:
                raise SettingsError(
                    "The drafter is still being checked against the target; try again in a moment.")
            if not result.ok:
                raise IncompatibleDrafterError(
                    f"This drafter cannot speculate for this target: {result.reason.rstrip('.')}.")
        load = self.update_settings(self._saved).load
        return replace(load, draft=replace(load.draft, model_start=measured_start(target, drafter))).validate()

    # --- library ------------------------------------------------------------------------------------

    def rescan(self) -> None:
        self._scan_serial += 1
        serial = self._scan_serial
        folders = self.folders
        self.scanning = True
        self.load_box.status_label.setText("Looking for models…")
        self._tasks.run(lambda: discover(folders), lambda r: self._on_scan_done(serial, r),
                        self._on_task_failed)

    def _on_scan_done(self, serial: int, entries: list[LibraryEntry]) -> None:
        if serial != self._scan_serial:
            return
        self.scanning = False
        wanted = self.target_path() or self._wanted_target
        self.entries = entries
        self.target_combo.blockSignals(True)
        self.target_combo.clear()
        for entry in entries:
            if entry.is_model and entry.info is not None:
                self.target_combo.addItem(f"{entry.label}", entry.path)
                self.target_combo.setItemData(self.target_combo.count() - 1, plain_tooltip(describe_model(entry.info)),
                                              TOOLTIP_ROLE)
        self._add_remote_items()
        self.target_combo.blockSignals(False)
        broken = [e for e in entries if not e.usable]
        models = sum(1 for e in entries if e.is_model)
        note = f"{models} model{'s' if models != 1 else ''} found"
        if broken:
            files = f"{len(broken)} file{'s' if len(broken) != 1 else ''}"
            note += f"; {files} could not be used: {broken[0].error}"
        self.load_box.status_label.setText(note + ".")
        self._offer_demo_models()
        index = self.target_combo.findData(wanted) if wanted else -1
        if index < 0 and self.target_combo.count():
            index = 0
        remote = self._remote_index(self._chosen_remote)
        if remote >= 0:  # the remote model stays chosen (and the chat on its server)
            self.target_combo.blockSignals(True)
            self.target_combo.setCurrentIndex(remote)
            self.target_combo.blockSignals(False)
        else:
            self.target_combo.setCurrentIndex(-1)
            self.target_combo.setCurrentIndex(index)
        self.library_changed.emit(entries)

    def _offer_demo_models(self) -> None:
        """"Install demo models" only while one of them is missing from the library."""
        from app.library.demo_install import demo_model_paths

        found = {os.path.realpath(e.path) for e in self.entries if e.is_model and e.usable}
        self.demo_button.setVisible(not all(os.path.realpath(p) in found for p in demo_model_paths()))

    def has_models(self) -> bool:
        return any(e.is_model for e in self.entries)

    def add_folder(self, folder: str) -> None:
        if folder and folder not in self.folders:
            self.folders = (*self.folders, folder)
            self.folders_changed.emit(self.folders)
        self.rescan()

    def select_target(self, path: str | os.PathLike[str]) -> bool:
        index = self.target_combo.findData(str(path))
        if index >= 0:
            self.target_combo.setCurrentIndex(index)
        return index >= 0

    def select_drafter(self, path: str | os.PathLike[str] | None) -> bool:
        self._wanted_drafter = str(path) if path else None
        self._drafter_auto = False
        index = self.drafter_combo.findData(str(path)) if path else 0
        if index >= 0:
            self.drafter_combo.setCurrentIndex(index)
        return index >= 0

    @Slot(int)
    def _on_target_combo_current_index_changed(self, _index: int) -> None:
        remote = self.remote_model()
        if remote != self._chosen_remote:
            self._chosen_remote = remote
            self._show_remote(remote)
            self.remote_chosen.emit(remote)
        self.ranking = False
        if remote is not None:
            return
        entry = self._entry(self.target_path())
        self._report = None
        self._report_for = None
        self.drafter_combo.blockSignals(True)
        self.drafter_combo.clear()
        self.drafter_combo.addItem(NO_DRAFTER, None)
        self.drafter_combo.blockSignals(False)
        if entry is None or entry.info is None:
            show_note(self.target_info, "")
            self._refresh()
            return
        show_note(self.target_info, describe_model(entry.info))
        show_note(self.compat_badge, "Checking drafters…")
        self.ranking = True
        self._rank_serial += 1
        serial = self._rank_serial
        info, entries, path = entry.info, list(self.entries), entry.path
        self._tasks.run(lambda: drafters_for(info, entries, load_measured()),
                        lambda r: self._on_rank_done(serial, path, r),
                        self._on_task_failed)
        self._refresh()

    def _on_rank_done(self, serial: int, target: str, report: DrafterReport) -> None:
        if serial != self._rank_serial or target != self.target_path():
            return
        self.ranking = False
        self._report = report
        self._report_for = target
        wanted = self.drafter_path() or self._wanted_drafter
        self.drafter_combo.blockSignals(True)
        self.drafter_combo.clear()
        self.drafter_combo.addItem(NO_DRAFTER, None)
        for rec in report.recommendations:
            if rec.kind == "model" and rec.drafter_path:
                self.drafter_combo.addItem(self._rec_label(rec), rec.drafter_path)
                self.drafter_combo.setItemData(self.drafter_combo.count() - 1, plain_tooltip(rec.note), TOOLTIP_ROLE)
        for entry, result in report.refused:
            self.drafter_combo.addItem(f"✗ {entry.label} (incompatible)", entry.path)
            self.drafter_combo.setItemData(self.drafter_combo.count() - 1, plain_tooltip(result.reason), TOOLTIP_ROLE)
            self._disable_item(self.drafter_combo.count() - 1)  # listed to say why, never to be chosen
        # Trained heads (the target's own MTP heads, EAGLE-3 and DFlash files): those that fit in their ranking's
        # order, with its prediction, then those that do not.
        predicted = {r.drafter_path or OWN_MTP_HEADS: r for r in report.recommendations if r.kind in ("mtp", "head")}
        order = list(predicted)

        def rank(offer: HeadOffer) -> int:
            key = offer.path or OWN_MTP_HEADS
            return order.index(key) if key in predicted else len(order)

        for offer in sorted(report.heads, key=rank):
            head_rec = predicted.get(offer.path or OWN_MTP_HEADS)
            label = self._rec_label(head_rec) if head_rec is not None else offer.label
            self.drafter_combo.addItem(label if offer.fits else f"✗ {offer.label} (does not fit)",
                                       offer.path or OWN_MTP_HEADS)
            self.drafter_combo.setItemData(self.drafter_combo.count() - 1,
                                           plain_tooltip(offer.refusal or f"Drafts for this target: {offer.label}."),
                                           TOOLTIP_ROLE)
            if offer.path is None and not offer.fits:  # nothing to load: the reason is its tooltip
                self._disable_item(self.drafter_combo.count() - 1)
        ngram = next((r for r in report.recommendations if r.kind == "ngram"), None)
        if ngram is not None:
            self.ngram_check.setToolTip(plain_tooltip(f"{ngram.note} Stacks with a drafter model."))
        if wanted:
            index = self.drafter_combo.findData(wanted)
        else:
            index = 1 if self._drafter_auto and self._auto_drafter(report) else 0
        self.drafter_combo.setCurrentIndex(max(0, index))
        self.drafter_combo.blockSignals(False)
        self._apply_tuned()
        self._refresh()
        self.drafters_ranked.emit()

    def _disable_item(self, index: int) -> None:
        model = self.drafter_combo.model()
        if isinstance(model, QStandardItemModel):
            item = model.item(index)
            if item is not None:
                item.setEnabled(False)

    @staticmethod
    def _auto_drafter(report: DrafterReport) -> bool:
        """Whether the top-ranked drafter model (the list's first after "no drafter") is predicted to pay."""
        best = next((r for r in report.recommendations if r.kind == "model" and r.drafter_path), None)
        return best is not None and best.speedup > 1.0

    @Slot(int)
    def _on_drafter_combo_activated(self, _index: int) -> None:
        self._drafter_auto = False  # the user chose: keep their choice, "no drafter" included

    def _show_remote(self, remote: RemoteModel | None) -> None:
        """A remote model: drafting is the server's, so the drafter controls are off and say why."""
        for widget in (self.drafter_combo, self.ngram_check, self.ngram_spin, self.history_check, self.adaptive_check,
                       self.k_max_spin):
            widget.setEnabled(remote is None)
            widget.setToolTip(REMOTE_NOTE if remote else "")
        self.k_spin.setEnabled(remote is None and not self.adaptive_check.isChecked())
        self.remote_note.setVisible(remote is not None)
        if remote is None:
            return
        self._rank_serial += 1  # a ranking still running was for a local target
        self._report, self._report_for, self._tuned_for = None, None, None
        self.drafter_combo.blockSignals(True)
        self.drafter_combo.clear()
        self.drafter_combo.addItem(NO_DRAFTER, None)
        self.drafter_combo.blockSignals(False)
        show_note(self.target_info, f"Served by {remote.engine} at {remote.where}; nothing is loaded here.")
        show_note(self.drafter_info, "")
        show_note(self.tuned_label, "")
        self._refresh()

    @staticmethod
    def _rec_label(rec: Recommendation) -> str:
        name = Path(rec.name).name
        if rec.acceptance_source == "measured: drafted nothing":
            return f"{name} — drafted nothing here"
        guess = " (a guess: not yet measured)" if rec.acceptance_source == "default" else ""
        return f"{name} — predicted {rec.speedup:.2f}× at k={rec.best_k}{guess}"

    @Slot(int)
    def _on_drafter_combo_current_index_changed(self, _index: int) -> None:
        self._wanted_drafter = self.drafter_path()
        self._apply_tuned()
        self._refresh()

    def _apply_tuned(self, *, again: bool = False) -> None:
        """Say what `specdeck tune` measured for the chosen pair, and offer its settings. They are applied
        only when the user asks (Use tuned settings, or a tune run in the window): choosing the pair, at
        start-up too, keeps the user's own drafting settings."""
        pair = (self.target_path(), self.drafter_path())
        if pair == self._tuned_for and not again:
            return
        self._tuned_for = pair
        self._tuned = tuned = load_tuned(pair[0], pair[1]) if pair[0] else None
        self.use_tuned_button.setVisible(tuned is not None)
        if tuned is None:
            show_note(self.tuned_label, "")
            return
        without = " (faster without this drafter)" if pair[1] and not tuned.draft.drafter_path else ""
        show_note(self.tuned_label, tuned.summary() + without)

    def use_draft_settings(self, draft: DraftSettings) -> None:
        """Show ``draft``'s suffix-drafter match and depth settings (Load sends them); later changes are the user's."""
        bindings = self._bindings()
        for name in ("ngram", "adaptive", "k", "k_max"):
            bindings[f"load.draft.{name}"][1](getattr(draft, name))

    @Slot()
    def _on_use_tuned_button_clicked(self) -> None:
        if self._tuned is not None:
            self.use_draft_settings(self._tuned.draft)

    @Slot()
    def _on_tune_button_clicked(self) -> None:
        self.open_tune()

    def open_tune(self) -> TuneDialog | None:
        """The Tune window for the loaded pair (one at a time); None while nothing has been loaded."""
        if self._loaded_pair is None:
            return None
        if self.tune_dialog is None or self.tune_dialog.pair != self._loaded_pair:
            if self.tune_dialog is not None:
                self.tune_dialog.close()
            self.tune_dialog = TuneDialog(self._loaded_pair, self.tune_engine, self)
            self.tune_dialog.use_settings.connect(self._on_tune_dialog_use_settings)
            self.tune_dialog.finished_sweep.connect(self._on_tune_dialog_finished_sweep)
        self.tune_dialog.show()
        self.tune_dialog.raise_()
        return self.tune_dialog

    @Slot(DraftSettings)
    def _on_tune_dialog_use_settings(self, draft: DraftSettings) -> None:
        self.use_draft_settings(draft)

    @Slot(object)
    def _on_tune_dialog_finished_sweep(self, _report: object) -> None:
        self._apply_tuned(again=True)  # the winner was saved: show what it gave

    @Slot()
    def _on_setting_changed(self, *_args: object) -> None:
        self._refresh()

    @Slot(bool)
    def _on_adaptive_check_toggled(self, adaptive: bool) -> None:
        self.k_spin.setEnabled(not adaptive and self.remote_model() is None)

    def _refresh(self) -> None:
        """Badge, drafter description, fit estimate and the Load button for the current choice."""
        target = self._entry(self.target_path())
        drafter_path = self.drafter_path()
        drafter = self._entry(drafter_path)
        show_note(self.drafter_info, describe_model(drafter.info) if drafter and drafter.info else "")
        result = self.compat_for(drafter_path)
        if self.remote_model() is not None:
            show_note(self.compat_badge, "")
        elif drafter_path is None:
            checking = self._report is None and target is not None
            show_note(self.compat_badge, "Checking drafters…" if checking else "")
        elif result is None:
            show_note(self.compat_badge, "Checking compatibility…")
        elif result.ok:
            show_note(self.compat_badge, "✓ Compatible with the target.")
        else:
            show_note(self.compat_badge, f"✗ Incompatible: {result.reason}. Load refuses this pair.")
        local = self.remote_model() is None
        self.load_box.ask_fit((target.path, target.info) if local and target and target.info else None,
                              (drafter.path, drafter.info) if drafter and drafter.info else None)
        can_load = target is not None and (drafter_path is None or bool(result and result.ok))
        self.load_box.load_button.setEnabled(can_load and not self.loading)

    # --- loading ------------------------------------------------------------------------------------

    @Slot()
    def _on_load_button_clicked(self) -> None:
        self.request_load()

    def request_load(self) -> bool:
        try:
            settings = self.load_settings()
        except AppError as exc:
            self.load_box.status_label.setText(str(exc))
            self.error_raised.emit(str(exc))
            return False
        self.load_requested.emit(settings)
        return True

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        self.cancel_load_requested.emit()

    def set_loading(self, loading: bool, text: str = "") -> None:
        self.loading = loading
        self.load_box.set_loading(loading, text)
        self._refresh()

    def show_loaded(self, event: Loaded) -> None:
        self.set_loading(False)
        engine_load = self.tune_engine.last_load if self.tune_engine is not None else None
        self._loaded_pair = TunePair(engine_load if engine_load is not None else LoadSettings(
            event.target.path, DraftSettings(drafter_path=event.drafter.path if event.drafter else None),
            n_ctx=event.n_ctx, n_threads=self.load_box.threads_spin.value()))
        self.tune_button.setEnabled(True)
        if not event.gpu_offload:
            self.set_gpu_offload_available(False)
        drafts = drafted_by(event)
        self.load_box.status_label.setText(
            f"Loaded {Path(event.target.path).name}"
            + (f" with {Path(drafts).name}" if drafts else " (no drafter)")
            + f" on {event.backend}, context {event.n_ctx}, in {event.load_seconds:.1f} s."
        )

    def show_devices(self, event: Devices) -> None:
        """llama.cpp's devices as the engine worker listed them: the GPU choice, the RPC servers' memory, and
        the backend whose flash-attention rule the fit follows."""
        self.load_box.backend = event.backend
        self.set_gpu_offload_available(event.gpu_offload)
        self.load_box.device_choice.show_devices(event.devices, event.error)

    def set_gpu_offload_available(self, available: bool) -> None:
        """On a CPU-only llama.cpp build, say that "GPU layers" offloads nothing."""
        self.gpu_offload_available = available
        self.load_box.set_gpu_offload_available(available)

    # --- folders and demo models --------------------------------------------------------------------

    @Slot()
    def _on_add_folder_button_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of GGUF models")
        if folder:
            self.add_folder(folder)

    @Slot()
    def _on_rescan_button_clicked(self) -> None:
        self.rescan()

    @Slot()
    def _on_demo_button_clicked(self) -> None:
        self.install_demo_models()

    def install_demo_models(self) -> None:
        from app.library.demo_install import install_demo_models

        self.demo_button.setEnabled(False)
        self.load_box.status_label.setText("Installing the demo models (about 350 MB)…")
        self._tasks.run(install_demo_models, self._on_demo_done, self._on_demo_failed)

    def _on_demo_done(self, paths: Sequence[Path]) -> None:
        self.demo_button.setEnabled(True)
        if paths and not self.target_path():
            self._wanted_target = str(paths[0])
        self.demo_install_finished.emit(True)
        self.rescan()

    def _on_demo_failed(self, exc: Exception) -> None:
        self.demo_button.setEnabled(True)
        self.load_box.status_label.setText(str(exc))
        self.error_raised.emit(str(exc))
        self.demo_install_finished.emit(False)

    def _on_task_failed(self, exc: Exception) -> None:
        self.scanning = False
        self.ranking = False  # a failed ranking: Load goes without a drafter model
        self.load_box.status_label.setText(str(exc))
        self.error_raised.emit(str(exc) if isinstance(exc, AppError) else f"{type(exc).__name__}: {exc}")
