"""A right-click acts on the message under the pointer, also right of a short line's end."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtGui import QTextCursor
from pytestqt.qtbot import QtBot

from ui.chat.message import ChatMessage
from ui.chat.view import ChatView


def test_right_of_a_short_question_is_the_question(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show_messages([ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello! How can I help you today?")])
    view.show()
    qtbot.waitExposed(view)
    view.verticalScrollBar().setValue(0)
    question = view.document().findBlock(view.message_position(0))
    rect = view.cursorRect(QTextCursor(question))
    right_of_text = QPoint(view.viewport().width() - 10, rect.center().y())
    assert view.cursorForPosition(right_of_text).block() == question  # the pointer is on the question's line
    assert view.message_under(right_of_text) == 0
    # The line's end is where the answer's record begins: the cursor position alone names the answer.
    assert view.message_at(view.cursorForPosition(right_of_text).position()) == 1
    answer = view.document().findBlock(view.message_position(1))
    on_answer = QPoint(20, view.cursorRect(QTextCursor(answer)).center().y())
    assert view.message_under(on_answer) == 1
