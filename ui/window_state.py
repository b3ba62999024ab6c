"""The window's layout between sessions: geometry, docks, the chat's splitter and the open chat, in
``window.ini`` (QSettings, in the config folder), kept apart from the user's settings; and a first start's
layout, sized to the screen.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, QSize, Qt
from PySide6.QtGui import QGuiApplication

from app.paths import config_dir
from app.storage.atomic import irregular
from ui.chat.chat_list import HISTORY_MIN_WIDTH
from ui.dashboard.panel import DashboardPanel

if TYPE_CHECKING:
    from ui.main_window import MainWindow

logger = logging.getLogger(__name__)

WINDOW_STATE_FILE = "window.ini"
WINDOW_STATE_MAX_BYTES = 1 << 20  # the layout is a few kB
WINDOW_STATE_VERSION = 2  # layouts saved by older versions (fixed 1800 px docks) are not restored
SCREEN_SHARE = 0.92  # a first start opens at this share of the screen's free area
SIDE_DOCK_MIN_WIDTH = 250  # the picker's widgets wrap below their natural width down to this
# Below this width a first start shows the Models and Dashboard docks as tabs of one dock: side by side they
# left the chat 225 px at 1024×700. The Dashboard tab comes to the front once a model is loaded.
TABBED_DOCKS_BELOW_WIDTH = 1200  # a 1366-pixel screen's first window (1256 px) keeps them side by side


def default_window_size(available: QSize) -> QSize:
    """The first-start size: most of the screen's free area, never more than 1600×1000."""
    return QSize(min(int(available.width() * SCREEN_SHARE), 1600),
                 min(int(available.height() * SCREEN_SHARE), 1000))


class WindowState:
    """One window's layout: ``restore`` once the window is built, ``on_show`` at each show, ``save`` at close."""

    def __init__(self, window: MainWindow) -> None:
        self.window = window
        self._warned = False  # an unusable window.ini is told once
        self._default_docks_pending = False
        self.raise_dashboard_on_load = False  # docks tabbed on a small screen: show the dashboard after a load

    def _qsettings(self) -> QSettings:
        path = config_dir() / WINDOW_STATE_FILE
        problem = irregular(path, WINDOW_STATE_MAX_BYTES)
        if problem is not None:
            # QSettings would wait for ever on a FIFO, or read a device or a 1 GB file whole: the layout is
            # worth less than a window that opens.
            aside = path.with_name(f"{WINDOW_STATE_FILE}.unusable")
            try:
                os.replace(path, aside)
                note = f"it was moved to {aside.name}"
            except OSError:
                path = Path(tempfile.gettempdir()) / f"specdeck-{os.getpid()}-{WINDOW_STATE_FILE}"
                note = "the window layout is not kept this time"
            if not self._warned:
                self._warned = True
                logger.warning("%s was not used (%s); %s", WINDOW_STATE_FILE, problem, note)
        return QSettings(str(path), QSettings.Format.IniFormat)

    def restore(self) -> None:
        """Once the window is built: its saved layout, else the first start's (sized at the first show)."""
        qs = self._qsettings()
        saved = qs.value("version") == str(WINDOW_STATE_VERSION)
        geometry = qs.value("geometry") if saved else None
        # Docks first, then geometry: restoring the geometry last keeps the saved size even when the
        # docks' state would have asked for another (it did: 1600×1000 came back as 1545×433).
        state = qs.value("state") if saved else None
        # Default dock widths wait for the first show: before it the docks have no size to share out.
        self._default_docks_pending = state is None or not self.window.restoreState(state, WINDOW_STATE_VERSION)
        if geometry is None or not self.window.restoreGeometry(geometry):
            self._default_size()
        splitter = qs.value("chat_splitter") if saved else None
        if splitter is not None:
            self.window.chat.splitter.restoreState(splitter)
        last_chat = qs.value("last_chat")
        if last_chat is not None and self.window.store is not None:
            self.window.chat.reopen(int(last_chat))

    def _default_size(self) -> None:
        screen = self.window.screen() or QGuiApplication.primaryScreen()
        size = default_window_size(screen.availableGeometry().size()) if screen else QSize(1280, 800)
        self.window.resize(size)

    def on_show(self) -> None:
        """The window is shown: a first start's docks get their widths now (before, they have no size)."""
        if self._default_docks_pending:
            self._default_docks_pending = False
            self._default_layout()
        self._keep_chat_wider_than_list()

    def _default_layout(self) -> None:
        width = self.window.width()
        if width < TABBED_DOCKS_BELOW_WIDTH:
            self.window.tabifyDockWidget(self.window.models_dock, self.window.dashboard_dock)
            self.window.models_dock.raise_()
            self.raise_dashboard_on_load = True
            side = max(SIDE_DOCK_MIN_WIDTH, DashboardPanel.MIN_WIDTH, width * 3 // 10)
            self.window.resizeDocks([self.window.models_dock], [side], Qt.Orientation.Horizontal)
            return
        self.window.resizeDocks([self.window.models_dock, self.window.dashboard_dock],
                                [max(SIDE_DOCK_MIN_WIDTH, width // 5), max(DashboardPanel.MIN_WIDTH, width * 3 // 10)],
                                Qt.Orientation.Horizontal)

    def _keep_chat_wider_than_list(self) -> None:
        """A restored splitter (saved on a wider screen) must not give the chat list more room than the chat."""
        sizes = self.window.chat.splitter.sizes()
        if len(sizes) == 2 and sizes[0] > sizes[1]:
            total = sum(sizes)
            first = max(HISTORY_MIN_WIDTH, total // 4)
            self.window.chat.splitter.setSizes([first, total - first])

    def save(self) -> None:
        qs = self._qsettings()
        qs.setValue("version", str(WINDOW_STATE_VERSION))
        qs.setValue("geometry", self.window.saveGeometry())
        qs.setValue("state", self.window.saveState(WINDOW_STATE_VERSION))
        qs.setValue("chat_splitter", self.window.chat.splitter.saveState())
        qs.setValue("last_chat", self.window.chat.stored_chat_id())
        qs.sync()
