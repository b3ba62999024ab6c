"""Tune in the window: `specdeck tune`'s sweep on the loaded pair with the window's whole load settings, run
off the GUI thread in the window's own engine worker (the chat's: one copy of the models, never a second),
cancellable, and plotted as each setting's median speedup with its min–max spread.

The sweep itself is ``app.measure.tune.tune`` (the same code as the command); this module only chooses the
prompts, reports progress and paints. While it runs the chat's Send says the engine is busy tuning; when it
ends the window's own load is put back in the same worker. The winner is saved for the pair as the command
saves it, and "Use these settings" hands its drafting settings to the picker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QCloseEvent, QColor, QPalette
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.measure.bench import BENCH_SAMPLING
from app.measure.tune import PLAIN, Candidate, Measured, Progress, TuneConfig, TuneReport
from app.params import DraftSettings, LoadSettings
from ui.tasks import TaskRunner
from ui.wheel_guard import guard_wheel

if TYPE_CHECKING:
    from app.engine.client import EngineClient
    from ui.bridge import EngineBridge

BLUE = QColor(31, 119, 180)
ORANGE = QColor(255, 127, 14)


@dataclass(frozen=True)
class TunePair:
    """What to tune: the window's load, whole (every field but the drafting settings is kept by the sweep)."""

    settings: LoadSettings

    @property
    def target(self) -> str:
        return self.settings.target_path

    @property
    def drafter(self) -> str | None:
        return self.settings.draft.drafter_path


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class SweepPlot(QWidget):
    """Median speedup per measured setting, min–max as error bars, plain decoding's 1.0 as a line, and the
    winner drawn larger in another colour. Settings are along x in the order measured."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.graph = pg.PlotWidget(self)
        layout.addWidget(self.graph)
        self.setMinimumSize(320, 220)
        self.graph.setLabel("left", "speedup over plain (×)")
        self.graph.setLabel("bottom", "setting (in the order measured)")
        self.graph.showGrid(y=True, alpha=0.3)
        self.plain_line = pg.InfiniteLine(pos=1.0, angle=0, movable=False,
                                          pen=pg.mkPen((128, 128, 128), width=1.5, style=Qt.PenStyle.DashLine),
                                          label="plain 1.0×", labelOpts={"position": 0.9})
        self.graph.addItem(self.plain_line)
        self.bars = pg.ErrorBarItem(x=np.zeros(0), y=np.zeros(0), top=np.zeros(0), bottom=np.zeros(0),
                                    beam=0.25, pen=pg.mkPen(BLUE, width=1.5))
        self.graph.addItem(self.bars)
        self.points = pg.ScatterPlotItem(size=9, brush=pg.mkBrush(BLUE), pen=None)
        self.graph.addItem(self.points)
        self.winner = pg.ScatterPlotItem(size=16, symbol="star", brush=pg.mkBrush(ORANGE), pen=pg.mkPen("k"))
        self.graph.addItem(self.winner)
        # Before the first result: the range a result will fall in, not pyqtgraph's empty −400…400.
        self.graph.setXRange(0.5, 1.5, padding=0)
        self.graph.setYRange(0.0, 2.0, padding=0)
        self.measured: list[Measured] = []
        self.best: Measured | None = None
        self.legend_lines: list[str] = []
        self.apply_palette()

    def apply_palette(self) -> None:
        """The window's colours (pyqtgraph's own default is black): a light window gets a light chart."""
        pal = self.palette()
        background, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.WindowText)
        self.graph.setBackground(background)
        for name in ("left", "bottom"):
            axis = self.graph.getAxis(name)
            axis.setPen(pg.mkPen(text))
            axis.setTextPen(pg.mkPen(text))
        self.winner.setPen(pg.mkPen(text))

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self.apply_palette()
        super().changeEvent(event)

    def show_results(self, measured: Sequence[Measured], best: Measured | None) -> None:
        self.measured, self.best = list(measured), best
        self.legend_lines = [
            f"{n}: {m.candidate.label()}, {m.speedup:.2f}× ({m.speedup_min:.2f}–{m.speedup_max:.2f})"
            + (" ★" if m is best else "") for n, m in enumerate(measured, 1)]
        x = np.arange(1, len(measured) + 1, dtype=float)
        y = np.array([m.speedup for m in measured], dtype=float)
        top = np.array([m.speedup_max - m.speedup for m in measured], dtype=float)
        bottom = np.array([m.speedup - m.speedup_min for m in measured], dtype=float)
        self.bars.setData(x=x, y=y, top=top, bottom=bottom)
        self.points.setData(x=x, y=y, data=[m.candidate.label() for m in measured])
        at = next((i for i, m in enumerate(measured) if m is best), None)
        self.winner.setData(x=[] if at is None else [x[at]], y=[] if at is None else [y[at]])
        axis = self.graph.getAxis("bottom")
        axis.setTicks([[(float(i), str(int(i))) for i in x]])
        self.graph.setXRange(0.5, max(len(measured), 1) + 0.5, padding=0)
        if len(y):
            low = min(1.0, float((y - bottom).min()))
            high = max(1.0, float((y + top).max()))
            self.graph.setYRange(low - 0.05 * (high - low + 0.1), high + 0.05 * (high - low + 0.1), padding=0)


class _SweepSignals(QObject):
    """Made on the GUI thread: the sweep's thread emits through it, queued to the GUI thread."""

    progress = Signal(object)  # Progress


