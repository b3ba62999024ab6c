"""Smaller items of the window's third round: a search with no match says so, the Connect dialog shows its
whole URL, the τ-vs-k plot has a legend, a chat template notice is no dialog in the middle of an answer, and the
base-model note names the format chat mode uses, as the chat's own notice does."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.engine.chat_template import fallback_name
from ui.models.picker import base_model_note, show_note
from ui.remote.connect import DEFAULT_URL, ConnectDialog


def test_a_search_with_no_match_says_so(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    chat = window.chat
    chat.store.new_chat("about the sea", "")
    with qtbot.waitSignal(chat.history_refreshed, timeout=5000):
        chat.search_edit.setText("mountains")
    assert chat.history_list.count() == 0
    assert chat.no_match_label.isVisibleTo(chat)
    with qtbot.waitSignal(chat.history_refreshed, timeout=5000):
        chat.search_edit.setText("")
    assert chat.history_list.count() == 1
    assert not chat.no_match_label.isVisibleTo(chat)


def test_the_connect_dialog_shows_the_whole_url(qtbot: QtBot) -> None:
    dialog = ConnectDialog(None, DEFAULT_URL)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    room = dialog.url.contentsRect().width()
    assert dialog.url.fontMetrics().horizontalAdvance("http://127.0.0.1:8642") < room


def test_the_tau_plot_has_a_legend(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    names = [label.text for _sample, label in window.dashboard.tau_legend.items]
    assert names == ["Leviathan E[τ] at measured α", "measured mean τ"]


def test_the_base_model_note_names_the_format_the_chat_uses() -> None:
    note = base_model_note("gemma3")
    assert f"({fallback_name('gemma3')})" in note
    assert "generic" not in note


def test_a_chat_template_notice_is_no_dialog(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    from app.events import PromptProcessed

    window = make_window(start_engine=False)
    window.notifier.modal = True  # as in the real window
    window.show()
    qtbot.waitExposed(window)
    notice = "The model file has no chat template; its architecture's known format (Gemma) was used."
    window._on_bridge_prompt_processed(PromptProcessed(1, 10, 0.1, notice))
    assert window.statusBar().currentMessage() == notice
    from PySide6.QtWidgets import QMessageBox
    assert not [box for box in window.findChildren(QMessageBox) if box.isVisible()]


def test_the_empty_tune_chart_has_a_speedup_range(qtbot: QtBot) -> None:
    from ui.dashboard.sweep import SweepPlot

    plot = SweepPlot()  # a widget: the qtbot fixture gives it its QApplication (and the window marker)
    qtbot.addWidget(plot)
    (x0, x1), (y0, y1) = plot.graph.getPlotItem().viewRange()
    assert (x0, x1) == (0.5, 1.5)
    assert (y0, y1) == (0.0, 2.0)


def test_a_new_answer_starts_the_time_axis_and_another_chat_clears_the_strip(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    from app.events import Finished
    from tests.ui.test_dashboard import make_finished, make_loaded, make_pass

    window = make_window(start_engine=False)
    dashboard = window.dashboard
    dashboard.on_loaded(make_loaded())
    for i in range(60):
        dashboard.on_pass(make_pass(i * 100, request_id=1))  # a long answer: the axis reaches far
    dashboard.on_finished(make_finished(1))
    dashboard._paint()
    long_hi = dashboard.x_time.hi
    for i in range(3):
        dashboard.on_pass(make_pass(i, request_id=2))
    dashboard._paint()
    assert dashboard.x_time.hi < long_hi / 4  # the short answer is not squeezed into the old range
    finished: Finished = make_finished(2)
    dashboard.on_finished(finished)
    dashboard._paint()
    assert dashboard.labels["scope"].text() == "answer:"
    chat_id = window.chat.store.new_chat("other", "")
    with qtbot.waitSignal(window.chat.chat_opened, timeout=10_000):  # read off the GUI thread
        window.chat.open_chat(chat_id)
    assert dashboard.labels["scope"].text() == ""
    assert dashboard.labels["tps"].text() == "– tok/s"


def test_install_demo_models_is_offered_only_while_one_is_missing(make_window) -> None:  # type: ignore[no-untyped-def]
    from app.library.demo_install import demo_model_paths, installed_demo_models

    window = make_window(start_engine=False)
    all_there = installed_demo_models() == demo_model_paths()
    assert window.picker.demo_button.isVisibleTo(window.picker) == (not all_there)


def test_wrapped_texts_get_the_height_their_lines_need(
    qtbot: QtBot, make_window, tmp_path, monkeypatch  # type: ignore[no-untyped-def]
) -> None:
    """The welcome text, the base-model note and an incompatible drafter's reason were cut off."""
    empty = tmp_path / "no-models"
    empty.mkdir()
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(empty))
    window = make_window(start_engine=False)
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    text = window.first_run.text
    assert text.isVisible()
    qtbot.waitUntil(lambda: text.height() >= text.heightForWidth(text.width()), timeout=2000)
    assert text.heightForWidth(text.width()) > text.fontMetrics().height() * 2  # it does wrap here

    picker = window.picker
    long_reason = ("✗ Incompatible: the drafter's vocabulary differs from the target's at token 268 of 269, so "
                   "its drafts would be read as other tokens. Load refuses this pair.")
    show_note(picker.compat_badge, long_reason)
    show_note(picker.target_info, "gemma3, 268M params, Q4_K_M, 241 MB, ctx 32768\n" + base_model_note("gemma3"))
    window.models_dock.raise_()
    for label in (picker.compat_badge, picker.target_info):
        qtbot.waitUntil(lambda label=label: label.height() >= label.heightForWidth(label.width()), timeout=2000)


def test_api_chats_are_marked_in_the_list(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    from ui.chat.chat_list import API_ROLE

    window = make_window(start_engine=False)
    chat = window.chat
    chat.store.new_chat("typed here", "")
    chat.store.new_chat("from a client", "", origin="api")
    with qtbot.waitSignal(chat.history_refreshed, timeout=5000):
        chat.refresh_history()
    rows = {chat.history_list.item(i).text(): chat.history_list.item(i) for i in range(chat.history_list.count())}
    assert rows["from a client"].data(API_ROLE) is True
    assert not rows["from a client"].icon().isNull()
    assert "API" in rows["from a client"].toolTip()
    assert rows["typed here"].data(API_ROLE) is None
    assert rows["typed here"].icon().isNull()
    assert rows["from a client"].text() == "from a client"  # the title itself is unchanged (renames edit it)

