"""The transcript side of the chat: the system prompt and the completion switch, the transcript itself, the
prompt's progress, the message box and the buttons under it. The chat panel wires them to what they do."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ui.chat.colours import ColourKey
from ui.chat.view import ChatView
from ui.flow_layout import FlowLayout


class TranscriptPane(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.undo_edit_button = QPushButton("Undo edit", self)
        self.undo_edit_button.setToolTip("Bring back the message taken back for editing, and its answer")
        self.undo_edit_button.setVisible(False)
        self.new_chat_with_last_button = QPushButton("Continue in a new chat", self)
        self.new_chat_with_last_button.setToolTip("The chat no longer fits the context: start a new chat with "
                                                  "your last message")
        self.new_chat_with_last_button.setVisible(False)
        self.version_button = QPushButton("Previous version", self)
        self.version_button.setVisible(False)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        prompt_row = QHBoxLayout()
        self.system_prompt = QLineEdit(self)
        # The placeholder names the field: a label beside it would widen the window's narrowest layout.
        self.system_prompt.setPlaceholderText("System prompt: optional instructions for the model")
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setToolTip("System prompt: instructions the model reads before the chat")
        prompt_row.addWidget(self.system_prompt)
        self.presets_button = QToolButton(self)
        self.presets_button.setArrowType(Qt.ArrowType.DownArrow)
        self.presets_button.setAccessibleName("Presets")
        self.presets_button.setToolTip("Presets: named system prompts; choose one, or save the prompt shown as one")
        prompt_row.addWidget(self.presets_button)
        self.completion_check = QCheckBox("Completion", self)
        self.completion_check.setToolTip("No chat template: the text you send is the raw prompt the model "
                                         "continues (for base models). Remembered per model.")
        prompt_row.addWidget(self.completion_check)
        layout.addLayout(prompt_row)
        self.view = ChatView(self)
        layout.addWidget(self.view, 1)
        self.progress_label = QLabel(self)
        self.progress_label.setObjectName("prompt_progress")
        self.progress_label.setVisible(False)
        self.progress_label.setWordWrap(True)  # one long line would widen the whole window
        layout.addWidget(self.progress_label)
        self.prompt_bar = QProgressBar(self)
        self.prompt_bar.setObjectName("prompt_bar")
        self.prompt_bar.setTextVisible(False)
        self.prompt_bar.setMaximumHeight(6)
        self.prompt_bar.setVisible(False)
        layout.addWidget(self.prompt_bar)
        self.input = QPlainTextEdit(self)
        self.input.setPlaceholderText("Message (Ctrl+Enter sends, Esc stops)")
        self.input.setMaximumHeight(120)
        self.input.setTabChangesFocus(True)  # Tab moves on to Send; a tab character is rarely meant in a message
        layout.addWidget(self.input)
        buttons_row = QWidget(self)
        buttons = FlowLayout(buttons_row, h_spacing=6, v_spacing=4)
        self.send_button = QPushButton("Send", self)
        self.stop_button = QPushButton("Stop", self)
        self.regenerate_button = QPushButton("Regenerate", self)
        self.edit_button = QPushButton("Edit last", self)
        self.highlight_check = QCheckBox("Highlight drafted tokens", self)
        self.highlight_check.setToolTip("Green: from the suffix drafter (text that repeats). Blue: from the "
                                        "trained drafter (a drafter model, MTP heads, EAGLE-3, DFlash).")
        self.colour_key = ColourKey(self)
        self.colour_key.setVisible(False)
        self.continue_button = QPushButton("Continue", self)
        self.continue_button.setToolTip("The answer was cut at Max tokens: ask the model to go on")
        self.continue_button.setVisible(False)
        for w in (self.send_button, self.stop_button, self.regenerate_button, self.continue_button,
                  self.edit_button, self.undo_edit_button, self.new_chat_with_last_button, self.version_button,
                  self.highlight_check,
                  self.colour_key):
            buttons.addWidget(w)
        layout.addWidget(buttons_row)
