"""The memory chart: with nothing to show (no model, no reading yet) it paints without an error; a device
that does not report its use gets no bar."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.ceiling.memory import GpuMemory, MemoryProbe
from ui.dashboard.panel import DashboardPanel


def test_an_empty_memory_chart_paints(qtbot: QtBot) -> None:
    def no_reading() -> tuple[GpuMemory, ...]:
        raise RuntimeError("the probe failed")

    panel = DashboardPanel(ceiling_provider=lambda _loaded: None, memory_probe=MemoryProbe(no_reading))
    qtbot.addWidget(panel)
    panel._memory = None
    assert panel.memory_rows() == []
    panel._paint_memory()  # raised UnboundLocalError inside pyqtgraph 0.14 with an empty list of pens
    assert panel.mem_label.text() == ""


def test_a_device_without_a_use_report_gets_no_bar_and_says_so(qtbot: QtBot) -> None:
    """llvmpipe reports all of its memory free with a model on it: no "in use" bar (never a zero), and the
    line under the chart says the device does not report it."""
    silent = GpuMemory(0, "llvmpipe (LLVM 15.0.6, 256 bits)", 2 << 30, None, device="Vulkan0",
                       source="llama.cpp")
    probe = MemoryProbe(lambda: (silent,))
    panel = DashboardPanel(ceiling_provider=lambda _loaded: None, memory_probe=probe)
    qtbot.addWidget(panel)
    panel._memory = probe.read()
    panel._paint_memory()
    assert not any(label.endswith("in use") for label, _ in panel.memory_rows())
    assert "Vulkan0 llvmpipe (LLVM 15.0.6, 256 bits): 2.15 GB, use not reported by the device" in panel.mem_label.text()
