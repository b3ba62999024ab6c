"""System-prompt presets in the real window: saved from the prompt shown, chosen from the menu beside the
field, replaced by name, deleted, kept with the settings across a restart; a bad name is one sentence."""

from __future__ import annotations

from PySide6.QtWidgets import QMenu
from pytestqt.qtbot import QtBot

from app.storage.settings import load_settings


def _actions(menu: QMenu) -> dict[str, object]:
    menu.aboutToShow.emit()  # the menu is filled as it opens
    return {a.text(): a for a in menu.actions() if a.text()}


def test_presets_are_saved_chosen_replaced_deleted_and_kept(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    presets, field = window.chat.presets, window.chat.system_prompt
    assert "Save as preset…" in _actions(presets.menu)
    assert not _actions(presets.menu)["Save as preset…"].isEnabled()  # nothing to save yet

    field.setText("Be brief.")
    assert presets.save("Brief")
    field.setText("Answer in French & be polite.")
    assert presets.save("French & polite")
    actions = _actions(presets.menu)
    assert actions["French && polite"].isChecked()  # "&" shown as itself, the text shown is this preset's
    assert not actions["Brief"].isChecked()
    actions["Brief"].trigger()
    assert field.text() == "Be brief."
    field.setText("Be very brief.")
    assert presets.save("Brief")  # the same name: replaced, in its place
    assert presets.presets == (("Brief", "Be very brief."), ("French & polite", "Answer in French & be polite."))
    qtbot.waitUntil(lambda: load_settings()[0].system_prompt_presets == presets.presets, timeout=10_000)

    errors: list[str] = []
    window.chat.error_raised.connect(errors.append)
    assert not presets.save("  ")
    assert not presets.save("right\u202eleft")  # a bidirectional override is no name
    assert errors == ["A preset's name is one line of 1 to 80 characters, not ''.",
                      "A preset's name is one line of 1 to 80 characters, not 'right\\u202eleft'."]
    assert len(presets.presets) == 2

    delete = next(a for a in presets.menu.actions() if a.menu() is not None).menu()
    next(a for a in delete.actions() if a.text() == "French && polite").trigger()
    assert presets.names() == ["Brief"]
    qtbot.waitUntil(lambda: load_settings()[0].system_prompt_presets == (("Brief", "Be very brief."),),
                    timeout=10_000)
    window.close()

    again = make_window(start_engine=False)  # the next start: the presets are back
    assert again.chat.presets.presets == (("Brief", "Be very brief."),)
    assert again.chat.presets.choose("Brief")
    assert again.chat.system_prompt.text() == "Be very brief."
