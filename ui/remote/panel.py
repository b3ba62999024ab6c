"""A dashboard on a remote engine: tok/s and acceptance from the deltas of its own counters.

It scrapes ``/metrics`` once a second off the GUI thread (``app.remote.scrape``). The header says which engine
it watches, the server's model and where each number comes from; what the server does not expose reads "not
reported by this server", never 0. All text from the server is shown as plain text.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QFormLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.remote.client import RemoteEngine, RemoteInfo, remote_models
from app.remote.scrape import NOT_REPORTED, RemoteRates, Scrape, rates, reported
from app.units import format_si
from ui.tasks import TaskRunner

SCRAPE_MS = 1000
SPECULATION_FIGURES = ("acceptance", "mean_accepted_length")
NOT_CONNECTED = "Not connected to a server. Model → Connect to server… watches one."
HISTORY_POINTS = 600
BLUE = QColor(31, 119, 180)
GREEN = QColor(44, 160, 44)

FIGURES: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("tokens_per_second", "Decode tok/s", lambda v: f"{v:.1f}"),
    ("acceptance", "Acceptance", lambda v: f"{v:.0%}"),
    ("mean_accepted_length", "Tokens per pass", lambda v: f"{v:.2f}"),
    ("kv_usage", "KV cache in use", lambda v: f"{v:.0%}"),
    ("read_bytes_per_second", "Memory read per GPU", lambda v: format_si(v, "B/s")),
    ("plain_tokens_per_second", "Plain rate (measured at load)", lambda v: f"{v:.1f} tok/s"),
)
PLOT_MIN_HEIGHT = 110  # two plots and the figures fit a 700-pixel screen's dock; taller docks give them more
GAP_SECONDS = 2.5 * SCRAPE_MS / 1000  # readings further apart than this are not joined by a line
LIVE_WINDOW_S = 1.0  # the live rate of this window's own answer: tokens over the last second


def _plain(text: str) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)  # server text is untrusted: never rich text
    label.setWordWrap(True)
    return label


class RemoteDashboard(QWidget):
    def __init__(self, tasks: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tasks = tasks
        self.engine: RemoteEngine | None = None
        self.info: RemoteInfo | None = None
        self._last: Scrape | None = None
        self._in_flight = False
        self._t0 = time.monotonic()
        self._tps: deque[tuple[float, float]] = deque(maxlen=HISTORY_POINTS)
        self._acc: deque[tuple[float, float]] = deque(maxlen=HISTORY_POINTS)
        self.latest: RemoteRates | None = None
        self._shown: dict[str, tuple[float, float]] = {}  # figure -> (its last value, when)
        self._sources: dict[str, str] = {}  # figure -> the metric its shown value came from

        layout = QVBoxLayout(self)
        self.header = _plain(NOT_CONNECTED)
        layout.addWidget(self.header)
        form = QFormLayout()
        self.values: dict[str, QLabel] = {}
        for key, title, _ in FIGURES:
            self.values[key] = _plain("—")
            form.addRow(title, self.values[key])
        layout.addLayout(form)
        self.tps_plot = pg.PlotWidget(title="Decode tok/s")
        self.tps_plot.setLabel("bottom", "seconds")
        self.tps_curve = self.tps_plot.plot(pen=pg.mkPen(BLUE, width=2))
        self.acc_plot = pg.PlotWidget(title="Acceptance (accepted / drafted)")
        self.acc_plot.setYRange(0, 1)
        self.acc_plot.setLabel("bottom", "seconds")
        self.acc_curve = self.acc_plot.plot(pen=pg.mkPen(GREEN, width=2))
        for plot in (self.tps_plot, self.acc_plot):
            plot.setMinimumHeight(PLOT_MIN_HEIGHT)
            plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
            plot.setMouseEnabled(False, False)
            plot.hideButtons()
            plot.setMenuEnabled(False)
            layout.addWidget(plot, 1)
        for curve in (self.tps_curve, self.acc_curve):
            curve.setSymbol("o")  # each reading is a dot; a line joins only readings close in time
            curve.setSymbolSize(4)
            curve.opts["connect"] = "finite"
        # Where each figure comes from (the server's metric names) is in its tooltip, not over the plots.
        self.sources = _plain("")
        self.sources.setObjectName("remote_sources")
        self.sources.setVisible(False)
        layout.addWidget(self.sources)
        self._apply_palette()
        # This window's own answer to this server, counted as its tokens arrive: llama-server's counters move
        # only when an answer ends, so during one they cannot say how fast it goes.
        self._live: deque[tuple[float, int]] = deque()
        self.streaming = False
        self.status = _plain("")
        layout.addWidget(self.status)
        self.timer = QTimer(self)
        self.timer.setInterval(SCRAPE_MS)
        self.timer.timeout.connect(self._on_timer_timeout)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._apply_palette()
        super().changeEvent(event)

    def _apply_palette(self) -> None:
        """The window's own colours, as the main dashboard has (pyqtgraph's default is black)."""
        pal = self.palette()
        fg = pal.color(QPalette.ColorRole.WindowText)
        for plot in (self.tps_plot, self.acc_plot):
            plot.setBackground(pal.color(QPalette.ColorRole.Base))
            item = plot.getPlotItem()
            for side in ("left", "bottom"):
                axis = item.getAxis(side)
                axis.setPen(pg.mkPen(fg))
                axis.setTextPen(pg.mkPen(fg))
            item.titleLabel.setAttr("color", fg)
            item.titleLabel.setText(item.titleLabel.text)

    # --- this window's own answer, live --------------------------------------------------------------

    def stream_started(self) -> None:
        self.streaming = True
        self._live.clear()

    def stream_tokens(self, count: int, now: float | None = None) -> None:
        """Tokens of this window's answer arrived (from the chat's route to this server)."""
        now = time.monotonic() if now is None else now
        self._live.append((now, count))

    def stream_ended(self) -> None:
        self.streaming = False
        self._live.clear()

    def live_rate(self, now: float | None = None) -> float | None:
        """Tokens per second of this window's answer over the last second; None when no answer streams."""
        now = time.monotonic() if now is None else now
        while self._live and self._live[0][0] < now - LIVE_WINDOW_S:
            self._live.popleft()
        if not self.streaming or not self._live:
            return None
        return sum(n for _, n in self._live) / LIVE_WINDOW_S

    # --- control ------------------------------------------------------------------------------------

    def watch(self, engine: RemoteEngine, info: RemoteInfo) -> None:
        self.stop()
        self.engine, self.info = engine, info
        self._last, self.latest = None, None
        self._shown.clear()
        self._sources.clear()
        self._tps.clear()
        self._acc.clear()
        self._t0 = time.monotonic()
        models = ", ".join(m.name for m in remote_models(info)) or "no model listed"
        self.header.setText(
            f"Watching {info.engine} at {info.base_url}. Model (remote): {models}. Speculation is the server's "
            f"own, configured there: {info.speculation}. Figures come from the server's /metrics counters, "
            "read once a second, as rates between two readings."
            + ("" if info.has_metrics else " This server has no /metrics (llama-server needs --metrics).")
        )
        for label in self.values.values():
            label.setText("waiting for two readings…")
        self.status.setText("")
        self.timer.start()
        self.read_now()

    def stop(self) -> None:
        self.timer.stop()
        if self.engine is not None:
            self.engine.close()
        self.engine = None

    def disconnect_server(self) -> None:
        """Stop watching and say so: the figures shown were the server's, which is gone from the window."""
        self.stop()
        self.info, self._last, self.latest = None, None, None
        self.header.setText(NOT_CONNECTED)
        for label in self.values.values():
            label.setText("—")
        self.status.setText("")

    # --- scraping -----------------------------------------------------------------------------------

    @property
    def reading(self) -> bool:
        """A reading of the server is under way."""
        return self._in_flight

    @Slot()
    def _on_timer_timeout(self) -> None:
        self.read_now()

    def read_now(self) -> None:
        """Take a reading now (the timer takes one a second); none while one is under way."""
        if self._in_flight or self.engine is None:
            return
        self._in_flight = True
        self.tasks.run(self.engine.scrape, self._on_scraped, self._on_scrape_failed)

    def _on_scraped(self, scrape: Scrape) -> None:
        self._in_flight = False
        if self.engine is None:
            return
        self.status.setText("")
        before, self._last = self._last, scrape
        if before is None:
            return
        self.show_rates(rates(before, scrape), reported(scrape), scrape.t - self._t0)

    def _on_scrape_failed(self, exc: Exception) -> None:
        self._in_flight = False
        if self.engine is not None:
            self.status.setText(f"Last reading failed: {exc}")

    def show_rates(self, figures: RemoteRates, exposed: dict[str, bool], t: float) -> None:
        self.latest = figures
        live = self.live_rate()
        for key, _title, fmt in FIGURES:
            value = getattr(figures, key)
            if key == "tokens_per_second" and live is not None:
                text = f"{live:.1f} (this window's answer, live)"
                self._shown[key] = (live, t)
            elif value is not None:
                text = fmt(value)
                self._shown[key] = (value, t)
            elif key in SPECULATION_FIGURES and self.info is not None and self.info.speculating is False:
                text = "speculation is off on this server"
            elif exposed.get(key) and key in self._shown:
                # llama-server counts an answer when it ends: mid-answer its counters stand still.
                last, when = self._shown[key]
                text = f"{fmt(last)} (counters unchanged for {t - when:.0f} s)"
            elif exposed.get(key):
                text = "idle (nothing new since the last reading)"
            else:
                text = NOT_REPORTED
            self.values[key].setText(text)
        tps = live if live is not None else figures.tokens_per_second
        if tps is not None:
            self._tps.append((t, tps))
            self.tps_curve.setData(*_broken_at_gaps(self._tps))
        if figures.acceptance is not None:
            self._acc.append((t, figures.acceptance))
            self.acc_curve.setData(*_broken_at_gaps(self._acc))
        self.acc_plot.setTitle("Acceptance (accepted / drafted)" if exposed.get("acceptance")
                               else f"Acceptance: {NOT_REPORTED}")
        self._sources.update(figures.sources)  # a figure kept from an earlier interval keeps its source
        self.sources.setText("Sources: " + "; ".join(f"{k}: {v}" for k, v in self._sources.items())
                             if self._sources else "")
        for key, label in self.values.items():
            source = "this window's answer, counted as it streams" if key == "tokens_per_second" and live \
                else self._sources.get(key)
            label.setToolTip(f"From {source}" if source else "")


def _broken_at_gaps(points: deque[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """x and y with a NaN between readings more than GAP_SECONDS apart, so no line is drawn across the gap."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (x, y) in enumerate(points):
        if i and x - points[i - 1][0] > GAP_SECONDS:
            xs.append((x + points[i - 1][0]) / 2)
            ys.append(float("nan"))
        xs.append(x)
        ys.append(y)
    return np.array(xs, dtype=float), np.array(ys, dtype=float)
