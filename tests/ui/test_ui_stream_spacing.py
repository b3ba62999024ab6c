"""No spacing flicker while an answer streams: each partial text is rendered as the window renders it, and no
line's place or height changes and then changes back; and the streamed answer ends laid out exactly as the same
answer reopened (rendered in one piece)."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from ui.chat.message import ChatMessage
from ui.chat.view import ChatView

TEXTS = [
    "First paragraph has some words.\n\nSecond paragraph has more.\n\n- item one\n- item two\n\nThird one.",
    "Intro line\n- item one\n- item two\n\nAfter the list.",
    "Steps:\n1. one\n2. two\n\n> quoted\n\nDone.",
    "A line\n---\nMore text under a rule.\n\nLast paragraph.",
    "Code:\n```py\nx = 1\n```\nDone\n\n# Heading\nText.",
]


def _layout(view: ChatView) -> list[tuple[str, int, int]]:
    doc = view.document()
    layout = doc.documentLayout()
    out = []
    block = doc.begin()
    while block.isValid():
        rect = layout.blockBoundingRect(block)
        out.append((block.text(), round(rect.top()), round(rect.height())))
        block = block.next()
    return out


def _view(qtbot: QtBot) -> ChatView:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 900)
    view.show()
    return view


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_never_moves_a_line_back_and_forth(qtbot: QtBot, text: str) -> None:
    view = _view(qtbot)
    view.begin_answer()
    message = ChatMessage("assistant", "", "streaming")
    seen: dict[tuple[int, str], list[tuple[int, int]]] = {}  # (block, its text): its geometries, in order
    for ch in text:  # one character a step: every partial text a token boundary can give
        message.text += ch
        view.update_answer(message)
        for index, (shown, top, height) in enumerate(_layout(view)):
            history = seen.setdefault((index, shown), [])
            if not history or history[-1] != (top, height):
                assert (top, height) not in history, (
                    f"{shown!r} went back to {(top, height)} after {history} at {message.text[-12:]!r}")
                history.append((top, height))
    view.finish_answer(message)
    streamed = _layout(view)

    reopened = _view(qtbot)
    reopened.show_messages([ChatMessage("assistant", text)])
    assert streamed == _layout(reopened)
