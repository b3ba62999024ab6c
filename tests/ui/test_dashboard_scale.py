"""The decode chart scales to the data and the nearest ceiling (far ones are named, not drawn), and a
ceiling computed for a model that is no longer loaded never reaches the dashboard."""

from __future__ import annotations

import threading
from dataclasses import replace

from pytestqt.qtbot import QtBot

from app.ceiling.builder import CeilingInfo
from app.ceiling.memory import MemoryProbe
from app.events import Loaded
from tests.ui.test_dashboard import make_loaded
from ui.dashboard.panel import DashboardPanel, decode_axis_top


def test_axis_fits_the_data_and_the_nearest_ceiling_above_it() -> None:
    top, off = decode_axis_top(45.0, {"plain rate": 57.0, "bandwidth roof": 301.0, "τ × roof": 560.0})
    assert top == 57.0  # a 20-50 tok/s trace fills the chart instead of its bottom 15 %
    assert off == {"bandwidth roof": 301.0, "τ × roof": 560.0}
    top, off = decode_axis_top(80.0, {"plain rate": 57.0, "bandwidth roof": 301.0, "τ × roof": None})
    assert (top, off) == (301.0, {})  # past the measured line, the roof is the nearer ceiling
    top, off = decode_axis_top(400.0, {"plain rate": 57.0, "bandwidth roof": 301.0})
    assert (top, off) == (400.0, {})  # above every ceiling (speculation): all are drawn


def test_a_ceiling_for_the_previous_model_is_dropped(qtbot: QtBot) -> None:
    release = threading.Event()
    first = CeilingInfo(contexts=(0, 4096), spec_tps=(900.0, 800.0), efficiency=0.5, device="old")
    second = CeilingInfo(contexts=(0, 4096), spec_tps=(90.0, 80.0), efficiency=0.5, device="new")

    def provider(loaded: Loaded) -> CeilingInfo:
        if loaded.target.name == "old":
            release.wait(10)  # still probing when the next model arrives
            return first
        return second

    panel = DashboardPanel(ceiling_provider=provider, memory_probe=MemoryProbe(lambda: ()))
    qtbot.addWidget(panel)
    old = make_loaded()
    panel.on_loaded(replace(old, target=replace(old.target, name="old")))
    panel.on_loaded(replace(old, target=replace(old.target, name="new")))
    qtbot.waitUntil(lambda: panel.metrics.ceiling is second, timeout=5000)
    release.set()
    panel._tasks.wait()
    qtbot.wait(50)  # the late result's signal is delivered, and ignored
    assert panel.metrics.ceiling is second


def test_the_legend_explains_both_ceilings_and_names_far_ones(qtbot: QtBot) -> None:
    far = CeilingInfo(contexts=(0, 4096), spec_tps=(900.0, 800.0), efficiency=0.5, device="fast")
    panel = DashboardPanel(ceiling_provider=lambda _loaded: far, memory_probe=MemoryProbe(lambda: ()))
    qtbot.addWidget(panel)
    panel.on_loaded(replace(make_loaded(), plain_tps=50.0))
    qtbot.waitUntil(lambda: panel.metrics.ceiling is far, timeout=5000)
    key = panel.tps_legend.text
    assert "bandwidth roof: memory bandwidth ÷ bytes per token" in key  # no source named: "memory"
    assert "plain rate: one token per pass, timed here at load" in key
    assert "off scale: bandwidth roof 900 tok/s" in key  # 50 measured, no data yet: 900 is far
    assert not panel.l_spec.isVisible()
