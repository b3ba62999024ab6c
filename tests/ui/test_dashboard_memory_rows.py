"""The memory chart with nothing to show (no model, no reading yet) paints without an error."""

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
