"""Where a model's layers go: llama.cpp's devices as the engine worker lists them (name, kind, memory), the
choice between all GPUs (split by free memory) and one GPU, and the llama.cpp RPC servers that take layers
over the network.

Pure presentation of the list it is given (``show_devices``): the window asks the worker (the GUI process
never loads llama.cpp) and hands the answer over.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QWidget

from app.ceiling.backend import BackendDevice
from app.ceiling.memory import is_rpc, offload_devices
from app.errors import SettingsError
from app.params import parse_rpc_servers
from app.units import format_bytes

# Short, to fit the narrow dock; the item's tooltip says how the layers are split.
ALL_GPUS = "All GPUs"
ALL_DEVICES = "All devices"
SPLIT_NOTE = "llama.cpp splits the layers over every {what} by its free memory"
KINDS = {"cpu": "CPU", "gpu": "GPU", "igpu": "integrated GPU", "accel": "accelerator"}
ASKING = "Asking the engine for llama.cpp's devices…"


def describe_device(device: BackendDevice) -> str:
    """One device in a line: name, what it is, its memory."""
    kind = "RPC server" if is_rpc(device) else KINDS.get(device.type, device.type)
    what = f"{device.name} — {kind}" + (f", {device.description}" if device.description else "")
    if device.memory_total:
        free = device.memory_free if device.memory_free is not None else device.memory_total
        return f"{what}: {format_bytes(free)} free of {format_bytes(device.memory_total)}"
    return f"{what}: memory not reported"


def gpu_label(index: int, device: BackendDevice) -> str:
    memory = f", {format_bytes(device.memory_free)} free" if device.memory_free else ""
    return f"GPU {index}: {device.name}" + (f" ({device.description})" if device.description else "") + memory


class DeviceChoice(QWidget):
    """The GPU choice, the RPC servers and the device list (a group of rows in the picker's Loading form)."""

    choice_changed = Signal()  # the GPU chosen or the RPC servers changed: the fit estimate follows
    devices_wanted = Signal(tuple)  # tuple[str, ...]: list llama.cpp's devices again, with these RPC servers

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._devices: tuple[BackendDevice, ...] | None = None  # None: the worker has not answered yet
        self._wanted_gpu: int | None = None  # the saved choice, kept until the list says whether it exists
        self._note = ""
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.gpu_combo = QComboBox(self)
        self.gpu_combo.addItem(ALL_GPUS, None)
        self.gpu_combo.setToolTip(f"All GPUs: {SPLIT_NOTE.format(what='GPU')}. One GPU: that GPU alone holds the "
                                  "offloaded layers.")
        self.gpu_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.gpu_combo.setMinimumContentsLength(12)
        self.gpu_combo.currentIndexChanged.connect(self._on_gpu_combo_current_index_changed)
        self.rpc_edit = QLineEdit(self)
        self.rpc_edit.setPlaceholderText("host:port, host:port")
        self.rpc_edit.setToolTip(
            "llama.cpp RPC servers (rpc-server, started on other machines) that take the model's layers, split "
            "by their free memory. Every pass crosses the network to them. Empty: this machine only. Needs llama.cpp "
            "built with RPC (python3 bootstrap.py --build rpc).")
        self.rpc_edit.editingFinished.connect(self._on_rpc_edit_editing_finished)
        self.rpc_button = QPushButton("Check", self)
        self.rpc_button.setToolTip("Ask the RPC servers for their devices and memory")
        self.rpc_button.clicked.connect(self._on_rpc_button_clicked)
        rpc_row = QHBoxLayout()
        rpc_row.addWidget(self.rpc_edit, 1)
        rpc_row.addWidget(self.rpc_button)
        self.devices_label = QLabel(ASKING, self)
        self.devices_label.setObjectName("device_list")
        self.devices_label.setWordWrap(True)
        self.devices_label.setTextFormat(Qt.TextFormat.PlainText)  # names and errors come from other programs
        form.addRow("GPU", self.gpu_combo)
        form.addRow(QLabel("RPC servers", self))  # a row of its own: host:port lists are long
        form.addRow(rpc_row)
        form.addRow(self.devices_label)
        self._shown_servers: tuple[str, ...] = ()

    # --- the list ---------------------------------------------------------------------------------------

    def show_devices(self, devices: Sequence[BackendDevice], error: str | None = None) -> None:
        """Show llama.cpp's devices (the RPC servers' included) and offer one GPU where there are GPUs."""
        wanted = self._wanted_gpu
        self._devices = tuple(devices)
        gpus = self.local_gpus()
        self.gpu_combo.blockSignals(True)
        self.gpu_combo.clear()
        self.gpu_combo.addItem(ALL_GPUS, None)
        for i, d in enumerate(gpus):
            self.gpu_combo.addItem(gpu_label(i, d), i)
            self.gpu_combo.setItemData(i + 1, describe_device(d), Qt.ItemDataRole.ToolTipRole)
        self._note = ""
        if wanted is not None and wanted < len(gpus):
            self.gpu_combo.setCurrentIndex(wanted + 1)
        elif wanted is not None:
            self._note = f"GPU {wanted}, chosen before, is not listed now: the layers go to all GPUs."
        self.gpu_combo.blockSignals(False)
        self._enable_gpu_choice()
        self._wanted_gpu = self.main_gpu()
        lines = [describe_device(d) for d in self._devices] or ["llama.cpp listed no device."]
        if not gpus and not any(is_rpc(d) for d in self._devices):
            lines.append("No GPU: the layers run on the CPU.")
        self.devices_label.setText("\n".join([*lines, *(x for x in (self._note, error or "") if x)]))
        self.choice_changed.emit()

    def devices(self) -> tuple[BackendDevice, ...] | None:
        """The devices last shown (None: none yet)."""
        return self._devices

    def local_gpus(self) -> tuple[BackendDevice, ...]:
        """The GPUs a single-GPU choice indexes, in llama.cpp's order (no RPC server: one GPU means here)."""
        return offload_devices(self._devices or (), rpc_servers=())

    def chosen_devices(self) -> tuple[BackendDevice, ...]:
        """The devices the layers would go to with this choice, in llama.cpp's order."""
        servers = self._valid_servers()
        chosen = offload_devices(self._devices or (), servers)
        gpu = self.main_gpu()
        return chosen[gpu:gpu + 1] if gpu is not None else chosen

    # --- the choice ------------------------------------------------------------------------------------

    def main_gpu(self) -> int | None:
        """The one GPU chosen (an index into ``local_gpus``), None for all; the saved choice until the list
        has come."""
        if self._devices is None:
            return self._wanted_gpu
        data = self.gpu_combo.currentData()
        return data if isinstance(data, int) and self.gpu_combo.isEnabled() else None

    def show_main_gpu(self, index: int | None) -> None:
        self._wanted_gpu = index
        if self._devices is not None:
            self.show_devices(self._devices)

    def rpc_servers(self) -> tuple[str, ...]:
        """The RPC servers written; SettingsError names one written wrong."""
        return parse_rpc_servers(self.rpc_edit.text())

    def saved_rpc_servers(self) -> tuple[str, ...]:
        """The RPC servers to save: those written, or while they are written wrong, the last good list."""
        try:
            return self.rpc_servers()
        except SettingsError:
            return self._shown_servers

    def show_rpc_servers(self, servers: Sequence[str]) -> None:
        self.rpc_edit.setText(", ".join(servers))
        self._shown_servers = tuple(servers)
        self._enable_gpu_choice()

    def ask_devices(self) -> None:
        """Have the devices listed again with the RPC servers written (one sentence if one is written wrong)."""
        try:
            servers = self.rpc_servers()
        except SettingsError as exc:
            self.devices_label.setText(str(exc))
            return
        self._shown_servers = servers
        self.devices_label.setText(ASKING)
        self._enable_gpu_choice()
        self.devices_wanted.emit(servers)

    def _valid_servers(self) -> tuple[str, ...]:
        try:
            return self.rpc_servers()
        except SettingsError:
            return ()

    def _has_servers(self) -> bool:
        return bool(self._valid_servers())

    def _enable_gpu_choice(self) -> None:
        # One GPU with RPC servers would leave the servers out: the servers and every GPU share the layers.
        servers = self._has_servers()
        self.gpu_combo.setEnabled(not servers and self.gpu_combo.count() > 1)
        self.gpu_combo.setItemText(0, ALL_DEVICES if servers else ALL_GPUS)
        what = "GPU and RPC server" if servers else "GPU"
        self.gpu_combo.setItemData(0, SPLIT_NOTE.format(what=what) + ".", Qt.ItemDataRole.ToolTipRole)

    @Slot(int)
    def _on_gpu_combo_current_index_changed(self, _index: int) -> None:
        if self._devices is not None:
            self._wanted_gpu = self.main_gpu()
        self.choice_changed.emit()

    @Slot()
    def _on_rpc_edit_editing_finished(self) -> None:
        try:
            servers = self.rpc_servers()
        except SettingsError as exc:
            self.devices_label.setText(str(exc))
            return
        if servers != self._shown_servers:
            self.ask_devices()
        self.choice_changed.emit()

    @Slot()
    def _on_rpc_button_clicked(self) -> None:
        self.ask_devices()
