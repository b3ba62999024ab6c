"""The live dashboard: tok/s against the roofline ceiling, acceptance, tokens per pass, memory.

All numbers come from ``app.ceiling.metrics.LiveMetrics``; this module only paints them. Plot items are created once
and fed copies of the ring buffers on a timer that runs only while a generation is streaming.
Over 500 lines: six plots built once and painted incrementally, each with its own change checks; the live
figures' strip, the memory rows and the plotting parts live apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, Qt, QTimer, Slot
from PySide6.QtGui import QBrush, QImage, QPainter, QPalette, QPen, QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsRectItem,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ceiling.builder import CeilingInfo, ceiling_for_loaded
from app.ceiling.memory import LoadedModels, MemoryProbe, MemoryReading, placement
from app.ceiling.metrics import LiveMetrics, MetricsSnapshot
from app.events import EngineCrashed, Finished, Loaded, PassStats
from app.units import format_bytes
from ui.bridge import EngineBridge
from ui.dashboard.memory import memory_rows, read_memory
from ui.dashboard.plots import (
    BLUE,
    GREEN,
    ORANGE,
    PURPLE,
    RED,
    XRange,
    YRange,
    decode_axis_top,
    hline,
    make_plot,
    with_alpha,
)
from ui.dashboard.strip import LiveStrip
from ui.figures import PLAIN_RATE
from ui.tasks import TaskRunner

REPAINT_MS = 100  # 10 Hz: a frame costs ~7 ms of software rendering with the axes cached
PLOTS_MIN_WIDTH = 300
PLOTS_MIN_HEIGHT = 560  # below this the plots scroll rather than squash (titles and ticks stay readable)
PLOTS_MIN_HEIGHT_ONE_COLUMN = 900
TWO_COLUMNS_MIN_WIDTH = 600  # narrower: the plots stack in one column
MEMORY_PERIOD_S = 1.0
IDLE_STOP_S = 3.0  # no pass for this long: stop the timer even if no Finished came (a crash, say)
MB = 1e6
CeilingProvider = Callable[[Loaded], CeilingInfo | None]


class DashboardPanel(QWidget):
    """Live plots of one loaded model's decoding, fed by the bridge's signals (``attach``) on the GUI
    thread; the panel repaints itself at 10 Hz while tokens stream and sits still otherwise."""

    MIN_WIDTH = PLOTS_MIN_WIDTH + 30  # the plots plus the scroll bar and margins

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        ceiling_provider: CeilingProvider = ceiling_for_loaded,
        memory_probe: MemoryProbe | None = None,
        capacity: int = 2048,
        tasks: TaskRunner | None = None,
    ) -> None:
        super().__init__(parent)
        self.metrics = LiveMetrics(capacity)
        self._ceiling_provider = ceiling_provider
        self._tasks = tasks if tasks is not None else TaskRunner(self)
        self._memory_probe = memory_probe
        # NVML, psutil and the loaded models' placement are read on this one-thread worker (NVML can stall
        # for a while under load); the paint shows the latest reading.
        self._memory_tasks = TaskRunner(self, max_threads=1)
        self._memory_reading = False  # a read is running
        self._memory_again = False  # the state changed while it ran: read once more when it ends
        self._memory: MemoryReading | None = None
        self._memory_at = 0.0
        self._bridge: EngineBridge | None = None
        self._engine_rss: int | None = None  # the engine worker's resident memory
        self._last_pass_at = 0.0
        self._ceiling_serial = 0  # a ceiling computed for an earlier model is dropped when it arrives
        self.repaints = 0

        self.timer = QTimer(self)
        self.timer.setInterval(REPAINT_MS)
        self.timer.timeout.connect(self._on_timer_timeout)

        self._build()
        self.setMinimumWidth(self.MIN_WIDTH)  # narrower would cut the plots (they scroll only vertically)
        self._apply_palette()
        self._paint()
        self._warm_up_plots()

    def _warm_up_plots(self) -> None:
        """Paint the plots once into an offscreen image while the window is built.

        A first paint does one-time work (fonts, the axes' text layout, Python's first calls) at several times
        the cost of a repaint; done here it happens before the window shows instead of in its first frame,
        which held a busy machine's GUI thread for 114–174 ms in the soak.
        """
        self.graphics.resize(self.graphics.minimumSize())
        ratio = self.devicePixelRatioF()  # the screen's, so the cached glyphs are the ones the window will use
        image = QImage(self.graphics.size() * ratio, QImage.Format.Format_ARGB32_Premultiplied)
        image.setDevicePixelRatio(ratio)
        painter = QPainter(image)
        try:
            self.graphics.render(painter)
        finally:
            painter.end()

    # --- public API (GUI thread) ------------------------------------------------------------------

    def attach(self, bridge: EngineBridge) -> None:
        """Follow the engine: models loaded and gone, every pass, every finished answer."""
        self._bridge = bridge
        bridge.model_loaded.connect(self.on_loaded)
        bridge.model_unloaded.connect(self.on_unloaded)
        bridge.load_cancelled.connect(self.on_unloaded)
        bridge.engine_crashed.connect(self._on_bridge_engine_crashed)
        bridge.stats_updated.connect(self.on_pass)
        bridge.generation_finished.connect(self.on_finished)

    @Slot(Loaded)
    def on_loaded(self, event: Loaded) -> None:
        self.timer.stop()
        self.metrics.on_loaded(event)  # forgets the previous model's ceiling
        self._probe().follow(LoadedModels.from_loaded(event))
        self._ceiling_serial += 1
        serial = self._ceiling_serial
        provider = self._ceiling_provider
        # Probing the hardware can take a moment the first time (the CPU bandwidth probe).
        self._tasks.run(lambda: provider(event), lambda c: self._on_ceiling_ready(serial, c),
                        lambda _exc: self._on_ceiling_ready(serial, None))
        self._poll_memory(force=True)
        self._paint()

    def _on_ceiling_ready(self, serial: int, ceiling: CeilingInfo | None) -> None:
        if serial != self._ceiling_serial:
            return  # another model was loaded (or unloaded) meanwhile
        self.metrics.set_ceiling(ceiling)  # no ceiling is a normal answer; the plots still run
        self._paint()

    def set_ceiling(self, ceiling: CeilingInfo | None) -> None:
        """Replace the ceiling (e.g. after a calibration run)."""
        self._drop_ceiling_probe()  # a probe still running must not overwrite this
        self.metrics.set_ceiling(ceiling)
        self._paint()

    def forget_answer(self) -> None:
        """Another chat was opened: the strip and the plots no longer show the last answer's figures."""
        if not self.metrics.generating:
            self.metrics.reset()
            self._paint()

    @Slot(PassStats)
    def on_pass(self, event: PassStats) -> None:
        self.metrics.on_pass(event)
        self._last_pass_at = time.monotonic()
        if not self.timer.isActive():
            self.timer.start()

    @Slot(Finished)
    def on_finished(self, event: Finished) -> None:
        if event.request_id < 0:
            return  # the request never reached the engine: nothing to count
        self.metrics.on_finished(event)
        self.timer.stop()
        self._poll_memory(force=True)
        self._paint()

    @Slot()
    def on_unloaded(self) -> None:
        self.timer.stop()
        self._drop_ceiling_probe()
        self.metrics.on_unloaded()
        self._probe().follow(None)
        self._poll_memory(force=True)
        self._paint()

    def reset(self) -> None:
        self.timer.stop()
        self.metrics.reset()
        self._paint()

    @property
    def generating(self) -> bool:
        return self.timer.isActive()

    def snapshot(self) -> MetricsSnapshot:
        return self.metrics.snapshot()

    # --- slots ------------------------------------------------------------------------------------

    def _drop_ceiling_probe(self) -> None:
        self._ceiling_serial += 1

    @Slot(EngineCrashed)
    def _on_bridge_engine_crashed(self, _event: EngineCrashed) -> None:
        self.on_unloaded()

    @Slot()
    def _on_timer_timeout(self) -> None:
        self._poll_memory()
        self._paint()
        if time.monotonic() - self._last_pass_at > IDLE_STOP_S:
            self.timer.stop()

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._apply_palette()
            self._paint()  # the keys and labels drawn in the new colours now, not at the next reading
        super().changeEvent(event)

    # --- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        outer.setSpacing(4)

        self.strip = LiveStrip(self)
        self.labels = self.strip.labels
        outer.addWidget(self.strip)

        # The plots keep a readable height and scroll when the window is shorter than that.
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.graphics.setMinimumSize(PLOTS_MIN_WIDTH, PLOTS_MIN_HEIGHT)
        self.plots_scroll = QScrollArea(self)
        self.plots_scroll.setWidgetResizable(True)
        self.plots_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.plots_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.plots_scroll.setWidget(self.graphics)
        outer.addWidget(self.plots_scroll, 1)
        g = self.graphics

        def plot(row: int, col: int, title: str, left: str, bottom: str, colspan: int = 1) -> pg.PlotItem:
            return make_plot(g, row, col, title, left, bottom, colspan)

        # tok/s over time with the ceilings.
        self.p_tps = plot(0, 0, "Decode speed", "tok/s", "seconds", colspan=2)
        # A plain C++ rect, not pg.LinearRegionItem: its Python boundingRect crashed PySide6 6.12 with
        # "deallocating None" after a few thousand repaints.
        self.above_wall = QGraphicsRectItem(QRectF(0, 0, 0, 0))
        self.above_wall.setPen(QPen(Qt.PenStyle.NoPen))
        self.above_wall.setZValue(-10)
        self.above_wall.setVisible(False)
        self.p_tps.addItem(self.above_wall)
        self._wall_rect = QRectF()
        self.c_tps = self.p_tps.plot(pen=pg.mkPen(with_alpha(BLUE, 110), width=1), connect="finite",
                                     name="per pass")
        self.c_tps_smooth = self.p_tps.plot(pen=pg.mkPen(BLUE, width=2.5), connect="finite",
                                            name="1 s average")
        solid, dash, dot = Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine, Qt.PenStyle.DotLine
        self.l_spec = hline(self.p_tps, RED, solid, "bandwidth roof: {value:.0f}")
        self.l_measured = hline(self.p_tps, ORANGE, dash, PLAIN_RATE + ": {value:.0f}", at=0.42)
        self.l_spec_tau = hline(self.p_tps, GREEN, dot, "τ × roof: {value:.0f}", at=0.74)
        # What the lines mean, under the chart. The two differ by design: the roof is the memory bandwidth over
        # the bytes each token reads; the plain rate is one-token decoding timed here at load. (The chat's
        # "× the plain rate" divides by the one-token rate of the answer's own time, not this line.)
        self.tps_legend = pg.LabelItem("", size="7pt", justify="left")
        self._tps_legend_note: str | None = None
        self.y_tps = YRange(self.p_tps, 10.0)

        # Acceptance over time and per draft position.
        self.p_acc = plot(1, 0, "Acceptance", "accepted / drafted", "seconds")
        self.p_acc.setYRange(0, 1.05, padding=0)
        # A faint line, not symbols: a 2048-point scatter costs ~10 ms a frame.
        self.c_acc = self.p_acc.plot(pen=pg.mkPen(with_alpha(PURPLE, 70), width=1), connect="finite")
        self.c_acc_roll = self.p_acc.plot(pen=pg.mkPen(PURPLE, width=2), connect="finite")
        self.p_pos = plot(1, 1, "Acceptance per draft position", "accepted / drafted", "position")
        self.p_pos.setYRange(0, 1.05, padding=0)
        self.p_pos.setXRange(0.5, 8.5, padding=0)
        self.bars_pos = pg.BarGraphItem(x=np.zeros(0), height=np.zeros(0), width=0.7, brush=PURPLE)
        self.p_pos.addItem(self.bars_pos)
        self._pos_n = 8
        self._pos_heights = np.zeros(0)

        # Tokens per pass against Leviathan, and k over time.
        self.p_tau = plot(2, 0, "Tokens per pass τ vs draft depth", "τ", "k")
        self.tau_legend = self.p_tau.addLegend(offset=(8, 4), labelTextSize="7pt")  # which is theory, which data
        self.c_curve = self.p_tau.plot(pen=pg.mkPen(GREEN, width=2), name="Leviathan E[τ] at measured α")
        self.c_tau_k = self.p_tau.plot(pen=None, symbol="o", symbolSize=9, symbolPen=None,
                                       symbolBrush=BLUE, name="measured mean τ")
        self._tau_kmax = 0
        self._curve_tau = np.zeros(0)
        self._tau_k_k = np.zeros(0)
        self._tau_k_mean = np.zeros(0)
        self.p_k = plot(2, 1, "k chosen (orange), τ (blue)", "k", "seconds")
        self.c_k = self.p_k.plot(pen=pg.mkPen(ORANGE, width=1.5))
        self.c_tau_roll = self.p_k.plot(pen=pg.mkPen(with_alpha(BLUE, 160), width=1.5))
        self.y_k = YRange(self.p_k, 4.0)
        self.x_time = XRange((self.p_tps, self.p_acc, self.p_k))
        self._x_request: int | None = None  # the answer the time axis was fitted to

        # Memory: one bar per part of the loaded model and per process, in MB (a 0.1 GB model stays visible).
        self.p_mem = plot(3, 0, "Memory (MB)", "", "MB", colspan=2)
        self.bars_mem = pg.BarGraphItem(x0=np.zeros(0), y=np.zeros(0), width=np.zeros(0), height=0.6)
        self.p_mem.addItem(self.bars_mem)
        self.mem_label = QLabel("", self)
        self.mem_label.setObjectName("dashboard_memory")
        self.mem_label.setWordWrap(True)
        self.mem_label.setTextFormat(Qt.TextFormat.PlainText)
        outer.addWidget(self.mem_label)
        self._columns = 2
        self._arrange_plots(1)

    def _arrange_plots(self, columns: int) -> None:
        """Two columns when the dock is wide enough, one (and a taller, scrolling area) when narrow."""
        if columns == self._columns:
            return
        self._columns = columns
        ci = self.graphics.ci
        for item in list(ci.items):
            ci.removeItem(item)
        two = [(self.p_tps, 0, 0, 2, 3), (self.tps_legend, 1, 0, 2, 0), (self.p_acc, 2, 0, 1, 2),
               (self.p_pos, 2, 1, 1, 2), (self.p_tau, 3, 0, 1, 2), (self.p_k, 3, 1, 1, 2), (self.p_mem, 4, 0, 2, 1)]
        one = [(self.p_tps, 0, 0, 1, 3), (self.tps_legend, 1, 0, 1, 0), (self.p_acc, 2, 0, 1, 2),
               (self.p_pos, 3, 0, 1, 2), (self.p_tau, 4, 0, 1, 2), (self.p_k, 5, 0, 1, 2), (self.p_mem, 6, 0, 1, 1)]
        for r in range(7):
            ci.layout.setRowStretchFactor(r, 0)
        for item, row, col, colspan, stretch in (two if columns == 2 else one):
            ci.addItem(item, row=row, col=col, colspan=colspan)
            ci.layout.setRowStretchFactor(row, stretch)
        self.graphics.setMinimumHeight(PLOTS_MIN_HEIGHT if columns == 2 else PLOTS_MIN_HEIGHT_ONE_COLUMN)

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._arrange_plots(2 if event.size().width() >= TWO_COLUMNS_MIN_WIDTH else 1)
        super().resizeEvent(event)

    def _show_tps_legend(self, off_scale: str) -> None:
        """The decode chart's key; ``off_scale`` names ceilings too far above the data to draw."""
        key = f"{off_scale}|{self._bandwidth_source()}"  # the roof's source arrives with the ceiling
        if key == self._tps_legend_note:
            return
        self._tps_legend_note = key
        lines = [
            f"<span style='color:{BLUE.name()}'>━</span> 1 s average &nbsp; "
            f"<span style='color:{BLUE.name()}'>─</span> each pass",
            f"<span style='color:{RED.name()}'>━</span> bandwidth roof: {self._bandwidth_source()} bandwidth ÷ "
            "bytes per token",
            f"<span style='color:{ORANGE.name()}'>╍</span> {PLAIN_RATE}: one token per pass, timed here at load",
            f"<span style='color:{GREEN.name()}'>┅</span> τ × roof: the most speculation can give",
        ]
        if off_scale:
            lines.append(f"off scale: {off_scale} tok/s")
        self.tps_legend.setText("<br>".join(lines), color=self._fg.name())

    def _bandwidth_source(self) -> str:
        """"probed" (a CPU's) or "spec-sheet" (a GPU's): the roof's bandwidth is named for where it came from."""
        source = self.metrics.ceiling.bandwidth_source if self.metrics.ceiling is not None else ""
        return {"probed": "probed", "spec sheet": "spec-sheet"}.get(source, "memory")

    def _apply_palette(self) -> None:
        pal = self.palette()
        bg = pal.color(QPalette.ColorRole.Base)
        fg = pal.color(QPalette.ColorRole.WindowText)
        self._fg = fg
        self._tps_legend_note = None  # the key is drawn again in the new colours at the next paint
        self._mem_bg = with_alpha(fg, 40)
        self.graphics.setBackground(bg)
        for p in (self.p_tps, self.p_acc, self.p_pos, self.p_tau, self.p_k, self.p_mem):
            for name in ("left", "bottom"):
                ax = p.getAxis(name)
                ax.setPen(pg.mkPen(fg))
                ax.setTextPen(pg.mkPen(fg))
            p.titleLabel.setAttr("color", fg)
            p.titleLabel.setText(p.titleLabel.text)
        self.tau_legend.setLabelTextColor(fg)
        self.tau_legend.setBrush(pg.mkBrush(with_alpha(bg, 210)))  # readable over the points it may cover
        for _sample, label in self.tau_legend.items:
            label.setText(label.text, color=fg)
        # Tint above the one-token wall: speeds there are only possible by speculating.
        self.above_wall.setBrush(QBrush(with_alpha(GREEN, 35)))

    # --- painting ---------------------------------------------------------------------------------

    def _poll_memory(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._memory_at < MEMORY_PERIOD_S:
            return
        self._memory_at = now
        if force:
            self._paint_memory()  # the models' rows change now; the devices' follow with the reading
        if self._memory_reading:
            self._memory_again = self._memory_again or force
            return
        self._memory_reading = True
        probe = self._probe()
        pid = self._bridge.worker_pid if self._bridge is not None else None
        self._memory_tasks.run(lambda: read_memory(probe, pid), self._on_memory_read,
                               lambda _exc: self._on_memory_read((None, None)))

    def _on_memory_read(self, read: tuple[MemoryReading | None, int | None]) -> None:
        self._memory_reading = False
        reading, self._engine_rss = read
        if reading is not None:  # psutil/NVML hiccup: keep the last reading
            self._memory = reading
        self._paint_memory()
        if self._memory_again:
            self._memory_again = False
            self._poll_memory(force=True)

    def _probe(self) -> MemoryProbe:
        if self._memory_probe is None:
            self._memory_probe = MemoryProbe()
        return self._memory_probe

    def _paint(self) -> None:
        s = self.metrics.snapshot()
        self.repaints += 1
        self.strip.paint(s, loaded=self.metrics.loaded is not None)
        t = s.t
        if self.metrics.request_id != self._x_request:
            self._x_request = self.metrics.request_id
            self.x_time.hi = self.x_time.lo = -1.0  # each answer starts its own time axis at 0
        # Copies already: the snapshot owns its arrays, so pyqtgraph may keep views of them.
        self.c_tps.setData(t, s.tps)
        self.c_tps_smooth.setData(t, s.tps_smooth)
        self.c_acc.setData(t, s.acceptance)
        self.c_acc_roll.setData(t, s.acceptance_roll)
        self.c_k.setData(t, s.k)
        self.c_tau_roll.setData(t, s.tau_roll)
        if len(t):
            self.x_time.fit(float(t[0]), float(t[-1]))
        else:
            self.x_time.fit(0.0, 0.0)

        spec, measured, spec_tau = s.spec_ceiling, s.measured_ceiling, s.speculative_ceiling
        data_top = float(np.nanmax(s.tps_smooth)) if len(t) and np.isfinite(s.tps_smooth).any() else 0.0
        top, off_scale = decode_axis_top(data_top, {PLAIN_RATE: measured, "bandwidth roof": spec,
                                                    "τ × roof": spec_tau})
        for line, name, value in ((self.l_spec, "bandwidth roof", spec), (self.l_measured, PLAIN_RATE, measured),
                                  (self.l_spec_tau, "τ × roof", spec_tau)):
            if value is None or not np.isfinite(value) or name in off_scale:
                line.setVisible(False)
            else:
                # Shown first: pyqtgraph leaves a hidden line's label text as it was. Moving the line
                # re-renders its label, so changes too small to see are skipped.
                was_visible = line.isVisible()
                line.setVisible(True)
                if abs(line.value() - value) > 0.005 * max(abs(value), 1e-9) or not was_visible:
                    line.setValue(value)
                    line.label.valueChanged()
        # A ceiling far above the data would flatten the curve: it is named in the title instead of drawn.
        self._show_tps_legend(", ".join(f"{name} {value:.0f}" for name, value in off_scale.items()))
        self.y_tps.fit(top)
        if spec is not None and np.isfinite(spec):
            x = self.x_time
            rect = QRectF(x.lo, spec, x.hi - x.lo, max(self.y_tps.top, spec) * 2 - spec)
            if rect != self._wall_rect:
                self._wall_rect = rect
                self.above_wall.setRect(rect)
            self.above_wall.setVisible(True)
        else:
            self.above_wall.setVisible(False)

        n = len(s.position_acceptance)
        if not np.array_equal(s.position_acceptance, self._pos_heights):
            self._pos_heights = s.position_acceptance
            self.bars_pos.setOpts(x=np.arange(1, n + 1, dtype=float), height=s.position_acceptance, width=0.7)
        if max(n, 8) != self._pos_n:
            self._pos_n = max(n, 8)
            self.p_pos.setXRange(0.5, self._pos_n + 0.5, padding=0)

        if not np.array_equal(s.curve_tau, self._curve_tau):
            self._curve_tau = s.curve_tau
            self.c_curve.setData(s.curve_k, s.curve_tau)
        if not (np.array_equal(s.tau_by_k_mean, self._tau_k_mean)
                and np.array_equal(s.tau_by_k_k, self._tau_k_k)):
            self._tau_k_k, self._tau_k_mean = s.tau_by_k_k, s.tau_by_k_mean
            self.c_tau_k.setData(s.tau_by_k_k, s.tau_by_k_mean)
        kmax = int(s.curve_k[-1]) if len(s.curve_k) else 8
        if kmax != self._tau_kmax:
            self._tau_kmax = kmax
            self.p_tau.setXRange(-0.5, kmax + 0.5, padding=0)
            self.p_tau.setYRange(0, kmax + 1.5, padding=0)
        self.y_k.fit(float(np.nanmax(s.k)) + 1 if len(s.k) else 0.0)

    def memory_rows(self) -> list[tuple[str, float]]:
        """The memory chart's bars, top to bottom (see ``memory_rows``)."""
        kv_used = self.metrics.current().kv_bytes_used if self.metrics.loaded is not None else 0
        return memory_rows(self.metrics.loaded, kv_used, self._memory, self._engine_rss)

    def _paint_memory(self) -> None:
        m = self._memory
        rows = self.memory_rows()
        colours = {"target weights": ORANGE, "drafter weights": PURPLE, "KV allocated": GREEN, "KV used": GREEN,
                   "engine process": BLUE, "window process": BLUE}
        ys = [float(len(rows) - 1 - i) for i in range(len(rows))]
        widths = [b / MB for _, b in rows]
        brushes = [with_alpha(colours.get(label, ORANGE if label.endswith("weights+KV") else BLUE),
                          110 if label == "KV allocated" else 220) for label, _ in rows]
        # pyqtgraph 0.14 fails on an empty list of pens (nothing to draw: no model, no reading yet).
        self.bars_mem.setOpts(x0=np.zeros(len(rows)), y=np.array(ys), width=np.array(widths), height=0.6,
                              brushes=brushes, pens=[pg.mkPen(None)] * len(rows) if rows else None)
        ticks = [(y, f"{label} {b / MB:,.0f}") for y, (label, b) in zip(ys, rows, strict=True)]
        self.p_mem.getAxis("left").setTicks([ticks])
        self.p_mem.setXRange(0, max([*widths, 1.0]) * 1.05, padding=0)
        self.p_mem.setYRange(-0.6, max(len(rows), 1) - 0.4, padding=0)
        text: list[str] = []
        if m is not None:
            text += [f"{g.device or f'GPU{g.index}'} {g.name}: "
                     + (f"{format_bytes(g.used, 'GB')} of {format_bytes(g.total, 'GB')} used" if g.used is not None
                        else f"{format_bytes(g.total, 'GB')}, use not reported by the device") for g in m.gpus]
            text.append(f"RAM: {format_bytes(m.ram_used, 'GB')} of {format_bytes(m.ram_total, 'GB')} used")
        ld = self.metrics.loaded
        if ld is not None:
            where = placement(ld.devices, ld.main_gpu is not None)
            text.insert(0, where[0].upper() + where[1:])  # which device(s) the bars are about
        self.mem_label.setText(" · ".join(text))
