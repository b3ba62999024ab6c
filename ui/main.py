"""The window's entry point: ``specdeck`` without a subcommand calls ``run_app``."""

from __future__ import annotations

import os
import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.paths import APP_NAME
from ui.soak import AUTOPILOT_ENV


def run_app(argv: list[str] | None = None) -> int:
    from ui.main_window import MainWindow
    from ui.notifier import Notifier

    existing = QApplication.instance()
    qt_app = existing if isinstance(existing, QApplication) else QApplication(
        list(sys.argv if argv is None else argv))
    qt_app.setApplicationName(APP_NAME)
    qt_app.setOrganizationName(APP_NAME)
    qt_app.setApplicationDisplayName(APP_NAME)
    notifier = Notifier()
    notifier.install_hooks()
    window = MainWindow(notifier=notifier)
    window.show()
    if os.environ.get(AUTOPILOT_ENV):  # the soak harness loads only when a script asks for it
        from ui.soak.autopilot import start_if_requested

        start_if_requested(window)  # the window owns it
    quit_after = os.environ.get("SPECDECK_QUIT_AFTER_MS")
    if quit_after and quit_after.isdigit():  # smoke tests: show the window, then close it cleanly
        QTimer.singleShot(int(quit_after), window.close)
    try:
        return int(qt_app.exec())
    finally:
        window.close()  # saves settings and closes the engine client, once
        notifier.uninstall_hooks()
