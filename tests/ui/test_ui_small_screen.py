"""At 1024×700 a first start gives the chat the room: the Models and Dashboard docks are tabs of one dock
(the Dashboard comes to the front after a load), and a chat list restored wider than the chat is narrowed."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from tests.ui.conftest import load_pair


def test_a_small_first_start_tabs_the_docks_and_shows_the_dashboard_after_a_load(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    assert window.tabifiedDockWidgets(window.models_dock) == [window.dashboard_dock]
    qtbot.wait(100)
    assert window.chat.view.width() >= 400  # side by side, the docks left it 225 px
    assert not window.models_dock.visibleRegion().isEmpty()  # Models first: nothing is loaded yet
    load_pair(qtbot, window, tiny_target)
    qtbot.waitUntil(lambda: not window.dashboard_dock.visibleRegion().isEmpty(), timeout=5000)


def test_a_restored_chat_list_never_outgrows_the_chat(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    window.resize(1366, 768)
    window.show()
    qtbot.waitExposed(window)
    splitter = window.chat.splitter
    total = sum(splitter.sizes())
    splitter.setSizes([total - 150, 150])  # what a state saved on another screen can give
    window.hide()
    window.show()
    qtbot.waitExposed(window)
    first, second = splitter.sizes()
    assert first < second
