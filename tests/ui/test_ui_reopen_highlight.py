"""Drafted tokens stay highlighted in a reopened chat: the answer's drafted character spans are stored with it
(history version 4) and painted again when the chat is opened."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QTextCursor
from pytestqt.qtbot import QtBot

from app.events import FROM_NGRAM, FROM_TARGET, drafted_spans, pieces_from_spans
from tests.ui.conftest import load_pair, set_sampling
from ui.chat.colours import source_colours
from ui.chat.view import ChatView

ANSWER_TIMEOUT_MS = 60_000


def tinted(view: ChatView) -> dict[int, str]:
    """Document position -> source, for every character painted with a drafter's colour."""
    by_colour = {colour.rgb(): source for source, colour in source_colours(view.palette()).items()}
    text = view.toPlainText()
    out = {}
    cursor = QTextCursor(view.document())
    for position in range(len(text)):
        cursor.setPosition(position + 1)
        source = by_colour.get(cursor.charFormat().background().color().rgb())
        if source is not None and cursor.charFormat().background().style() != 0:
            out[position] = source
    return out


def test_a_reopened_chat_shows_the_drafted_tokens_it_showed_live(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target, tiny_drafter_same, ngram=1)
    chat = window.chat
    chat.highlight_check.setChecked(True)
    set_sampling(window, temperature=0, max_tokens=48)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("one two three one two three one two three one two three")
    answer = chat.messages[-1]
    spans = drafted_spans(answer.pieces, len(answer.text))
    # A drafter with the target's own weights at temperature 0: its drafts are the target's tokens.
    assert spans, f"nothing drafted: {answer.stats}"
    live = tinted(chat.view)
    assert live
    assert set(live.values()) <= {s for _, _, s in spans}
    stored = window.store.messages(chat.chat_id)[-1]
    assert [list(s) for s in stored.drafted] == [list(s) for s in spans]

    first = chat.chat_id
    chat.new_chat()
    assert tinted(chat.view) == {}
    with qtbot.waitSignal(chat.chat_opened, timeout=10_000):  # read off the GUI thread
        chat.open_chat(first)
    assert tinted(chat.view) == live  # the same characters, in the same colours


def test_spans_are_compact_and_give_the_pieces_back() -> None:


    pieces = [("Use ", FROM_TARGET), ("the ", FROM_NGRAM), ("same", FROM_NGRAM), (" words", FROM_TARGET)]
    text = "".join(p for p, _ in pieces)
    spans = drafted_spans(pieces, len(text))
    assert spans == [(4, 12, FROM_NGRAM)]  # neighbouring tokens from one drafter: one span
    back = pieces_from_spans(text, spans)
    assert back == [("Use ", FROM_TARGET), ("the same", FROM_NGRAM), (" words", FROM_TARGET)]
    assert pieces_from_spans("short", [(3, 99, FROM_NGRAM)]) == [
        ("sho", FROM_TARGET), ("rt", FROM_NGRAM)]  # a span past the text is cut to it
