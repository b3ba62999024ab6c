"""The Remote engine dock fits a 1024×700 screen without growing the window, uses the window's colours, names
no raw metric over its plots, shows this window's own answer live while it streams, and calls the measured
plain rate what it is."""

from __future__ import annotations

from collections import deque

import numpy as np
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QWidget
from pytestqt.qtbot import QtBot

from app.remote.scrape import RemoteRates
from ui.remote.panel import FIGURES, GAP_SECONDS, RemoteDashboard, _broken_at_gaps
from ui.tasks import TaskRunner


def test_the_dock_fits_a_small_screen_without_growing_the_window(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    window.remote.dock.show()
    qtbot.wait(50)
    assert window.width() <= 1024
    assert window.height() <= 700
    assert window.minimumSizeHint().height() <= 700


def test_the_dock_uses_the_window_colours_and_keeps_metric_names_in_tooltips(qtbot: QtBot) -> None:
    owner = QWidget()
    qtbot.addWidget(owner)
    panel = RemoteDashboard(TaskRunner(owner), owner)
    base = panel.palette().color(QPalette.ColorRole.Base)
    assert panel.tps_plot.backgroundBrush().color() == base
    source = "llamacpp:tokens_predicted_total / llamacpp:tokens_predicted_seconds_total"
    busy = RemoteRates(1.0, 42.0, 0.5, None, None, None, None, None, {"tokens_per_second": source})
    panel.show_rates(busy, {"tokens_per_second": True, "acceptance": True}, 1.0)
    assert "llamacpp:tokens_predicted_total" in panel.values["tokens_per_second"].toolTip()
    shown = " ".join(label.text() for label in panel.findChildren(QLabel) if label.isVisibleTo(panel))
    assert "llamacpp:" not in shown
    titles = [title for _key, title, _fmt in FIGURES]
    assert "Plain rate (measured at load)" in titles
    assert not any("ceiling" in title.lower() for title in titles)


def test_this_windows_answer_is_live_while_it_streams(qtbot: QtBot) -> None:
    owner = QWidget()
    qtbot.addWidget(owner)
    panel = RemoteDashboard(TaskRunner(owner), owner)
    still = RemoteRates(1.0, None, None, None, None, None, None, None, {})
    exposed = {"tokens_per_second": True}
    panel.show_rates(RemoteRates(1.0, 30.0, None, None, None, None, None, None, {}), exposed, 1.0)
    panel.stream_started()
    for _ in range(12):
        panel.stream_tokens(1)
    panel.show_rates(still, exposed, 2.0)  # the server's counters stand still mid-answer
    assert panel.values["tokens_per_second"].text() == "12.0 (this window's answer, live)"
    panel.stream_ended()
    panel.show_rates(still, exposed, 3.0)
    assert "counters unchanged" in panel.values["tokens_per_second"].text()


def test_readings_far_apart_are_not_joined() -> None:
    xs, ys = _broken_at_gaps(deque([(0.0, 1.0), (1.0, 2.0), (1.0 + 2 * GAP_SECONDS, 3.0)]))
    assert list(xs[:2]) == [0.0, 1.0]
    assert np.isnan(ys[2])
    assert list(ys[[0, 1, 3]]) == [1.0, 2.0, 3.0]
