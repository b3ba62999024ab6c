"""Text is shown as written: the user's messages verbatim (lines and indentation kept, no Markdown), the model's
unfenced code keeps its lines, pipe tables are tables, and Completion mode never turns "# comment" into a
heading."""

from __future__ import annotations

from PySide6.QtGui import QTextTable
from pytestqt.qtbot import QtBot

from ui.chat.message import ChatMessage
from ui.chat.rendering import keep_lines
from ui.chat.view import ChatView

SNIPPET = "\n".join(["def area(w, h):", "    # not a heading", "    return w * h", "", "*not emphasis*",
                     "print(area(2, 3))"] * 3)


def _view(qtbot: QtBot) -> ChatView:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    return view


def _lines(view: ChatView) -> list[str]:
    # A hard line break is U+2028 inside a paragraph; both kinds of break are one line here.
    return view.toPlainText().replace("\u2028", "\n").split("\n")


def _headings(view: ChatView) -> list[str]:
    doc, found = view.document(), []
    block = doc.begin()
    while block.isValid():
        if block.blockFormat().headingLevel() > 0:
            found.append(block.text())
        block = block.next()
    return found


def test_a_users_message_is_shown_verbatim(qtbot: QtBot) -> None:
    view = _view(qtbot)
    view.show_messages([ChatMessage("user", SNIPPET)])
    lines = _lines(view)
    for line in SNIPPET.split("\n"):
        if line:
            assert line in lines  # each line whole, its indentation and its asterisks kept
    assert lines.count("    return w * h") == 3
    assert _headings(view) == []


def test_unfenced_code_from_the_model_keeps_its_lines(qtbot: QtBot) -> None:
    view = _view(qtbot)
    code = "Here it is:\nx = 1\ny = x + 1\nprint(y)"
    view.show_messages([ChatMessage("assistant", code)])
    lines = _lines(view)
    for line in code.split("\n"):
        assert line in lines


def test_the_streaming_answer_keeps_its_lines_too(qtbot: QtBot) -> None:
    view = _view(qtbot)
    answer = ChatMessage("assistant", "", "streaming")
    view.begin_answer()
    for part in ("a = 1\n", "b = 2\n", "c = 3"):
        answer.text += part
        view.update_answer(answer)
    answer.status = "complete"
    view.finish_answer(answer)
    assert {"a = 1", "b = 2", "c = 3"} <= set(_lines(view))


def test_a_pipe_table_is_rendered_as_a_table(qtbot: QtBot) -> None:
    view = _view(qtbot)
    table = "The sizes:\n| model | size |\n|---|---|\n| SmolLM2 | 135M |\n| Gemma | 270M |\n\nDone."
    view.show_messages([ChatMessage("assistant", table)])
    tables = [f for f in view.document().rootFrame().childFrames() if isinstance(f, QTextTable)]
    assert len(tables) == 1
    assert (tables[0].rows(), tables[0].columns()) == (3, 2)
    assert tables[0].cellAt(1, 0).firstCursorPosition().block().text() == "SmolLM2"


def test_completion_mode_shows_the_text_as_written(qtbot: QtBot) -> None:
    view = _view(qtbot)
    text = "Here:\n\n# comment\nimport os\n## second\n**bold**"
    view.show_messages([ChatMessage("assistant", text)])
    assert _headings(view) == ["comment", "second"]  # chat mode: Markdown (a model's heading is a heading)
    view.verbatim = True
    view.show_messages([ChatMessage("user", "# a prompt"), ChatMessage("assistant", text)])
    assert _headings(view) == []
    assert {"# comment", "## second", "**bold**", "# a prompt"} <= set(_lines(view))
    answer = ChatMessage("assistant", "", "streaming")
    view.begin_answer()
    answer.text = "# streamed\nline"
    view.update_answer(answer)
    assert "# streamed" in _lines(view)
    assert _headings(view) == []


def test_completion_mode_follows_the_switch(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    chat = window.chat
    chat.messages = [ChatMessage("user", "x"), ChatMessage("assistant", "Here:\n\n# comment\ncode")]
    chat.view.show_messages(chat.messages)
    chat.completion_check.setChecked(True)
    assert chat.view.verbatim
    assert _headings(chat.view) == []
    chat.completion_check.setChecked(False)
    assert _headings(chat.view) == ["comment"]


def test_keep_lines_leaves_code_blocks_and_paragraph_ends_alone() -> None:
    text = "a\nb\n\n```\nx\ny\n```\n\n    indented\n    code\n\nlast"
    kept = keep_lines(text)
    assert kept.split("\n")[0] == "a  "  # a hard break before "b"
    assert "x\ny\n" in kept
    assert "    indented\n    code\n" in kept
    assert kept.endswith("\n\nlast")
