"""Tune in the window measures on the window's own engine with the window's whole load: no second worker and
no second copy of the model, the chat's Send says the engine is busy while it runs, and the window's load is
back in the same engine afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
from pytestqt.qtbot import QtBot

from app.errors import SettingsError
from app.measure.tune import Candidate, TuneReport
from app.params import SamplingSettings
from app.storage.settings import AppSettings, save_settings, with_settings
from tests.ui.conftest import LOAD_TIMEOUT_MS, load_pair
from ui.bridge import BUSY_TUNING

SWEEP_TIMEOUT_MS = 300_000


def child_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=False)}


def test_tune_measures_on_the_windows_engine_with_its_whole_load(
    qtbot: QtBot, make_window, tiny_target: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # A load unlike the defaults in fields the old Tune dropped (batch size, flash attention).
    save_settings(with_settings(AppSettings(), {"load.n_batch": 128, "load.flash_attn": "off"}))
    window = make_window(folders=(tiny_target.parent,))
    window.picker.load_box.flash_combo.setCurrentText("off")
    load_pair(qtbot, window, tiny_target)
    bridge = window.bridge
    load = bridge.last_load
    assert load is not None
    assert load.n_batch == 128
    assert load.flash_attn == "off"
    worker = bridge.worker_pid
    before = child_pids()
    assert worker in before

    dialog = window.picker.open_tune()
    assert dialog is not None
    dialog.plan = [Candidate(use_model=False, ngram=3), Candidate(use_model=False, ngram=2, k_max=4)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "Copy: one two, one two"}]}) + "\n")
    dialog.file_radio.setChecked(True)
    dialog.file_edit.setText(str(prompts))
    dialog.max_tokens_spin.setValue(12)
    dialog.repeat_spin.setValue(1)
    seen: list[set[int]] = []
    dialog._signals.progress.connect(lambda _p: seen.append(child_pids()))
    refused: list[str] = []

    def send_while_tuning(_progress: object) -> None:
        try:
            bridge.generate([{"role": "user", "content": "hello"}], SamplingSettings(max_tokens=4))
        except SettingsError as exc:
            refused.append(str(exc))

    dialog._signals.progress.connect(send_while_tuning)
    reloaded: list[object] = []
    bridge.model_loaded.connect(reloaded.append)
    with qtbot.waitSignal(dialog.finished_sweep, timeout=SWEEP_TIMEOUT_MS) as finished:
        assert dialog.start()
    report: TuneReport = finished.args[0]
    assert report.stopped == "done"
    assert len(report.results) == 2
    assert seen
    assert all(pids <= before for pids in seen)
    assert refused
    assert refused[0] == BUSY_TUNING
    assert report.load == load  # every setting was measured on the window's own load, whole

    # The window's own load is back, in the same worker, and the chat answers again.
    qtbot.waitUntil(lambda: bool(reloaded), timeout=LOAD_TIMEOUT_MS)
    assert bridge.worker_pid == worker
    assert child_pids() <= before
    assert not bridge.tuning
    dialog.close()


def test_tune_without_a_load_says_to_load_first(
    qtbot: QtBot, make_window, tiny_target: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    dialog = window.picker.open_tune()
    assert dialog is not None
    with qtbot.waitSignal(window.bridge.model_unloaded, timeout=30_000):
        window.bridge.unload()
    dialog.file_radio.setChecked(True)
    dialog.file_edit.setText(str(tmp_path / "p.jsonl"))
    assert not dialog.start()
    assert dialog.status_label.text() == "Load the models first: Tune measures the window's own load."
    dialog.close()


def test_tune_chart_follows_a_light_palette(qtbot: QtBot, tiny_target: Path) -> None:
    from PySide6.QtGui import QColor, QPalette

    from app.params import LoadSettings
    from ui.dashboard.sweep import TuneDialog, TunePair

    dialog = TuneDialog(TunePair(LoadSettings(str(tiny_target))))
    qtbot.addWidget(dialog)
    palette = QPalette(dialog.palette())
    palette.setColor(QPalette.ColorRole.Base, QColor(245, 245, 245))
    palette.setColor(QPalette.ColorRole.WindowText, QColor(20, 20, 20))
    dialog.setPalette(palette)
    background = dialog.plot.graph.backgroundBrush().color()
    assert background.lightness() == 245  # a light window: a light chart, not pyqtgraph's black
    assert dialog.plot.graph.getAxis("left").textPen().color().lightness() < 60
