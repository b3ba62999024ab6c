"""Sampling settings as spin boxes whose ranges are the ones ``SamplingSettings.validate`` accepts: a value
out of range cannot be typed, and the range is in each field's tooltip. Below them the stop strings, one per
line (``app.params.parse_stops``)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from app.errors import SettingsError
from app.params import MAX_CTX, MAX_STOPS, SamplingSettings, parse_stops, stops_text

INT_MAX = 2**31 - 1  # a QSpinBox holds a C int


@dataclass(frozen=True)
class Field:
    label: str
    low: float
    high: float
    integer: bool = False
    decimals: int = 2
    step: float = 0.05
    special: str = ""  # shown at the minimum (e.g. "random" for seed -1)


FIELDS: dict[str, Field] = {
    "temperature": Field("Temperature", 0.0, 5.0, special="0 (greedy)"),
    "top_p": Field("Top-p", 0.01, 1.0),
    "top_k": Field("Top-k", 0, 1_000_000, integer=True, step=1, special="0 (off)"),
    "min_p": Field("Min-p", 0.0, 1.0, special="0 (off)"),
    "repeat_penalty": Field("Repetition penalty", 0.5, 3.0),
    "seed": Field("Seed", -1, INT_MAX, integer=True, step=1, special="random"),
    "max_tokens": Field("Max tokens", 1, MAX_CTX, integer=True, step=64),
}


class SamplingForm(QWidget):
    changed = Signal()

    def __init__(self, settings: SamplingSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QFormLayout(self)
        self.spins: dict[str, QSpinBox | QDoubleSpinBox] = {}
        for name, f in FIELDS.items():
            spin: QSpinBox | QDoubleSpinBox
            if f.integer:
                spin = QSpinBox(self)
                spin.setRange(int(f.low), int(f.high))
                spin.setSingleStep(int(f.step))
            else:
                spin = QDoubleSpinBox(self)
                spin.setDecimals(f.decimals)
                spin.setRange(f.low, f.high)
                spin.setSingleStep(f.step)
            spin.setObjectName(f"sampling_{name}")
            spin.setSpecialValueText(f.special)
            spin.setToolTip(f"{f.label}: {f.low:g} to {f.high:g}")
            spin.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
            spin.setKeyboardTracking(False)
            spin.valueChanged.connect(self._on_spin_value_changed)
            layout.addRow(f.label, spin)
            self.spins[name] = spin
        self.stops_edit = QPlainTextEdit(self)
        self.stops_edit.setObjectName("sampling_stops")
        self.stops_edit.setPlaceholderText("One per line; \\n for a new line")
        self.stops_edit.setToolTip(f"The answer ends before the first of these (up to {MAX_STOPS}, one per "
                                   "line, spaces kept); write \\n for a new line, \\t for a tab, \\\\ for \\.")
        self.stops_edit.setTabChangesFocus(True)
        lines = self.stops_edit.fontMetrics().lineSpacing()
        self.stops_edit.setFixedHeight(3 * lines + 12)  # three lines show; more scroll
        self.stops_edit.textChanged.connect(self._on_stops_edit_text_changed)
        layout.addRow("Stop strings", self.stops_edit)
        self.error_label = QLabel(self)
        self.error_label.setWordWrap(True)
        self.error_label.setObjectName("sampling_error")
        self.error_label.setVisible(False)
        layout.addRow(self.error_label)
        self._extra = SamplingSettings()  # fields not shown (repeat_last_n) keep their values
        self.set_settings(settings or SamplingSettings())

    def set_settings(self, settings: SamplingSettings) -> None:
        self._extra = settings
        for name, spin in self.spins.items():
            spin.blockSignals(True)
            spin.setValue(getattr(settings, name))
            spin.blockSignals(False)
        if parse_stops(self.stops_edit.toPlainText()) != settings.stops:  # the user's own spelling stays
            self.stops_edit.blockSignals(True)
            self.stops_edit.setPlainText(stops_text(settings.stops))
            self.stops_edit.blockSignals(False)
        self._check()

    def set_value(self, name: str, value: float) -> None:
        """Set one field as a user would (clamped to its range)."""
        self.spins[name].setValue(value)  # type: ignore[arg-type]

    def settings(self) -> SamplingSettings:
        """The settings shown; raises SettingsError with the reason when validation refuses them."""
        values: dict[str, object] = {name: spin.value() for name, spin in self.spins.items()}
        values["stops"] = parse_stops(self.stops_edit.toPlainText())
        kept = {f.name: getattr(self._extra, f.name) for f in fields(SamplingSettings) if f.name not in values}
        return replace(SamplingSettings(**kept), **values).validate()  # type: ignore[arg-type]

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

    def set_stops(self, stops: tuple[str, ...]) -> None:
        """Set the stop strings as a user would type them."""
        self.stops_edit.setPlainText(stops_text(stops))

    @Slot()
    def _on_spin_value_changed(self, *_args: object) -> None:
        self._check()
        self.changed.emit()

    @Slot()
    def _on_stops_edit_text_changed(self) -> None:
        self._check()
        self.changed.emit()