class TuneDialog(QDialog):
    """Choose the prompts, run the sweep, watch it, cancel it, and use the winner."""

    use_settings = Signal(DraftSettings)  # the winner's drafting settings, when the user asks for them
    finished_sweep = Signal(object)  # TuneReport, once the sweep has ended (done, budget or cancelled)

    def __init__(self, pair: TunePair, engine: EngineBridge | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pair = pair
        self.engine = engine  # the window's engine, which the sweep borrows; None: a worker of the sweep's own
        self.setWindowTitle("Tune drafting settings")
        self.report: TuneReport | None = None
        self.plan: Sequence[Candidate] | None = None  # None: the whole staged sweep of `specdeck tune`
        self._measured: list[Measured] = []
        self._cancel = threading.Event()
        self._client: EngineClient | None = None  # the engine client the sweep measures with, while it runs
        self._tasks = TaskRunner(self, max_threads=1)
        self._signals = _SweepSignals(self)
        self._signals.progress.connect(self._on_signals_progress)
        self._build()
        guard_wheel(self)

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        drafter = Path(self.pair.drafter).name if self.pair.drafter else "no drafter model"
        pair_label = QLabel(f"{Path(self.pair.target).name} with {drafter}", self)
        pair_label.setTextFormat(Qt.TextFormat.PlainText)  # file names are untrusted text
        outer.addWidget(pair_label)
        form = QFormLayout()
        self.history_radio = QRadioButton("Last chats", self)
        self.history_radio.setChecked(True)
        self.chats_spin = QSpinBox(self)
        self.chats_spin.setRange(1, 500)
        self.chats_spin.setValue(10)
        self.file_radio = QRadioButton("Prompts file (JSONL)", self)
        self.file_edit = QLineEdit(self)
        self.file_edit.setPlaceholderText('one {"messages": [...]} per line')
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(self._on_browse_clicked)
        source = QButtonGroup(self)
        source.addButton(self.history_radio)
        source.addButton(self.file_radio)
        file_row = QHBoxLayout()
        file_row.addWidget(self.file_edit)
        file_row.addWidget(browse)
        form.addRow(self.history_radio, self.chats_spin)
        form.addRow(self.file_radio, file_row)
        self.max_tokens_spin = QSpinBox(self)
        self.max_tokens_spin.setRange(8, 4096)
        self.max_tokens_spin.setValue(256)
        self.repeat_spin = QSpinBox(self)
        self.repeat_spin.setRange(1, 10)
        self.repeat_spin.setValue(2)
        self.repeat_spin.setToolTip("Side-by-side runs per prompt and setting (the spread needs at least 2)")
        form.addRow("Max tokens per answer", self.max_tokens_spin)
        form.addRow("Runs per prompt", self.repeat_spin)
        outer.addLayout(form)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start", self)
        self.start_button.clicked.connect(self._on_start_clicked)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self._on_cancel_clicked)
        self.use_button = QPushButton("Use these settings", self)
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self._on_use_clicked)
        for button in (self.start_button, self.cancel_button, self.use_button):
            buttons.addWidget(button)
        outer.addLayout(buttons)
        self.progress_bar = QProgressBar(self)
        self.progress_bar.setVisible(False)
        outer.addWidget(self.progress_bar)
        self.status_label = QLabel("Each setting is measured against plain decoding, side by side.", self)
        self.status_label.setWordWrap(True)
        self.status_label.setTextFormat(Qt.TextFormat.PlainText)  # errors quote file names and contents
        outer.addWidget(self.status_label)
        self.plot = SweepPlot(self)
        outer.addWidget(self.plot, 1)
        self.settings_label = QLabel("", self)  # what each number along x stands for
        self.settings_label.setWordWrap(True)
        self.settings_label.setTextFormat(Qt.TextFormat.PlainText)
        outer.addWidget(self.settings_label)
        self.best_label = QLabel("", self)
        self.best_label.setWordWrap(True)
        self.best_label.setTextFormat(Qt.TextFormat.PlainText)
        outer.addWidget(self.best_label)

    # --- running ------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._tasks.busy

    def start(self) -> bool:
        """Start the sweep with the chosen prompts; False (with the reason shown) when it cannot start."""
        if self.running:
            return False
        source = "history" if self.history_radio.isChecked() else self.file_edit.text().strip()
        if not source:
            self.status_label.setText("Choose a prompts file, or tune on the last chats.")
            return False
        if self.engine is not None and self.engine.last_load is None:
            self.status_label.setText("Load the models first: Tune measures the window's own load.")
            return False
        if self.engine is not None and self.engine.generating:
            self.status_label.setText("An answer is being written; start Tune when it has finished.")
            return False
        self._cancel.clear()
        self._measured = []
        self.report = None
        self.plot.show_results([], None)
        self.settings_label.setText("")
        self.best_label.setText("")
        self.use_button.setEnabled(False)
        self.start_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setRange(0, 0)
        self.progress_bar.setVisible(True)
        self.status_label.setText("Measuring on the window's engine; the chat waits until Tune ends…"
                                  if self.engine is not None else "Loading the models in a tuning engine…")
        if self.engine is not None:
            self.engine.tuning = True
        chats, max_tokens, repeat = self.chats_spin.value(), self.max_tokens_spin.value(), self.repeat_spin.value()
        self._tasks.run(lambda: self._sweep(source, chats, max_tokens, repeat), self._on_sweep_done,
                        self._on_sweep_failed)
        return True

    def tune_config(self, source: str, chats: int, max_tokens: int, repeat: int) -> TuneConfig:
        """The sweep to run: the pair's load settings, the prompts read from ``source`` (a file, or "history":
        the last ``chats`` chats) and the chat's sampling defaults at ``max_tokens``. Reads files: call it off
        the GUI thread."""
        from app.measure.bench import read_prompts
        from app.measure.tune import history_prompts

        prompts = history_prompts(chats) if source == "history" else read_prompts(Path(source))
        return TuneConfig(self.pair.settings, tuple(prompts), source, replace(BENCH_SAMPLING, max_tokens=max_tokens),
                          repeat=repeat, plan=None if self.plan is None else tuple(self.plan))

    def _sweep(self, source: str, chats: int, max_tokens: int, repeat: int) -> TuneReport:
        """On the task thread: the prompts, then the sweep in the window's engine worker (or one of its own)."""
        from app.engine.client import EngineClient
        from app.measure.bench import WATCHDOG_SECONDS
        from app.measure.tune import save_winner

        config = self.tune_config(source, chats, max_tokens, repeat)
        if self.engine is not None:
            with self.engine.lend_client() as client:
                report = self._measure_on(config, client)
        else:
            client = EngineClient(watchdog_seconds=WATCHDOG_SECONDS)
            try:
                report = self._measure_on(config, client)
            finally:
                client.close()
        save_winner(report)
        return report

    def _measure_on(self, config: TuneConfig, client: EngineClient) -> TuneReport:
        """The sweep on ``client``; on the window's engine its own load is put back afterwards (cancelled or
        not), in the same worker, and its reply reaches the window as any load's does."""
        from app.measure.tune import tune

        self._client = client
        try:
            return tune(config, on_progress=self._signals.progress.emit, cancelled=self._cancel.is_set,
                        client=client)
        finally:
            self._client = None
            if self.engine is not None:
                client.load(self.pair.settings)

    def cancel(self) -> None:
        """Stop now: the setting being measured is dropped, the ones measured are kept (and the best saved)."""
        if not self.running:
            return
        self._cancel.set()
        self.cancel_button.setEnabled(False)
        self.status_label.setText("Cancelling…")
        client = self._client
        pid = client.pid if client is not None else None
        if pid is not None:  # ends the setting in progress; the sweep's thread sees the worker gone
            with contextlib.suppress(OSError):  # it had ended already
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))

    @Slot(object)
    def _on_signals_progress(self, p: Progress) -> None:
        self._measured.append(p.latest)
        self.progress_bar.setRange(0, max(p.planned, p.done))
        self.progress_bar.setValue(p.done)
        self.status_label.setText(f"{p.done} of about {max(p.planned, p.done)} settings measured; "
                                  f"{_minutes(p.elapsed_s)} so far, about {_minutes(p.left_s)} left.")
        ranked = sorted(self._measured, key=lambda m: -m.speedup)
        self.plot.show_results(self._measured, ranked[0] if ranked else None)
        self.settings_label.setText("\n".join(self.plot.legend_lines))

    def _on_sweep_done(self, report: TuneReport) -> None:
        self.report = report
        self._idle()
        measured = list(report.results)
        best = report.best
        self.plot.show_results(measured, best if best in measured else None)
        self.settings_label.setText("\n".join(self.plot.legend_lines))
        how = {"cancelled": "Cancelled; kept what was measured.", "budget": "Stopped at the time budget."}
        self.status_label.setText(how.get(report.stopped, "Done.") + f" {len(measured)} settings measured.")
        if best is None:
            self.best_label.setText("Nothing was measured; nothing was saved.")
            return
        if best.candidate == PLAIN:
            self.best_label.setText("Plain decoding was fastest on these prompts; saved for this pair.")
        else:
            self.best_label.setText(f"Best: {best.candidate.label()}, {best.speedup:.2f}× "
                                    f"({best.speedup_min:.2f}–{best.speedup_max:.2f}); saved for this pair.")
        self.use_button.setEnabled(True)
        self.finished_sweep.emit(report)

    def _on_sweep_failed(self, exc: Exception) -> None:
        self._idle()
        self.status_label.setText(f"Tuning stopped: {exc}")

    def _idle(self) -> None:
        if self.engine is not None:
            self.engine.tuning = False
        self.progress_bar.setVisible(False)
        self.start_button.setEnabled(True)
        self.cancel_button.setEnabled(False)

    def best_draft(self) -> DraftSettings | None:
        tuned = self.report.tuned() if self.report is not None else None
        return tuned.draft if tuned is not None else None

    # --- slots --------------------------------------------------------------------------------------

    @Slot()
    def _on_start_clicked(self) -> None:
        self.start()

    @Slot()
    def _on_cancel_clicked(self) -> None:
        self.cancel()

    @Slot()
    def _on_use_clicked(self) -> None:
        draft = self.best_draft()
        if draft is not None:
            self.use_settings.emit(draft)
            self.status_label.setText("The picker now shows these settings; Load applies them.")

    @Slot()
    def _on_browse_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Prompts to tune on", "", "JSON lines (*.jsonl);;All (*)")
        if path:
            self.file_edit.setText(path)
            self.file_radio.setChecked(True)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.cancel()
        self._tasks.wait()
        super().closeEvent(event)

    def reject(self) -> None:
        self.cancel()
        self._tasks.wait()
        super().reject()
