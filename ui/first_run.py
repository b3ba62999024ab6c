"""What the window shows while the library holds no models: the demo models, models from the Hub, or a folder
of one's own."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

WELCOME_TEXT_WIDTH = 560


class FirstRunPanel(QWidget):
    """Shown while the library holds no models: offers the demo models, the Find models view (its button is
    wired by ``ui.hub.window_side``) and a folder of one's own."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.addStretch(1)
        title = QLabel("<h2>Welcome to SpecDeck</h2>", self)
        text = QLabel(
            "No GGUF models were found on this computer. Install two small demo models (about 350 MB: "
            "SmolLM2 135M and Gemma 3 270M) to try it, find a model on the Hugging Face Hub that fits this computer "
            "and download it, or add a folder that holds your own models.", self)
        text.setWordWrap(True)
        text.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        text.setMaximumWidth(WELCOME_TEXT_WIDTH)
        self.text = text
        self.demo_button = QPushButton("Install demo models", self)
        self.hub_button = QPushButton("Find models on the Hub…", self)
        self.folder_button = QPushButton("Add folder…", self)
        layout.addWidget(title, 0, Qt.AlignmentFlag.AlignHCenter)
        # Not centred by the layout: a centred label is laid out at its one-line width hint and its wrapped
        # lines were cut off; in a row between stretches it gets a width and the height its lines need.
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(text, 4)
        row.addStretch(1)
        layout.addLayout(row)
        buttons = QHBoxLayout()  # the two ways to get models, side by side
        buttons.addStretch(1)
        buttons.addWidget(self.demo_button)
        buttons.addWidget(self.hub_button)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        layout.addWidget(self.folder_button, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addStretch(2)
