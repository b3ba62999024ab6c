"""The mouse wheel scrolls the page, never a setting it passes over: a combo box or spin box takes the wheel
only while it has keyboard focus (a click or Tab gives it that). Scrolling the Models dock once switched the KV
cache from f16 to bf16 on its way down."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QWidget

GUARDED = (QAbstractSpinBox, QComboBox)


class WheelGuard(QObject):
    """Event filter: a wheel over an unfocused guarded widget goes to its parent (the scroll area) instead."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.Wheel or not isinstance(watched, QWidget) or watched.hasFocus():
            return False
        parent = watched.parentWidget()
        if parent is not None:
            QCoreApplication.sendEvent(parent, event)  # ignored there, it travels up to the scroll area
        return True


_GUARD = WheelGuard()


def guard_wheel(root: QWidget) -> None:
    """Guard every combo box and spin box under ``root`` (call again after adding more; a repeat is harmless)."""
    for kind in GUARDED:
        for widget in root.findChildren(kind):
            # Not WheelFocus (a spin box's default): a wheel would give it focus, and so the value.
            widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            widget.removeEventFilter(_GUARD)
            widget.installEventFilter(_GUARD)
