"""The GPU choice and the RPC servers in the picker: the list the engine worker reports, a list given to the
widget directly (GPUs and RPC servers this machine does not have), saved and restored, the fit with the
flash attention the load will use, and the dashboard's memory chart naming where the layers went."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.ceiling.backend import BackendDevice
from app.ceiling.memory import MemoryProbe
from app.events import Devices, Loaded, ModelSummary
from app.storage.settings import AppSettings, load_settings, save_settings, with_settings
from tests.ui.conftest import choose_pair
from ui.dashboard.panel import DashboardPanel
from ui.models.devices import ALL_DEVICES, ALL_GPUS, DeviceChoice

GIB = 1 << 30
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 60 * GIB, 64 * GIB)
IGPU = BackendDevice("Vulkan0", "AMD Radeon 780M", "igpu", "Vulkan", 8 * GIB, 8 * GIB)
SMALL = BackendDevice("Vulkan1", "AMD Radeon RX 6500 XT", "gpu", "Vulkan", 3 * GIB, 4 * GIB)
BIG = BackendDevice("Vulkan2", "AMD Radeon RX 7900 XTX", "gpu", "Vulkan", 20 * GIB, 24 * GIB)
RPC0 = BackendDevice("RPC0", "10.0.0.2:50052", "gpu", "RPC", 6 * GIB, 8 * GIB)
RPC1 = BackendDevice("RPC1", "10.0.0.3:50052", "gpu", "RPC", 2 * GIB, 8 * GIB)


def items(choice: DeviceChoice) -> list[str]:
    return [choice.gpu_combo.itemText(i) for i in range(choice.gpu_combo.count())]


def test_without_a_gpu_there_is_nothing_to_choose(qtbot: QtBot) -> None:
    choice = DeviceChoice()
    qtbot.addWidget(choice)
    choice.show_devices([CPU])
    assert items(choice) == [ALL_GPUS]
    assert not choice.gpu_combo.isEnabled()
    assert choice.main_gpu() is None
    assert choice.devices_label.text() == ("CPU — CPU, AMD EPYC: 64.4 GB free of 68.7 GB\n"
                                           "No GPU: the layers run on the CPU.")


def test_one_gpu_or_all_of_them(qtbot: QtBot) -> None:
    """llama.cpp offloads to the discrete GPUs (the integrated one only without them): those are offered."""
    choice = DeviceChoice()
    qtbot.addWidget(choice)
    with qtbot.waitSignal(choice.choice_changed):
        choice.show_devices([CPU, IGPU, SMALL, BIG])
    assert items(choice) == [ALL_GPUS, "GPU 0: Vulkan1 (AMD Radeon RX 6500 XT), 3.22 GB free",
                             "GPU 1: Vulkan2 (AMD Radeon RX 7900 XTX), 21.5 GB free"]
    assert choice.gpu_combo.isEnabled()
    assert choice.chosen_devices() == (SMALL, BIG)
    with qtbot.waitSignal(choice.choice_changed):
        choice.gpu_combo.setCurrentIndex(2)
    assert choice.main_gpu() == 1
    assert choice.chosen_devices() == (BIG,)
    assert "Vulkan0 — integrated GPU, AMD Radeon 780M: 8.59 GB free of 8.59 GB" in choice.devices_label.text()
    # The items are short for the narrow dock; each one's tooltip says what it means in full.
    tips = [choice.gpu_combo.itemData(i, Qt.ItemDataRole.ToolTipRole) for i in range(3)]
    assert "split" in tips[0]
    assert "free memory" in tips[0]
    assert tips[2] == "Vulkan2 — GPU, AMD Radeon RX 7900 XTX: 21.5 GB free of 25.8 GB"


def test_rpc_servers_take_the_layers_with_every_gpu(qtbot: QtBot) -> None:
    choice = DeviceChoice()
    qtbot.addWidget(choice)
    choice.show_devices([CPU, BIG])
    choice.gpu_combo.setCurrentIndex(1)
    assert choice.main_gpu() == 0
    asked: list[tuple[str, ...]] = []
    choice.devices_wanted.connect(asked.append)
    choice.rpc_edit.setText("10.0.0.2:50052, 10.0.0.3:50052")
    choice.rpc_edit.editingFinished.emit()
    assert asked == [("10.0.0.2:50052", "10.0.0.3:50052")]
    choice.show_devices([CPU, BIG, RPC0, RPC1])  # the worker's answer
    assert items(choice)[0] == ALL_DEVICES
    assert not choice.gpu_combo.isEnabled()
    assert choice.main_gpu() is None
    assert choice.chosen_devices() == (RPC0, RPC1, BIG)
    text = choice.devices_label.text()
    assert "RPC0 — RPC server, 10.0.0.2:50052: 6.44 GB free of 8.59 GB" in text
    assert "RPC1 — RPC server, 10.0.0.3:50052: 2.15 GB free of 8.59 GB" in text
    choice.rpc_edit.setText("10.0.0.2")  # written wrong: one sentence, nothing asked
    choice.rpc_edit.editingFinished.emit()
    assert choice.devices_label.text().startswith("An RPC server is written host:port")
    assert choice.saved_rpc_servers() == ("10.0.0.2:50052", "10.0.0.3:50052")
    assert len(asked) == 1


def test_a_saved_gpu_that_is_gone_falls_back_to_all_and_says_so(qtbot: QtBot) -> None:
    choice = DeviceChoice()
    qtbot.addWidget(choice)
    choice.show_main_gpu(3)
    assert choice.main_gpu() == 3  # kept until the worker's list says whether it exists
    choice.show_devices([CPU, BIG])
    assert choice.main_gpu() is None
    assert "GPU 3, chosen before, is not listed now: the layers go to all GPUs." in choice.devices_label.text()


def test_the_window_shows_the_devices_the_worker_reports(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window()
    choice = window.picker.load_box.device_choice
    qtbot.waitUntil(lambda: choice.devices() is not None, timeout=60_000)
    devices = choice.devices()
    assert devices is not None
    assert any(d.type == "cpu" for d in devices)
    assert choice.devices_label.text().splitlines()[0].startswith("CPU — CPU")
    assert choice.gpu_combo.count() == 1 + len(choice.local_gpus())  # one GPU offered per GPU the worker has


def test_the_choice_is_saved_and_restored(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    save_settings(with_settings(AppSettings(), {"load.main_gpu": 1}))
    window = make_window(start_engine=False)
    picker = window.picker
    assert picker.shown_values()["load.main_gpu"] == 1
    picker.show_devices(Devices(0, (CPU, SMALL, BIG), "vulkan", True, False))
    assert picker.load_box.device_choice.gpu_combo.currentText().startswith("GPU 1: Vulkan2")
    picker.load_box.device_choice.gpu_combo.setCurrentIndex(1)
    picker.load_box.device_choice.show_rpc_servers(("10.0.0.2:50052",))
    window.close()
    saved, warning = load_settings()
    assert warning is None
    assert saved.load.rpc_servers == ("10.0.0.2:50052",)
    assert saved.load.main_gpu is None  # servers and one GPU do not go together: the servers share every GPU
    window = make_window(start_engine=False)
    assert window.picker.load_box.device_choice.rpc_edit.text() == "10.0.0.2:50052"
    window.picker.load_box.device_choice.show_rpc_servers(())
    window.picker.show_devices(Devices(0, (CPU, SMALL, BIG), "vulkan", True, False))
    window.picker.load_box.device_choice.gpu_combo.setCurrentIndex(1)
    window.close()
    assert load_settings()[0].load.main_gpu == 0


def test_the_fit_counts_flash_attention_as_the_load_runs_it(
        qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path) -> None:  # type: ignore[no-untyped-def]
    """On Vulkan "auto" loads without flash attention: the fit's compute buffer is that of "off" there."""
    window = make_window(start_engine=False, folders=(tiny_target.parent,))
    picker = window.picker
    choose_pair(qtbot, window, tiny_target, tiny_drafter_same)

    box = picker.load_box

    def fit(backend: str, flash: str) -> str:
        box.flash_combo.setCurrentText(flash)
        picker.show_devices(Devices(0, (CPU, BIG), backend, True, False))
        qtbot.waitUntil(lambda: "needs" in box.fit_label.text() and box._fit_shown == box._fit_wanted[0],
                        timeout=10_000)
        text = box.fit_label.text()
        assert "Vulkan2 (AMD Radeon RX 7900 XTX) needs" in text
        return text[text.rindex("(weights"):]  # weights, KV and compute per device (not the RAM free just now)

    auto_vulkan, off_vulkan, on_vulkan = fit("vulkan", "auto"), fit("vulkan", "off"), fit("vulkan", "on")
    auto_cpu = fit("cpu", "auto")
    assert auto_vulkan == off_vulkan
    assert auto_vulkan != on_vulkan  # without flash attention the compute buffer holds the attention scores
    assert auto_cpu == on_vulkan


