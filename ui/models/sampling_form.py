"""Sampling settings typed as text and checked by ``SamplingSettings.validate``, with the reason shown.

Line edits rather than spin boxes: a spin box silently clamps "nan" or "-3" to something else, and the
user should see that a value was refused and why.
"""

from __future__ import annotations

from dataclasses import fields

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QFormLayout, QLabel, QLineEdit, QWidget

from app.engine.params import SamplingSettings
from app.errors import SettingsError

# field name -> (label, whole number?)
FIELDS: dict[str, tuple[str, bool]] = {
    "temperature": ("Temperature", False),
    "top_p": ("Top-p", False),
    "top_k": ("Top-k", True),
    "min_p": ("Min-p", False),
    "repeat_penalty": ("Repetition penalty", False),
    "seed": ("Seed (-1 random)", True),
    "max_tokens": ("Max tokens", True),
}


def _parse(label: str, text: str, integer: bool) -> float | int:
    text = text.strip()
    if not text:
        raise SettingsError(f"{label} is empty; enter a number.")
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise SettingsError(f"{label} must be {kind}, not {text!r}.") from None


class SamplingForm(QWidget):
    changed = Signal()

    def __init__(self, settings: SamplingSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QFormLayout(self)
        self.edits: dict[str, QLineEdit] = {}
        for name, (label, _) in FIELDS.items():
            edit = QLineEdit(self)
            edit.setObjectName(f"sampling_{name}")
            edit.textChanged.connect(self._on_edit_text_changed)
            layout.addRow(label, edit)
            self.edits[name] = edit
        self.error_label = QLabel(self)
        self.error_label.setWordWrap(True)
        self.error_label.setObjectName("sampling_error")
        layout.addRow(self.error_label)
        self._extra = SamplingSettings()  # fields not shown (repeat_last_n) keep their values
        self.set_settings(settings or SamplingSettings())

    def set_settings(self, settings: SamplingSettings) -> None:
        self._extra = settings
        for name, edit in self.edits.items():
            edit.setText(str(getattr(settings, name)))
        self._check()

    def settings(self) -> SamplingSettings:
        """The settings as typed; raises SettingsError with the reason when a value is refused."""
        values: dict[str, float | int] = {}
        for name, (label, integer) in FIELDS.items():
            values[name] = _parse(label.split(" (")[0], self.edits[name].text(), integer)
        kept = {f.name: getattr(self._extra, f.name) for f in fields(SamplingSettings)
                if f.name not in values}
        return SamplingSettings(**values, **kept).validate()  # type: ignore[arg-type]

    def error(self) -> str | None:
        try:
            self.settings()
        except SettingsError as exc:
            return str(exc)
        return None

    def _check(self) -> None:
        problem = self.error()
        self.error_label.setText(problem or "")
        self.error_label.setVisible(problem is not None)

    @Slot(str)
    def _on_edit_text_changed(self, _text: str) -> None:
        self._check()
        self.changed.emit()
