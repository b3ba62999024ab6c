"""Managing chats in the window: rename (F2, context menu), delete with undo (Del), search, the last chat
reopened on start, titles from the first message, menus, the log view, status messages that clear."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QLineEdit
from pytestqt.qtbot import QtBot

from app.events import Log
from ui.chat.panel import NEED_MODEL_MESSAGE, title_from


def _window_with_chats(qtbot: QtBot, make_window: object) -> object:
    window = make_window(start_engine=False)  # type: ignore[operator]
    store = window.store
    assert store is not None
    for title, text in (("Rust lifetimes", "What is 'a?"), ("Bread", "How long to knead dough?")):
        chat = store.new_chat(title)
        store.add_message(chat, "user", text)
        answer = store.begin_answer(chat)
        store.finish_answer(answer, f"About {title}.", "complete", None, stop_reason="max_tokens")
    with qtbot.waitSignal(window.chat.history_refreshed, timeout=10_000):  # the list is read off the GUI thread
        window.chat.refresh_history()
    window.show()
    window.activateWindow()
    qtbot.waitActive(window)
    return window


def _titles(window: object) -> list[str]:
    lst = window.chat.history_list  # type: ignore[attr-defined]
    return [lst.item(i).text() for i in range(lst.count())]


def test_rename_with_f2_and_delete_with_del_then_undo(qtbot: QtBot, make_window: object) -> None:
    window = _window_with_chats(qtbot, make_window)
    chat = window.chat
    lst = chat.history_list
    assert _titles(window) == ["Bread", "Rust lifetimes"]
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # the chat is read off the GUI thread
        lst.setCurrentRow(1)
    assert chat.view.toPlainText().count("About Rust lifetimes.") == 1  # choosing a chat shows it
    assert "cut at Max tokens" in chat.view.stats_lines()[-1]  # the stored stop reason
    assert chat.continue_button.isVisibleTo(chat)  # offered for an answer cut at Max tokens
    lst.setFocus()
    qtbot.waitUntil(lst.hasFocus, timeout=2000)
    handle = window.windowHandle()  # keys as the platform delivers them, through the shortcut map
    qtbot.keyClick(handle, Qt.Key.Key_F2)
    editor = lst.findChild(QLineEdit)
    assert editor is not None
    editor.selectAll()
    qtbot.keyClicks(editor, "Borrow checker")
    qtbot.keyClick(handle, Qt.Key.Key_Return)
    assert "Borrow checker" in _titles(window)
    assert any(c.title == "Borrow checker" for c in window.store.list_chats())

    current = chat.chat_id
    lst.setFocus()
    qtbot.waitUntil(lst.hasFocus, timeout=2000)
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):
        qtbot.keyClick(handle, Qt.Key.Key_Delete)
    assert chat.chat_id != current  # the deleted chat is no longer on screen; its neighbour is
    assert chat.chat_id == next(c.id for c in window.store.list_chats() if c.title == "Bread")
    assert chat.history_list.currentItem().text() == "Bread"
    assert "Borrow checker" in chat.undo_delete_button.text()  # says what it would bring back
    assert "Borrow checker" not in _titles(window)
    assert chat.undo_delete_button.isVisibleTo(chat)
    chat.undo_delete_button.click()
    qtbot.waitUntil(lambda: "Borrow checker" in _titles(window) and chat.chat_id == current, timeout=10_000)
    lst.setFocus()
    qtbot.waitUntil(lst.hasFocus, timeout=2000)
    qtbot.keyClick(handle, Qt.Key.Key_Delete)
    chat.commit_pending_delete()  # what the undo timer (or closing the window) does
    assert [c.title for c in window.store.list_chats()] == ["Bread"]


def test_context_menu_shows_the_clicked_chat_and_offers_rename_and_delete(qtbot: QtBot,
                                                                          make_window: object) -> None:
    window = _window_with_chats(qtbot, make_window)
    chat = window.chat
    lst = chat.history_list
    lst.setCurrentRow(0)
    rect = lst.visualItemRect(lst.item(1))
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):
        lst.customContextMenuRequested.emit(QPoint(rect.center()))
    assert chat.context_menu is not None
    assert [a.text().split("\t")[0] for a in chat.context_menu.actions()] == ["Rename", "Delete"]
    assert "About Rust lifetimes." in chat.view.toPlainText()  # not the chat that was open before
    assert "About Bread." not in chat.view.toPlainText()
    chat.context_menu.close()


def test_search_filters_by_title_and_text(qtbot: QtBot, make_window: object) -> None:
    window = _window_with_chats(qtbot, make_window)
    window.chat.search_edit.setText("knead")
    qtbot.waitUntil(lambda: _titles(window) == ["Bread"], timeout=10_000)
    window.chat.search_edit.clear()
    qtbot.waitUntil(lambda: len(_titles(window)) == 2, timeout=10_000)


def test_the_last_chat_reopens_on_start(qtbot: QtBot, make_window: object) -> None:
    window = _window_with_chats(qtbot, make_window)
    with qtbot.waitSignal(window.chat.chat_opened, timeout=10_000):
        window.chat.history_list.setCurrentRow(1)
    chat_id = window.chat.chat_id
    window.close()
    again = make_window(start_engine=False)  # type: ignore[operator]
    qtbot.waitUntil(lambda: again.chat.chat_id == chat_id, timeout=10_000)
    assert "About Rust lifetimes." in again.chat.view.toPlainText()


def test_titles_come_from_the_first_message() -> None:
    assert title_from("  How do I   reverse a list in Python?\nThanks") == "How do I reverse a list in Python?"
    long = "word " * 40
    title = title_from(long)
    assert title.endswith("…")
    assert len(title) <= 81
    assert not title[:-1].endswith(" ")


def test_menus_log_view_and_status_messages_that_clear(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    menus = {a.text().replace("&", ""): [x.text().replace("&", "") for x in a.menu().actions() if x.text()]
             for a in window.menuBar().actions()}
    assert menus["File"] == ["New chat", "Export chat…", "Quit"]
    assert menus["Edit"] == ["Undo delete or edit\tCtrl+Z", "Copy"]
    assert menus["View"][0] == "Log"
    assert menus["Model"][:4] == ["Load", "Unload", "Details of the target…", "Connect to server…"]
    assert menus["Help"] == ["Keyboard shortcuts", "About SpecDeck"]

    assert window.chat.colour_key.isHidden()
    window.chat.highlight_check.setChecked(True)  # the colour key is on screen, not in a tooltip
    assert not window.chat.colour_key.isHidden()
    assert [lab.text() for lab in window.chat.colour_key.labels.values()] == ["suffix drafter", "trained drafter"]

    window.bridge.log_received.emit(Log("llama_model_loader: loaded meta data"))
    assert "llama_model_loader: loaded meta data" in window.log_window.text()

    window.picker.target_combo.setCurrentIndex(-1)  # no target chosen: nothing Send could load
    window.chat.input.setPlainText("hello")
    assert not window.chat.send()
    assert window.statusBar().currentMessage() == NEED_MODEL_MESSAGE
    window.notifier.resolve(NEED_MODEL_MESSAGE)  # what a successful load does
    assert window.statusBar().currentMessage() == ""

    window.sampling_form.spins["max_tokens"].setValue(1)
    window.sampling_form._extra = window.sampling_form._extra.__class__(repeat_last_n=-5)  # refused
    assert window.sampling_form.error() is not None
    assert not window.chat.send()
    assert window.statusBar().currentMessage() == window.sampling_form.error()
    window.sampling_form._extra = window.sampling_form._extra.__class__()
    window.sampling_form.set_value("max_tokens", 64)  # fixed: the message goes
    assert window.statusBar().currentMessage() == ""


def test_a_refresh_updates_the_chat_list_in_place(qtbot: QtBot, make_window: object) -> None:
    """The list is refreshed after every answer: its rows are updated, not rebuilt (a rebuild of hundreds
    of rows took over 100 ms of the GUI thread in the soak). A renamed chat, a new one and a deleted one
    all show; the open chat stays selected."""
    window = _window_with_chats(qtbot, make_window)
    store = window.store  # type: ignore[attr-defined]
    chat = window.chat  # type: ignore[attr-defined]
    lst = chat.history_list
    rows = [lst.item(i) for i in range(lst.count())]
    ids = {item.text(): item.data(Qt.ItemDataRole.UserRole) for item in rows}
    opened = ids["Bread"]
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):
        chat.open_chat(opened)
    with qtbot.waitSignal(chat.history_refreshed, timeout=10_000):
        chat.refresh_history()
    assert [lst.item(i) for i in range(lst.count())] == rows  # the same row objects
    assert lst.currentItem().text() == "Bread"

    store.rename_chat(ids["Rust lifetimes"], "Rust borrowing")
    with qtbot.waitSignal(chat.history_refreshed, timeout=10_000):
        chat.refresh_history()
    assert "Rust borrowing" in _titles(window)
    order = _titles(window)
    written = chat.history_rows_written
    store.new_chat("Tea")
    with qtbot.waitSignal(chat.history_refreshed, timeout=10_000):
        chat.refresh_history()
    assert sorted(_titles(window)) == ["Bread", "Rust borrowing", "Tea"]
    # A new chat on top moves the others down without rewriting them (rewriting every row after each answer
    # took 108 ms of the GUI thread with a few hundred chats in the soak).
    assert chat.history_rows_written - written == 1
    assert _titles(window) == ["Tea", *order]  # the newest first, the others moved down in their order
    assert all(any(lst.item(i) is row for i in range(lst.count())) for row in rows)
    store.delete_chat(opened)
    with qtbot.waitSignal(chat.history_refreshed, timeout=10_000):
        chat.refresh_history()
    assert sorted(_titles(window)) == ["Rust borrowing", "Tea"]
    assert lst.currentItem() is None  # the open chat is gone from the list


def test_deleting_a_chat_with_a_long_title_never_widens_the_window(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    store = window.store
    long_title = "A very long chat title about " + "lifetimes and borrow checking in Rust " * 8
    chat_id = store.new_chat(long_title)
    store.add_message(chat_id, "user", "What is 'a?")
    store.new_chat("Bread")
    with qtbot.waitSignal(window.chat.history_refreshed, timeout=10_000):
        window.chat.refresh_history()
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    before = (window.minimumSizeHint().width(), window.width())
    lst = window.chat.history_list
    row = next(i for i in range(lst.count()) if lst.item(i).text().startswith("A very long"))
    lst.setCurrentRow(row)
    lst.setFocus()
    qtbot.waitUntil(lst.hasFocus, timeout=2000)
    qtbot.keyClick(window.windowHandle(), Qt.Key.Key_Delete)
    button = window.chat.undo_delete_button
    qtbot.waitUntil(button.isVisible, timeout=5000)
    assert (window.minimumSizeHint().width(), window.width()) == before
    assert button.text().startswith("Undo: “A very")
    assert "…" in button.text()
    assert long_title in button.toolTip()
