"""The dashboard's plotting parts: colours, plots that hold still, axes that move in steps, labelled lines."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QGraphicsItem

# Hues readable on light and dark backgrounds; the neutral colours come from the palette.
BLUE = QColor(31, 119, 180)
ORANGE = QColor(255, 127, 14)
GREEN = QColor(44, 160, 44)
RED = QColor(214, 39, 40)
PURPLE = QColor(148, 103, 189)


def with_alpha(c: QColor, a: int) -> QColor:
    out = QColor(c)
    out.setAlpha(a)
    return out


def decode_axis_top(data_top: float, ceilings: dict[str, float | None]) -> tuple[float, dict[str, float]]:
    """The decode chart's top: the data plus the nearest ceiling above it (or all ceilings below it).
    Returns it with the ceilings left off the scale, which the title names instead."""
    known = {n: v for n, v in ceilings.items() if v is not None and np.isfinite(v) and v > 0}
    above = [v for v in known.values() if v >= data_top]
    top = max(data_top, min(above) if above else 0.0, *(v for v in known.values() if v < data_top))
    off = {n: v for n, v in known.items() if v > top * 1.02}
    return top, off


class XRange:
    """A time axis that jumps ahead in steps instead of sliding every frame: a moving range repaints the
    axis (text rendering dominates a frame's cost), a still one does not."""

    def __init__(self, plots: tuple[pg.PlotItem, ...]) -> None:
        self.plots = plots
        self.lo = 0.0
        self.hi = 0.0

    def fit(self, t0: float, t1: float) -> None:
        span = max(self.hi - self.lo, 1e-9)
        if t1 > self.hi or t1 < self.lo or t0 - self.lo > 0.1 * span or t0 < self.lo:
            self.lo = t0
            self.hi = t0 + max((t1 - t0) * 1.25, 2.0)
            for p in self.plots:
                p.setXRange(self.lo, self.hi, padding=0)


class YRange:
    """Sets a plot's y range only when the data outgrows it or shrinks well below it (no per-frame churn)."""

    def __init__(self, plot: pg.PlotItem, minimum: float) -> None:
        self.plot = plot
        self.minimum = minimum
        self.top = 0.0

    def fit(self, wanted: float) -> None:
        wanted = max(wanted, self.minimum)
        # Keep 10 % headroom: a line near the top would have its label cut off.
        if wanted * 1.1 > self.top or wanted < 0.5 * self.top:
            self.top = wanted * 1.25
            self.plot.setYRange(0.0, self.top, padding=0)


def make_plot(g: pg.GraphicsLayoutWidget, row: int, col: int, title: str, left: str, bottom: str,
              colspan: int = 1) -> pg.PlotItem:
    """A still plot (no mouse, no auto-range, no menu) whose axes are cached: a frame redraws only data."""
    p = g.addPlot(row=row, col=col, colspan=colspan, title=title)
    p.setLabel("left", left)
    p.setLabel("bottom", bottom)
    p.disableAutoRange()
    p.setMouseEnabled(x=False, y=False)
    p.hideButtons()
    p.setMenuEnabled(False)
    p.showGrid(x=True, y=True, alpha=0.15)
    # Axes (tick text, grid) are drawn into a cached pixmap: replaying their text every frame was
    # most of a frame's cost, and that CPU comes out of decoding on a small machine.
    for side in ("left", "bottom"):
        p.getAxis(side).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    p.titleLabel.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
    return p


def hline(p: pg.PlotItem, color: QColor, style: Qt.PenStyle, fmt: str, at: float = 0.02) -> pg.InfiniteLine:
    """A hidden horizontal line with its label, for a ceiling (shown once its value is known)."""
    # Labels sit at different points along the plot, so lines at similar heights stay readable, and hang
    # below their line: above it, a line near the top edge had its label cut off.
    line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(color, width=1.5, style=style),
                           label=fmt, labelOpts={"position": at, "color": color,
                                                 "anchors": [(0, 0), (0, 0)]})
    line.setVisible(False)
    p.addItem(line)
    return line
