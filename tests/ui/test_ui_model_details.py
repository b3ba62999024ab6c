"""Model → Details of the target… in the real window: the chosen file's rows and its chat template, as plain
text whatever the header holds; without a target it says what to do."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from tests.gguf_fixtures import DEFAULT_TEMPLATE, write_tiny_model

HOSTILE = "<b>bold</b> <a href='x'>link</a>"


def test_the_details_of_the_chosen_target(
    qtbot: QtBot, make_window, tmp_path: Path, no_models: Path  # type: ignore[no-untyped-def]
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    model = write_tiny_model(folder / "licensed.gguf", name="Licensed", metadata={"general.license": HOSTILE})
    window = make_window(start_engine=False)
    window.details_action.trigger()
    assert window.details_dialog is None
    assert window.notifier.last_message.startswith("Choose a target model first")

    with qtbot.waitSignal(window.picker.library_changed, timeout=30_000):
        window.picker.add_folder(str(folder))
    assert window.picker.select_target(model) or window.picker.target_path() == str(model)
    window.details_action.trigger()
    dialog = window.details_dialog
    assert dialog is not None
    qtbot.waitUntil(dialog.isVisible, timeout=5_000)
    licence = dialog.values["Licence"]
    assert licence.text() == HOSTILE
    assert licence.textFormat() == Qt.TextFormat.PlainText  # never rendered as markup
    assert dialog.values["Name"].text() == "Licensed"
    assert dialog.values["Opens in"].text() == "chat mode"
    assert dialog.template_view is not None
    assert dialog.template_view.toPlainText() == DEFAULT_TEMPLATE
    assert dialog.template_view.isReadOnly()
    dialog.close()
    qtbot.waitUntil(lambda: window.details_dialog is None, timeout=5_000)
