"""The mouse wheel scrolls past a combo box or spin box that has no focus; once focused, the wheel is theirs."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QComboBox, QWidget
from pytestqt.qtbot import QtBot


def _wheel(widget: QWidget, down: bool = True) -> None:
    centre = QPointF(widget.rect().center())
    delta = QPoint(0, -120 if down else 120)
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(), delta,
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase,
                        False)
    QApplication.sendEvent(widget, event)


def test_the_wheel_never_changes_an_unfocused_setting(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    window.show()
    qtbot.waitExposed(window)
    picker = window.picker
    kv, ctx = picker.load_box.kv_combo, picker.load_box.ctx_spin
    assert kv.findText("bf16") >= 0
    assert kv.currentIndex() + 1 < kv.count()
    guarded = window.findChildren(QComboBox) + window.findChildren(QAbstractSpinBox)
    assert all(w.focusPolicy() == Qt.FocusPolicy.StrongFocus for w in guarded)  # a wheel gives no focus
    before = (kv.currentText(), ctx.value(), window.sampling_form.findChildren(QAbstractSpinBox)[0].value())
    window.chat.input.setFocus()
    for widget in (kv, ctx, window.sampling_form.findChildren(QAbstractSpinBox)[0]):
        assert not widget.hasFocus()
        _wheel(widget)
        _wheel(widget)
    assert (kv.currentText(), ctx.value(), window.sampling_form.findChildren(QAbstractSpinBox)[0].value()) == before

    ctx.setFocus()
    qtbot.waitUntil(ctx.hasFocus)
    _wheel(ctx, down=False)
    assert ctx.value() != before[1]  # focused: the wheel is the spin box's own again
