"""The model details dialog: the rows of ``app.library.model_details`` and the file's chat template, all as
plain text (a GGUF's metadata is untrusted: never rich text), selectable for copying."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.library.model_details import ModelDetails


def _value_label(text: str, parent: QWidget) -> QLabel:
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class ModelDetailsDialog(QDialog):
    def __init__(self, details: ModelDetails, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        name = dict(details.rows).get("Name") or dict(details.rows).get("File", "")
        self.setWindowTitle(f"Details: {name[:80]}")
        self.setMinimumWidth(480)
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.values: dict[str, QLabel] = {}
        for label, value in details.rows:
            self.values[label] = _value_label(value, self)
            form.addRow(label, self.values[label])
        layout.addLayout(form)
        self.template_view: QPlainTextEdit | None = None
        if details.chat_template is not None:
            layout.addWidget(QLabel("The file's chat template", self))
            view = QPlainTextEdit(self)
            view.setReadOnly(True)
            view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
            view.setPlainText(details.chat_template)
            view.setMinimumHeight(view.fontMetrics().lineSpacing() * 8)
            layout.addWidget(view, 1)
            self.template_view = view
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
