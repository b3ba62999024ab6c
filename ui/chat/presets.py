"""System-prompt presets: named system prompts, kept with the settings (``AppSettings.system_prompt_presets``)
and chosen from the menu of the button beside the system prompt field."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QInputDialog, QLineEdit, QMenu, QToolButton, QWidget

from app.errors import SettingsError
from app.storage.settings import MAX_PRESET_NAME, check_presets

Presets = tuple[tuple[str, str], ...]
TOOLTIP_CHARS = 300


def _menu_text(text: str) -> str:
    return text.replace("&", "&&")  # "&" would mark a shortcut letter


class PromptPresets(QObject):
    """The Presets menu: choosing a preset puts its text in the field; "Save as preset…" names the text
    shown (a name already there is replaced); "Delete preset" takes one away."""

    changed = Signal()  # saved or deleted: the window keeps the list with the settings
    error_raised = Signal(str)

    def __init__(self, button: QToolButton, field: QLineEdit, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.button = button
        self.field = field
        self.presets: Presets = ()
        self.menu = QMenu(button)
        button.setMenu(self.menu)
        button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu.aboutToShow.connect(self._on_menu_about_to_show)
        self._fill()

    def set_presets(self, presets: Presets) -> None:
        self.presets = tuple((name, text) for name, text in presets)
        self._fill()

    def choose(self, name: str) -> bool:
        text = dict(self.presets).get(name)
        if text is None or not self.field.isEnabled():
            return False
        self.field.setText(text)
        return True

    def save(self, name: str) -> bool:
        """Keep the field's text as ``name``; False with the reason raised when the name or text is refused."""
        name = name.strip()
        kept = [(n, t) for n, t in self.presets if n != name]
        at = next((i for i, (n, _) in enumerate(self.presets) if n == name), len(kept))
        kept.insert(at, (name, self.field.text()))
        try:
            check_presets(kept)
        except SettingsError as exc:
            self.error_raised.emit(str(exc))
            return False
        self.set_presets(tuple(kept))
        self.changed.emit()
        return True

    def delete(self, name: str) -> bool:
        if name not in dict(self.presets):
            return False
        self.set_presets(tuple((n, t) for n, t in self.presets if n != name))
        self.changed.emit()
        return True

    def names(self) -> list[str]:
        return [name for name, _ in self.presets]

    def _fill(self) -> None:
        self.menu.clear()
        shown = self.field.text()
        for name, text in self.presets:
            action = self.menu.addAction(_menu_text(name))
            action.setCheckable(True)
            action.setChecked(text == shown)
            action.setToolTip(text[:TOOLTIP_CHARS] + ("…" if len(text) > TOOLTIP_CHARS else ""))
            action.setData(name)
            action.triggered.connect(lambda _on=False, n=name: self.choose(n))
        if self.presets:
            self.menu.addSeparator()
        save = self.menu.addAction("Save as preset…")
        save.setEnabled(bool(shown.strip()))
        save.triggered.connect(self._on_save_triggered)
        remove = self.menu.addMenu("Delete preset")
        remove.setEnabled(bool(self.presets))
        for name, _text in self.presets:
            action = QAction(_menu_text(name), remove)
            action.triggered.connect(lambda _on=False, n=name: self.delete(n))
            remove.addAction(action)
        self.menu.setToolTipsVisible(True)

    @Slot()
    def _on_menu_about_to_show(self) -> None:
        self._fill()

    @Slot()
    def _on_save_triggered(self) -> None:
        # Not QInputDialog.getText: its nested event loop would let engine events re-enter.
        dialog = QInputDialog(self.field.window())
        dialog.setWindowTitle("Save as preset")
        dialog.setLabelText("Name of the preset (a preset with this name is replaced):")
        dialog.setTextValue(self.field.text().strip()[:MAX_PRESET_NAME])
        dialog.textValueSelected.connect(self.save)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
