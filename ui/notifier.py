"""One place that shows errors to the user: AppError sentences, engine errors, and unexpected exceptions
from any thread (installed as ``sys.excepthook`` and ``threading.excepthook``).

Messages raised before a window exists are kept and shown once one is attached.
"""

from __future__ import annotations

import sys
import threading
import traceback
from types import TracebackType

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QMainWindow, QMessageBox

from app.errors import AppError

STATUS_SECONDS = 10


class Notifier(QObject):
    """Shows messages in the window's status bar, or in a message box when they need attention."""

    message_shown = Signal(str)  # every message, for tests and logs
    # Exceptions from other threads travel to the GUI thread through this queued signal.
    _unexpected = Signal(str, str)

    def __init__(self, parent: QObject | None = None, *, modal: bool = True) -> None:
        super().__init__(parent)
        self.modal = modal  # tests turn message boxes off; the text still reaches the status bar
        self._window: QMainWindow | None = None
        self._early: list[tuple[str, bool]] = []
        self.last_message = ""
        self._old_hooks: tuple[object, object] | None = None
        self._unexpected.connect(self._on_self_unexpected)

    def attach(self, window: QMainWindow) -> None:
        self._window = window
        early, self._early = self._early, []
        for text, important in early:
            self._show(text, important)

    # --- what callers use ---------------------------------------------------------------------------

    def info(self, text: str) -> None:
        self._show(text, important=False)

    def error(self, error: AppError | str) -> None:
        """An error the user can act on: its sentence, as it is."""
        self._show(str(error), important=True)

    def warning(self, text: str) -> None:
        self._show(text, important=True)

    def resolve(self, text: str) -> None:
        """The condition behind ``text`` was fixed: take it off the status bar if it is still there."""
        if self._window is not None and self._window.statusBar().currentMessage() == text:
            self._window.statusBar().clearMessage()
        self._early = [(t, i) for t, i in self._early if t != text]

    def _show(self, text: str, important: bool) -> None:
        self.last_message = text
        self.message_shown.emit(text)
        if self._window is None:
            self._early.append((text, important))
            return
        self._window.statusBar().showMessage(text, 0 if important else STATUS_SECONDS * 1000)
        if important and self.modal:
            box = QMessageBox(QMessageBox.Icon.Warning, "SpecDeck", text, QMessageBox.StandardButton.Ok,
                              self._window)
            box.setTextFormat(Qt.TextFormat.PlainText)
            box.open()  # not exec(): a nested event loop would let engine events re-enter

    # --- unexpected exceptions ----------------------------------------------------------------------

    def install_hooks(self) -> None:
        self._old_hooks = (sys.excepthook, threading.excepthook)
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook

    def uninstall_hooks(self) -> None:
        if self._old_hooks is not None:
            sys.excepthook, threading.excepthook = self._old_hooks  # type: ignore[assignment]
            self._old_hooks = None

    def _excepthook(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        details = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(details)
        self._unexpected.emit(self._describe(value), details)

    def _thread_excepthook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        value = args.exc_value if args.exc_value is not None else args.exc_type()
        details = "".join(traceback.format_exception(args.exc_type, value, args.exc_traceback))
        sys.stderr.write(details)
        self._unexpected.emit(self._describe(value), details)

    @staticmethod
    def _describe(value: BaseException) -> str:
        if isinstance(value, AppError):
            return str(value)
        return (f"Something went wrong inside SpecDeck ({type(value).__name__}: {value}). Your chat is safe; "
                "if this keeps happening, please report it with the details.")

    @Slot(str, str)
    def _on_self_unexpected(self, text: str, details: str) -> None:
        self.last_message = text
        self.message_shown.emit(text)
        if self._window is None:
            self._early.append((text, True))
            return
        self._window.statusBar().showMessage(text)
        if self.modal:
            box = QMessageBox(QMessageBox.Icon.Critical, "SpecDeck", text, QMessageBox.StandardButton.Ok,
                              self._window)
            box.setTextFormat(Qt.TextFormat.PlainText)
            box.setDetailedText(details)
            box.open()
