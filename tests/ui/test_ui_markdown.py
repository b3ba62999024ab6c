"""The chat view's Markdown: code blocks with a language label and a working Copy link, nothing loaded or
decoded (not even data: images), highlighting that keeps the Markdown, incremental rendering while an
answer streams, and an event loop that stays responsive while a huge line or table streams."""

from __future__ import annotations

import itertools
import time

from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtGui import QFont, QGuiApplication, QTextCursor
from pytestqt.qtbot import QtBot

from app.events import FROM_MODEL, FROM_NGRAM, FROM_TARGET
from ui.chat.colours import source_colours
from ui.chat.message import ChatMessage, footer_text
from ui.chat.rendering import MARKDOWN_LIMIT_CHARS, stable_prefix_length
from ui.chat.view import ChatView

CODE_ANSWER = "Here:\n\n```python\nprint('hi')\nx = 1\n```\n\nDone **now**."
# A 1×1 PNG: Qt's image reader would decode it if the document were allowed to.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
MAX_LAG_S = 0.100


def make_view(qtbot: QtBot) -> ChatView:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 400)
    view.show()
    qtbot.waitExposed(view)
    return view


def test_code_block_has_language_label_background_and_a_copy_link_that_copies(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    view.append_message(ChatMessage("assistant", CODE_ANSWER))
    assert view.code_headers() == ["python   Copy"]
    assert view.code_blocks() == ["print('hi')\nx = 1"]
    block = view.document().findBlock(view.toPlainText().index("print"))
    assert block.blockFormat().background().color().isValid()
    assert block.blockFormat().hasProperty(block.blockFormat().Property.BackgroundBrush)
    position = view.copy_link_position(0)
    assert position is not None
    cursor = QTextCursor(view.document())
    cursor.setPosition(position + 1)
    point = view.cursorRect(cursor).center()
    QGuiApplication.clipboard().clear()
    with qtbot.waitSignal(view.code_copied, timeout=2000):
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(point.x(), point.y()))
    assert QGuiApplication.clipboard().text() == "print('hi')\nx = 1"
    assert "Done now." in view.toPlainText()  # the Markdown around the code is rendered


