"""The picker's Loading group: where the layers go (GPU layers, the GPU, RPC servers), the context and KV cache,
threads, what a chat past the context does, the fit estimate, Load and Cancel, and the load's progress.

The fit estimate parses the model's tensor table (a second or more for a large file on a busy machine): it runs
on its own worker, one at a time, so no scan or download queues it, and only the latest choice is worked out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from PySide6.QtCore import Qt
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.ceiling.backend import BackendDevice
from app.engine_limits import KV_TYPES
from app.events import LoadProgress
from app.library.gguf_reader import GGUFInfo
from app.params import ALL_GPU_LAYERS, AUTO_GPU_LAYERS, GPU_LAYER_WORDS, MAX_CTX, MAX_GPU_LAYERS, fit_flash_attention
from app.units import format_bytes
from ui.models.devices import DeviceChoice
from ui.tasks import TaskRunner

FIT_READING = "Reading the model file for a fit estimate…"
# What a fit estimate is asked for: target and drafter paths, then context, KV type, GPU layers, flash attention,
# and the devices the worker listed (None: not yet; the machine is probed instead), the GPU and the RPC servers.
FitAsk = tuple[str, str | None, int, str, int, bool, tuple[BackendDevice, ...] | None, int | None, tuple[str, ...]]


def fit_text(target: GGUFInfo, drafter: GGUFInfo | None, n_ctx: int, kv_type: str, n_gpu_layers: int,
             flash_attn: bool, devices: Sequence[BackendDevice] | None = None, main_gpu: int | None = None,
             rpc_servers: Sequence[str] = ()) -> str:
    """The ceiling package's fit estimate (weights + KV + compute buffers per device) in words. ``devices``:
    llama.cpp's devices as the engine worker listed them (the fit then names each GPU and RPC server with its
    free memory); None: this machine's devices as the hardware probe sees them."""
    from app.ceiling.builder import pair_fit
    from app.ceiling.device_fit import choose_gpu_layers, fit_devices

    chosen = ""
    if n_gpu_layers == AUTO_GPU_LAYERS:
        if devices is None:
            n_gpu_layers = ALL_GPU_LAYERS  # no device list yet: the estimate for every layer offloaded
        else:  # the engine's own choice on these devices, before it loads
            layers = choose_gpu_layers(target, n_gpu_layers, n_ctx, devices, kv_type=kv_type, drafter=drafter,
                                       main_gpu=main_gpu, rpc_servers=rpc_servers)
            if layers.error:
                return layers.error
            n_gpu_layers, chosen = layers.n_gpu_layers, layers.note
    try:
        estimate = pair_fit(target, drafter, n_ctx, kv_type=kv_type, n_gpu_layers=n_gpu_layers,
                            flash_attn=flash_attn,
                            devices=fit_devices(devices, main_gpu, rpc_servers) if devices is not None else None)
    except (ValueError, ZeroDivisionError) as exc:
        return f"No fit estimate: {exc}"
    parts = "; ".join(
        f"weights {format_bytes(d.weights)}, KV {format_bytes(d.kv)}, compute {format_bytes(d.compute)}"
        for d in estimate.devices
    )
    return f"{chosen}\n{estimate.message} ({parts})" if chosen else f"{estimate.message} ({parts})"


class GpuLayersSpin(QSpinBox):
    """GPU layers: "auto" (as many as fit, the default), "all", or a count."""

    WORDS: ClassVar[dict[int, str]] = GPU_LAYER_WORDS

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setRange(AUTO_GPU_LAYERS, MAX_GPU_LAYERS)
        self.setValue(AUTO_GPU_LAYERS)

    def textFromValue(self, value: int) -> str:
        return self.WORDS.get(value, str(value))

    def valueFromText(self, text: str) -> int:
        word = text.strip().lower()
        for value, name in self.WORDS.items():
            if word == name:
                return value
        return int(word) if word.lstrip("-").isdigit() else AUTO_GPU_LAYERS

    def validate(self, text: str, pos: int) -> tuple[QValidator.State, str, int]:
        word = text.strip().lower()
        if any(name.startswith(word) for name in self.WORDS.values()) and word:
            state = QValidator.State.Acceptable if word in self.WORDS.values() else QValidator.State.Intermediate
            return state, text, pos
        return super().validate(text, pos)


