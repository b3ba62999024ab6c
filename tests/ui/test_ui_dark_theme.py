"""The window follows the system's colour scheme: a dark scheme gives a dark palette (where the style's own is
light), and the chat's code blocks and drafted-token key, and the dashboard's plots, redraw in it; a light
scheme gives the style's palette back. The offscreen platform has no colour scheme of its own, so the
follower's slot is called as the system's change signal would call it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from ui.chat.message import ChatMessage
from ui.theme import follow_colour_scheme, is_dark


@pytest.fixture
def follower(qapp: QApplication) -> Iterator[object]:
    follower = follow_colour_scheme(qapp)
    yield follower
    follower.apply(Qt.ColorScheme.Light)  # the application is shared with the other tests
    assert not is_dark(qapp.palette())


def _code_backgrounds(view) -> set[str]:  # type: ignore[no-untyped-def]
    """The background colours of the document's tinted blocks (the code blocks)."""
    found, block = set(), view.document().begin()
    while block.isValid():
        brush = block.blockFormat().background()
        if brush.style() != Qt.BrushStyle.NoBrush:
            found.add(brush.color().name())
        block = block.next()
    return found


def test_a_dark_system_scheme_darkens_the_window_and_a_light_one_brings_it_back(
    qtbot: QtBot, make_window, qapp: QApplication, follower  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    chat = window.chat
    chat.messages = [ChatMessage("user", "Show code."), ChatMessage("assistant", "Here:\n\n```python\nx = 1\n```\n")]
    chat.view.show_messages(chat.messages)
    assert not is_dark(window.palette())
    light_code = _code_backgrounds(chat.view)
    light_key = next(iter(chat.colour_key.labels.values())).styleSheet()

    follower.apply(Qt.ColorScheme.Dark)
    qtbot.waitUntil(lambda: is_dark(window.palette()), timeout=5_000)
    assert follower.own_palette
    assert is_dark(qapp.palette())
    assert chat.view.palette().color(QPalette.ColorRole.Base).lightness() < 64
    dark_code = _code_backgrounds(chat.view)
    assert dark_code
    assert dark_code != light_code
    assert all(QColor(name).lightness() < 128 for name in dark_code)
    assert all(QColor(name).lightness() >= 128 for name in light_code)
    key = next(iter(chat.colour_key.labels.values())).styleSheet()
    assert key != light_key
    assert "color: white" in key
    assert window.dashboard.graphics.backgroundBrush().color().lightness() < 64
    legend = window.dashboard.tps_legend  # the decode chart's key, drawn at once in the light text colour
    assert QColor(legend.opts["color"]).name() == window.palette().color(QPalette.ColorRole.WindowText).name()

    follower.apply(Qt.ColorScheme.Dark)  # already dark: nothing changes
    assert follower.own_palette
    follower.apply(Qt.ColorScheme.Light)
    qtbot.waitUntil(lambda: not is_dark(window.palette()), timeout=5_000)
    assert not follower.own_palette
    assert _code_backgrounds(chat.view) == light_code
    assert follow_colour_scheme(qapp) is follower  # one per application