def test_user_messages_are_shown_as_typed(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    typed = "Fix **this**:\n\n```\nx=1\n```"
    view.append_message(ChatMessage("user", typed))
    assert typed in view.toPlainText()  # no Markdown: what the user wrote is what they see
    assert view.code_blocks() == []


def test_no_resource_is_loaded_or_decoded_not_even_data_images(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    text = (f"![dot](data:image/png;base64,{PNG}) ![remote](http://127.0.0.1:9/x.png) "
            "![local](file:///etc/hostname) [a link](specdeck-copy:0)")
    view.append_message(ChatMessage("assistant", text))
    view.repaint()
    qtbot.wait(50)
    assert view.resource_requests == []
    shown = view.toPlainText()
    assert "[image not loaded: data: image]" in shown
    assert "[image not loaded: http://127.0.0.1:9/x.png]" in shown
    assert view.copy_link_position(0) is None  # a model cannot forge our Copy links


def test_highlighting_drafted_tokens_keeps_the_markdown(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    view.highlight_sources = True
    pieces = [("Use ", FROM_TARGET), ("**bold**", FROM_NGRAM), (" and:\n\n", FROM_TARGET),
              ("```py\n", FROM_TARGET), ("x = 1", FROM_MODEL), ("\n```", FROM_TARGET)]
    message = ChatMessage("assistant", "".join(p for p, _ in pieces), pieces=pieces)
    view.append_message(message)
    plain = view.toPlainText()
    assert "**" not in plain
    assert "```" not in plain
    assert view.code_blocks() == ["x = 1"]
    colours = source_colours(view.palette())
    doc = view.document()

    def background_at(index: int) -> object:
        cursor = QTextCursor(doc)
        cursor.setPosition(index + 1)
        return cursor.charFormat().background().color()

    bold_at = plain.index("bold")
    assert background_at(bold_at) == colours[FROM_NGRAM]

    def weight_at(index: int) -> int:
        cursor = QTextCursor(doc)
        cursor.setPosition(index + 1)
        return cursor.charFormat().fontWeight()

    assert weight_at(bold_at) >= QFont.Weight.Bold.value  # bold kept under the tint
    assert weight_at(plain.index("Use")) < QFont.Weight.Bold.value  # and only where the markdown says
    assert background_at(plain.index("x = 1")) == colours[FROM_MODEL]
    assert background_at(plain.index("Use")) != colours[FROM_NGRAM]


def test_drafted_tokens_are_tinted_while_the_answer_streams(qtbot: QtBot) -> None:
    """Each block is tinted once it is final, before the answer ends (not only after it)."""
    view = make_view(qtbot)
    view.highlight_sources = True
    colours = source_colours(view.palette())
    answer = ChatMessage("assistant", "", "streaming")
    view.begin_answer()
    for text, source in (("First ", FROM_TARGET), ("copied words", FROM_NGRAM), (".\n\n", FROM_TARGET),
                         ("Second ", FROM_TARGET), ("more", FROM_NGRAM)):
        answer.text += text
        answer.pieces.append((text, source))
        view.update_answer(answer)
    assert view.streaming
    plain = view.toPlainText()
    cursor = QTextCursor(view.document())
    cursor.setPosition(plain.index("copied words") + 1)
    assert cursor.charFormat().background().color() == colours[FROM_NGRAM]  # the finished block, tinted now
    cursor.setPosition(plain.index("First") + 1)
    assert cursor.charFormat().background().color() != colours[FROM_NGRAM]


def test_streaming_renders_only_the_last_block(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    view.begin_answer()
    message = ChatMessage("assistant", "", "streaming")
    paragraphs = [f"Paragraph {i} with *some* words." for i in range(40)]
    for paragraph in paragraphs:
        for word in paragraph.split(" "):
            message.text += word + " "
            view.update_answer(message)
        message.text = message.text.rstrip() + "\n\n"
        view.update_answer(message)
    renders = view.renders
    view.finish_answer(message)
    assert view.renders - renders <= 1  # finishing renders the last block, not the whole answer
    shown = view.toPlainText()
    assert "*" not in shown
    assert all(p.replace("*", "") in shown for p in paragraphs)
    assert stable_prefix_length("a\n\n```\nx\n\ny\n") == 3  # a blank line inside a fence is not a boundary


def _stream_and_measure_lag(qtbot: QtBot, view: ChatView, text: str, chunk: int) -> float:
    message = ChatMessage("assistant", "", "streaming")
    view.begin_answer()
    ticks: list[float] = []
    ticker = QTimer()
    ticker.setInterval(10)
    ticker.timeout.connect(lambda: ticks.append(time.perf_counter()))
    feed = QTimer()
    feed.setInterval(33)  # the bridge's paint rate
    offsets = iter(range(chunk, len(text) + chunk, chunk))

    def step() -> None:
        end = next(offsets, None)
        if end is None:
            feed.stop()
            return
        message.text = text[:end]
        view.update_answer(message)

    feed.timeout.connect(step)
    ticker.start()
    feed.start()
    qtbot.waitUntil(lambda: not feed.isActive(), timeout=120_000)
    view.finish_answer(message)
    qtbot.wait(30)
    ticker.stop()
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(gaps) > 10
    assert view.toPlainText().replace("\n", "").replace("\u2029", "").count("x") >= text.count("x")
    return max(gaps) - 0.010


def test_a_200_kb_line_streams_without_freezing_the_window(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    text = ("x" * 9 + " ") * 20_000  # 200 KB, one line
    lag = _stream_and_measure_lag(qtbot, view, text, 2_000)
    print(f"\n200 KB line: max event-loop lag {lag * 1000:.1f} ms")
    assert lag < MAX_LAG_S


def test_a_200_by_200_table_streams_without_freezing_the_window(qtbot: QtBot) -> None:
    view = make_view(qtbot)
    header = "|" + "|".join(f"c{i}" for i in range(200)) + "|\n"
    rule = "|" + "|".join("---" for _ in range(200)) + "|\n"
    rows = "".join("|" + "|".join("x" for _ in range(200)) + "|\n" for _ in range(200))
    text = header + rule + rows
    assert len(text) > MARKDOWN_LIMIT_CHARS  # the table streams on the plain-text path
    lag = _stream_and_measure_lag(qtbot, view, text, 2_000)
    print(f"\n200×200 table: max event-loop lag {lag * 1000:.1f} ms")
    assert lag < MAX_LAG_S


def test_footer_says_why_the_answer_ended_and_who_wrote_it() -> None:
    message = ChatMessage("assistant", "x", stop_reason="max_tokens", model="/m/SmolLM2-135M.Q8_0.gguf",
                          drafter="/m/tiny-drafter.gguf")
    assert footer_text(message) == "cut at Max tokens · SmolLM2-135M.Q8_0.gguf + tiny-drafter.gguf"
    for reason, note in (("eog", "end of turn"), ("context_full", "context full"), ("cancelled", "stopped"),
                         ("crashed", "engine crashed")):
        assert footer_text(ChatMessage("assistant", "x", stop_reason=reason)) == note


def test_a_cached_prompt_says_cached_instead_of_an_absurd_rate() -> None:
    from ui.chat.message import format_stats

    stats = {"ttft_seconds": 0.05, "prefill_tps": 20_111_051.0, "decode_tps": 21.3, "drafted": 0,
             "tokens_per_pass": 1.0, "speedup_estimate": 1.0}
    assert "prefill cached" in format_stats(stats)
    assert "prefill 850 tok/s" in format_stats({**stats, "prefill_tps": 850.0})


def test_a_remote_answer_shows_no_passes_or_speedup_it_never_reported() -> None:
    """A server's answer has decode figures but no passes: its footer must not invent 0 tokens/pass or 1.00×."""
    from app.remote.client import _stats
    from ui.chat.message import format_stats

    remote = format_stats(_stats({"prompt_tokens": 9, "completion_tokens": 40},
                                 {"predicted_per_second": 44.7, "predicted_ms": 895.0, "prompt_per_second": 300.0},
                                 0.05))
    assert "decode 44.7 tok/s" in remote
    assert "tokens/pass" not in remote
    assert "×" not in remote
    local = format_stats({"ttft_seconds": 0.05, "prefill_tps": 850.0, "decode_tps": 21.3, "drafted": 10,
                          "accepted": 8, "acceptance": 0.8, "passes": 12, "tokens_per_pass": 2.5,
                          "speedup_estimate": 1.6})
    assert "2.50 tokens/pass" in local
    assert "1.60× the plain rate" in local
    assert "×" not in format_stats({"decode_tps": 21.3, "drafted": 0, "passes": 12, "tokens_per_pass": 1.0,
                                    "speedup_estimate": 0.7})  # nothing drafted: plain decoding, no ratio
