"""Model output is untrusted: no HTML interpretation, nothing fetched, links never followed."""

from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QTextDocument
from pytestqt.qtbot import QtBot

from ui.chat.view import ChatMessage, ChatView

HOSTILE = (
    "Look: <script>alert('x')</script> <img src=http://evil.example/pixel.png> "
    "<b>not bold</b> ![tracker](http://evil.example/t.png) [secrets](file:///etc/passwd) "
    "<a href=\"https://evil.example\">click</a>\n\n```python\nprint('<b>hi</b>')\n```\n"
)


def _check(view: ChatView) -> None:
    view.resize(600, 400)
    view.grab()  # lays out and paints the document, which is when images are requested
    text = view.toPlainText()
    assert "<script>alert('x')</script>" in text  # shown as text, not run or swallowed
    assert "<b>not bold</b>" in text
    assert "<img src=http://evil.example/pixel.png>" in text
    html = view.toHtml()
    assert "<script" not in html
    assert "<b>not bold" not in html
    assert 'src="http://evil.example/pixel.png"' not in html
    # The document asked only for the Markdown image, and got nothing: no image is held or drawn.
    assert set(view.resource_requests) <= {"http://evil.example/t.png"}
    for url in set(view.resource_requests):
        assert not view.document().resource(QTextDocument.ResourceType.ImageResource, QUrl(url))
    assert view.code_blocks() == ["print('<b>hi</b>')"]
    assert view.openLinks() is False
    assert view.openExternalLinks() is False
    view.setSource(QUrl("file:///etc/passwd"))
    assert view.source().isEmpty()
    assert "root:" not in view.toPlainText()


def test_hostile_finished_message_is_inert(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_messages([ChatMessage("user", "<i>hi</i>"), ChatMessage("assistant", HOSTILE)])
    assert "<i>hi</i>" in view.toPlainText()
    _check(view)


def test_hostile_streaming_answer_is_inert(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    answer = ChatMessage("assistant", "", "streaming")
    view.begin_answer()
    for cut in (10, 60, len(HOSTILE)):
        answer.text = HOSTILE[:cut]
        view.update_answer(answer)
    answer.status = "complete"
    view.finish_answer(answer)
    _check(view)


def test_drafter_highlight_colours_by_source(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.highlight_sources = True
    pieces = [("Hello", "target"), (" wor", "ngram"), ("ld", "model")]
    view.show_messages([ChatMessage("assistant", "Hello world", pieces=pieces)])
    assert "Hello world" in view.toPlainText()
    backgrounds = set()
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().background().style().name != "NoBrush":
                backgrounds.add((fragment.text(), fragment.charFormat().background().color().name()))
            it += 1
        block = block.next()
    assert {t for t, _ in backgrounds} == {" wor", "ld"}
    assert len({c for _, c in backgrounds}) == 2