def show_note(label: QLabel, text: str) -> None:
    """A note row shows only while it has something to say: an empty one would still take a row's height."""
    label.setText(text)
    label.setVisible(bool(text))


class LoadBox(QGroupBox):
    """The Loading group's widgets, the fit estimate for the chosen pair, and the load's progress. The picker
    reads and shows their settings (``ModelPicker._bindings``) and decides when Load can go."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Loading", parent)
        lform = QFormLayout(self)
        self.gpu_layers_spin = GpuLayersSpin(self)
        self.ctx_spin = QSpinBox(self)
        self.ctx_spin.setRange(256, MAX_CTX)
        self.ctx_spin.setSingleStep(1024)
        self.kv_combo = QComboBox(self)
        self.kv_combo.addItems(list(KV_TYPES))
        self.flash_combo = QComboBox(self)
        self.flash_combo.addItems(["auto", "on", "off"])
        self.threads_spin = QSpinBox(self)
        self.threads_spin.setRange(0, 1024)
        self.threads_spin.setSpecialValueText("auto")
        self.fit_label = QLabel(self)
        self.fit_label.setWordWrap(True)
        self.overflow_combo = QComboBox(self)
        self.overflow_combo.addItem("Stop, offer a new chat", "stop")
        self.overflow_combo.addItem("Leave out the oldest messages", "drop_oldest")
        self.overflow_combo.setToolTip(
            "When a chat grows past the context: stop and offer to go on in a new chat with the last message, or "
            "leave the oldest messages out of what the model reads (they stay in the chat)")
        self.reload_check = QCheckBox("Load these on start", self)
        self.reload_check.setToolTip("Load these models when SpecDeck starts")
        self.gpu_note = QLabel(self)
        self.gpu_note.setWordWrap(True)
        self.gpu_note.setVisible(False)
        self.device_choice = DeviceChoice(self)
        lform.addRow("GPU layers", self.gpu_layers_spin)
        lform.addRow(self.gpu_note)
        lform.addRow(self.device_choice)
        lform.addRow("Context size", self.ctx_spin)
        lform.addRow("KV cache type", self.kv_combo)
        lform.addRow("Flash attention", self.flash_combo)
        lform.addRow("CPU threads", self.threads_spin)
        lform.addRow("Chat past the context", self.overflow_combo)
        lform.addRow(self.fit_label)
        lform.addRow(self.reload_check)
        self.load_row = QWidget(self)
        buttons = QHBoxLayout(self.load_row)
        buttons.setContentsMargins(0, 0, 0, 0)
        self.load_button = QPushButton("Load", self.load_row)
        self.cancel_button = QPushButton("Cancel", self.load_row)
        self.cancel_button.setEnabled(False)
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.cancel_button)
        lform.addRow(self.load_row)
        self._form, self._load_row_layout = lform, buttons
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 100)
        self.progress.setVisible(False)
        # Every bar that shows the load: this one, and the window's status bar (always in view, whatever the
        # dock's height). One bar per phase (target, drafter, timing), each from 0 to 100 % with its own text.
        self.progress_bars: list[QProgressBar] = [self.progress]
        self._progress_stage = ""
        self.status_label = QLabel("No model loaded.", self)
        self.status_label.setWordWrap(True)
        for label in (self.fit_label, self.gpu_note, self.status_label):
            label.setTextFormat(Qt.TextFormat.PlainText)  # they name model files and quote their errors
        lform.addRow(self.progress)
        lform.addRow(self.status_label)
        lform.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.backend = "cpu"  # llama.cpp's backend, from the worker's device list: the fit's flash attention
        self._fit_tasks = TaskRunner(self, max_threads=1)
        self._fit_wanted: tuple[FitAsk, GGUFInfo, GGUFInfo | None] | None = None
        self._fit_shown: FitAsk | None = None
        self._fit_running = False

    def take_load_row(self) -> QWidget:
        """Load and Cancel, out of the form, for the window to keep in view below the scrolling settings."""
        self._form.takeRow(self.load_row)
        self.load_row.setParent(None)
        self._load_row_layout.setContentsMargins(9, 6, 9, 6)
        return self.load_row

    # --- the fit estimate ---------------------------------------------------------------------------

    def ask_fit(self, target: tuple[str, GGUFInfo] | None, drafter: tuple[str, GGUFInfo] | None) -> None:
        """Show the fit estimate for this pair (path and header each) at the settings shown: worked out on the
        fit worker, "reading…" until it comes; an estimate that arrives for an earlier choice is dropped.
        ``target`` None: nothing to estimate (no target, or a remote model)."""
        if target is None:
            self._fit_wanted = self._fit_shown = None
            self.fit_label.setText("")
            return
        layers, kv_type = self.gpu_layers_spin.value(), self.kv_combo.currentText()
        choice = self.device_choice
        ask: FitAsk = (target[0], drafter[0] if drafter else None, self.ctx_spin.value(), kv_type, layers,
                       fit_flash_attention(self.flash_combo.currentText(), self.backend, layers, kv_type),
                       choice.devices(), choice.main_gpu(), choice.saved_rpc_servers())
        if self._fit_wanted is not None and self._fit_wanted[0] == ask:
            return
        self._fit_wanted = (ask, target[1], drafter[1] if drafter else None)
        if self._fit_shown is None or self._fit_shown[:2] != ask[:2]:
            self._fit_shown = None
            self.fit_label.setText(FIT_READING)  # another pair's estimate would mislead; a new setting keeps it
        if not self._fit_running:
            self._start_fit()

    def _start_fit(self) -> None:
        if self._fit_wanted is None:
            return
        ask, target, drafter = self._fit_wanted
        n_ctx, kv_type, n_gpu_layers, flash_attn, devices, main_gpu, servers = ask[2:]
        self._fit_running = True
        self._fit_tasks.run(lambda: fit_text(target, drafter, n_ctx, kv_type, n_gpu_layers, flash_attn, devices,
                                             main_gpu, servers),
                            lambda text: self._on_fit_done(ask, text),
                            lambda exc: self._on_fit_done(ask, f"No fit estimate: {exc}"))

    def _on_fit_done(self, ask: FitAsk, text: str) -> None:
        self._fit_running = False
        if self._fit_wanted is None:
            return
        if self._fit_wanted[0] != ask:
            self._start_fit()  # the choice changed meanwhile: only the latest one is worked out
            return
        self._fit_shown = ask
        self.fit_label.setText(text)

    # --- the load's progress ------------------------------------------------------------------------

    def set_loading(self, loading: bool, text: str = "") -> None:
        self.cancel_button.setEnabled(loading)
        self._progress_stage = ""
        for bar in self.progress_bars:
            bar.setVisible(loading)
            bar.setValue(0)
            bar.setFormat("Starting the load…")
        if text:
            self.status_label.setText(text)

    def show_progress(self, event: LoadProgress) -> None:
        """The phase's own progress: the bar starts again at each phase and never goes back within one, and
        its text and the status line say the same."""
        percent = int(100 * max(0.0, min(1.0, event.fraction)))
        if event.stage == self._progress_stage:
            percent = max(percent, self.progress.value())
        self._progress_stage = event.stage
        what = "Timing a pass of each draft width" if event.stage == "timing" else f"Loading the {event.stage}"
        text = f"{what}… {percent}%"
        for bar in self.progress_bars:
            bar.setValue(percent)
            bar.setFormat(text)
        self.status_label.setText(text)

    def set_gpu_offload_available(self, available: bool) -> None:
        """On a CPU-only llama.cpp build, say that "GPU layers" offloads nothing."""
        show_note(self.gpu_note, "" if available else
                  "This llama.cpp build is CPU-only: no layer will be offloaded to a GPU.")
