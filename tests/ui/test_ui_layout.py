"""The window fits small screens: at 1366×768 and 1024×700 no widget is squeezed below its minimum size
hint, the first start fits the screen, and the saved geometry and docks come back as they were."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QAbstractScrollArea, QWidget
from pytestqt.qtbot import QtBot

from ui.window_state import default_window_size

SIZES = [(1366, 768), (1024, 700)]


def _inside_scroll_area(widget: QWidget) -> bool:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea):
            return True
        parent = parent.parentWidget()
    return False


def clipped_widgets(root: QWidget) -> list[str]:
    """Visible widgets narrower or shorter than their minimum size hint (what the user sees cut off)."""
    out = []
    for widget in root.findChildren(QWidget):
        if not widget.isVisible() or widget.isWindow() or _inside_scroll_area(widget):
            continue  # a scroll area's content may be bigger than the viewport: it scrolls
        hint = widget.minimumSizeHint().expandedTo(widget.minimumSize())
        if not hint.isValid():
            continue
        if widget.width() < hint.width() or widget.height() < hint.height():
            name = widget.objectName() or type(widget).__name__
            text = getattr(widget, "text", lambda: "")()
            out.append(f"{name} {text!r}: {widget.width()}×{widget.height()} < {hint.width()}×{hint.height()}")
    return out


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_nothing_is_clipped_at_small_screen_sizes(qtbot: QtBot, make_window: object, width: int,
                                                  height: int) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window.show()
    qtbot.waitExposed(window)
    # Long texts where the app writes them while it works: none may widen the window.
    long = "Prompt processed: 12,345 tokens in 67.8 s; SmolLM2-135M-Instruct.Q4_1.gguf with n-gram (3)"
    window.chat.progress_label.setText(long)
    window.chat.progress_label.show()
    window.picker.load_box.status_label.setText(long)
    window.dashboard.mem_label.setText(long)
    window.statusBar().showMessage(long)
    window.resize(width, height)
    qtbot.wait(50)
    minimum = window.minimumSizeHint()
    assert minimum.width() <= width, f"the window cannot be narrower than {minimum.width()} px"
    assert minimum.height() <= height, f"the window cannot be shorter than {minimum.height()} px"
    assert (window.width(), window.height()) == (width, height)
    assert clipped_widgets(window) == []
    # The dashboard's plots keep a readable height and scroll instead of squashing.
    assert window.dashboard.graphics.height() >= window.dashboard.graphics.minimumHeight()


def test_first_start_fits_the_screen() -> None:
    assert default_window_size(QSize(1366, 768 - 40)).width() <= 1366
    assert default_window_size(QSize(1024, 700)).height() <= 700
    assert default_window_size(QSize(3840, 2160)) == QSize(1600, 1000)


def test_geometry_and_docks_come_back_as_saved(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window.show()
    qtbot.waitExposed(window)
    window.resize(1200, 720)
    window.dashboard_dock.hide()
    window.chat.splitter.setSizes([300, 600])
    qtbot.wait(50)
    history_width = window.chat.splitter.sizes()[0]
    window.close()
    again = make_window(start_engine=False)  # type: ignore[operator]
    again.show()
    qtbot.waitExposed(again)
    assert (again.width(), again.height()) == (1200, 720)
    assert again.dashboard_dock.isHidden()
    assert not again.models_dock.isHidden()
    assert again.chat.splitter.sizes()[0] == history_width