def test_the_memory_chart_names_where_the_layers_went(qtbot: QtBot) -> None:
    panel = DashboardPanel(ceiling_provider=lambda _loaded: None, memory_probe=MemoryProbe(lambda: ()))
    qtbot.addWidget(panel)
    target = ModelSummary("/nowhere/t.gguf", "t", "llama", 10**9, 2 * 10**9, 4096, 16, 32000)
    split = Loaded(target, None, 0, 4096, "cpu", True, 100_000, 100_000 * 4096, 1.0, devices=(RPC0, RPC1),
                   network_seconds=0.002)
    panel.on_loaded(split)
    assert panel.mem_label.text().startswith(
        "Layers split by free memory over RPC0 (10.0.0.2:50052), RPC1 (10.0.0.3:50052)")
    one = Loaded(target, None, 0, 4096, "vulkan", True, 100_000, 100_000 * 4096, 1.0, devices=(BIG,), main_gpu=1)
    panel.on_loaded(one)
    assert panel.mem_label.text().startswith("Layers on Vulkan2 (AMD Radeon RX 7900 XTX) alone (one GPU chosen)")
    cpu = Loaded(target, None, 0, 4096, "cpu", False, 100_000, 100_000 * 4096, 1.0)
    panel.on_loaded(cpu)
    assert panel.mem_label.text().startswith("Layers on the CPU")
