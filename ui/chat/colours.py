"""The transcript's colours: drafted tokens' backgrounds, code blocks' tint, and the key that names them."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.events import FROM_MODEL, FROM_NGRAM, SOURCE_NAMES


class ColourKey(QWidget):
    """What the highlight colours mean, on screen next to the switch."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.labels: dict[str, QLabel] = {}
        for source, text in SOURCE_NAMES.items():
            label = QLabel(text, self)
            label.setTextFormat(Qt.TextFormat.PlainText)
            layout.addWidget(label)
            self.labels[source] = label
        self._paint()
        rest = QLabel("plain: the target's own tokens", self)
        rest.setTextFormat(Qt.TextFormat.PlainText)
        layout.addWidget(rest)

    def _paint(self) -> None:
        colours = source_colours(self.palette())
        for source, label in self.labels.items():
            label.setStyleSheet(f"background: {colours[source].name()}; color: {_text_on(colours[source])}; "
                                "padding: 1px 4px")

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._paint()  # the tints for a light or a dark palette
        super().changeEvent(event)


def _text_on(background: QColor) -> str:
    return "black" if background.lightness() >= 128 else "white"


def code_background(palette: QPalette) -> QColor:
    """The base colour moved 8 % towards the text colour: visible on a light or a dark palette."""
    base, text = palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Text)
    mix = 0.08
    return QColor(*(round(b + (t - b) * mix) for b, t in ((base.red(), text.red()), (base.green(), text.green()),
                                                           (base.blue(), text.blue()))))


def source_colours(palette: QPalette) -> dict[str, QColor]:
    """Backgrounds for drafted tokens, readable on a light or a dark palette."""
    dark = palette.color(QPalette.ColorRole.Base).lightness() < 128
    if dark:
        return {FROM_NGRAM: QColor(40, 90, 60), FROM_MODEL: QColor(40, 70, 120)}
    return {FROM_NGRAM: QColor(200, 240, 200), FROM_MODEL: QColor(200, 220, 250)}
