"""Model output is untrusted: no HTML interpretation, nothing fetched, links never followed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextDocument
from pytestqt.qtbot import QtBot

from ui.chat.message import ChatMessage
from ui.chat.view import ChatView

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


# --- file-derived text in labels (issue 13 §3) ----------------------------------------------------------

HTML_ARCH = '<img src="file:///usr/share/pixmaps/debian-logo.png"><h1 style="color:red">✓ Verified safe model</h1>'


def _hostile_gguf(path: Path) -> Path:
    from tests.gguf_fixtures import write_small_gguf

    # general.architecture is shown by the picker's model-info label
    return write_small_gguf(path, HTML_ARCH, lambda writer: writer.add_name("<b>bold name</b>"))


def test_every_label_with_file_derived_text_is_plain_text(
    qtbot: QtBot, make_window, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    model = _hostile_gguf(tmp_path / "hostile" / "html-arch.gguf")
    window = make_window(start_engine=False, folders=(model.parent,))
    picker = window.picker
    plain = {
        "target_info": picker.target_info, "drafter_info": picker.drafter_info,
        "compat_badge": picker.compat_badge, "fit_label": picker.load_box.fit_label,
        "gpu_note": picker.load_box.gpu_note, "status_label": picker.load_box.status_label,
        "crash_headline": window.banner.headline,
    }
    for name, label in plain.items():
        assert label.textFormat() == Qt.TextFormat.PlainText, name
    picker.select_target(model)
    qtbot.waitUntil(lambda: HTML_ARCH in picker.target_info.text(), timeout=10_000)
    assert picker.target_info.textFormat() == Qt.TextFormat.PlainText  # shown as the characters it holds


def test_chat_titles_in_tooltips_are_escaped(qtbot: QtBot, make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(start_engine=False)
    store = window.chat.store
    if store is None:
        pytest.skip("no history store in this window")
    store.new_chat('<img src="file:///etc/passwd"><h1>Title</h1>')
    with qtbot.waitSignal(window.chat.history_refreshed, timeout=10_000):
        window.chat.refresh_history()
    item = window.chat.history_list.item(0)
    assert item.text() == '<img src="file:///etc/passwd"><h1>Title</h1>'
    tip = item.toolTip()
    assert "<img" not in tip
    assert "&lt;img" in tip


def test_a_history_locked_at_startup_is_written_once_free(
    qtbot: QtBot, make_window, specdeck_home: Path  # type: ignore[no-untyped-def]
) -> None:
    import sqlite3

    from app.storage.history import HistoryStore

    path = specdeck_home / "data" / "history.sqlite3"
    HistoryStore(path).close()
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    other.execute("BEGIN EXCLUSIVE")  # another program holds the history while the window starts
    try:
        window = make_window(start_engine=False)
        store = window.store
        assert store is not None
        assert store.warning is not None
        assert "kept in memory" in store.warning
        chat = store.new_chat("made while locked")
        store.add_message(chat, "user", "not lost")
        assert store.pending_count == 2
    finally:
        other.execute("ROLLBACK")
        other.close()
    qtbot.waitUntil(lambda: store.pending_count == 0, timeout=15_000)  # the window's retry timer wrote them
    with HistoryStore(path) as saved:
        [summary] = saved.list_chats()
        assert summary.title == "made while locked"
        assert [m.text for m in saved.messages(summary.id)] == ["not lost"]


def test_a_refused_template_is_told_in_the_window(
    qtbot: QtBot, make_window, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    from tests.gguf_fixtures import write_tiny_model
    from tests.ui.conftest import load_pair, set_sampling

    model = write_tiny_model(tmp_path / "models" / "hang.gguf", chat_template=(
        "{% set a=[0]*4000000 %}{% set b=[a]*4000000 %}{% set c=[0]*3999999+[1] %}{{ c in b }}"))
    window = make_window(folders=(model.parent,))
    load_pair(qtbot, window, model)
    set_sampling(window, temperature=0, max_tokens=4)
    warned: list[str] = []
    show = window.notifier.info  # a notice on the status bar, not a dialog in the middle of the answer
    window.notifier.info = lambda text: (warned.append(text), show(text))  # type: ignore[method-assign]
    for text in ("first", "second"):
        window.chat.input.setPlainText(text)
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=60_000):
            window.chat.send_button.click()
    told = [m for m in warned if "chat template spent more than 2 s of CPU time rendering" in m]
    assert len(told) == 1, warned  # said once for the model, not once per message
    assert told[0].endswith("Answering with the plain ChatML format instead.")


# --- file-derived text in tooltips (issue 28 §1) --------------------------------------------------------

ZERO_IMAGE = '<img src="/dev/zero">'
TOKENS_TARGET = ["<|bos|>", "<|eos|>", "a", "b", "c", "plain", "text", "here"]
TOKENS_DRAFTER = ["<|bos|>", "<|eos|>", "a", "b", "c", ZERO_IMAGE, "<b>bold</b>", "here"]


def _vocab_gguf(path: Path, architecture: str, tokens: list[str]) -> Path:
    from tests.gguf_fixtures import write_small_gguf

    def add_vocab(writer: Any) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)

    return write_small_gguf(path, architecture, add_vocab, rows=len(tokens))


def _shown_text(tip: str) -> str:
    """What Qt's tooltip shows for ``tip``: rich text when it looks like HTML, as QToolTip decides."""
    from PySide6 import QtGui  # Qt.mightBeRichText lives in QtGui's Qt namespace

    doc = QTextDocument()
    if QtGui.Qt.mightBeRichText(tip):
        doc.setHtml(tip)
    else:
        doc.setPlainText(tip)
    return doc.toPlainText()


def test_model_list_tooltips_show_file_text_as_typed(
    qtbot: QtBot, make_window, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    folder = tmp_path / "hostile"
    arch = ZERO_IMAGE + "<b>bold arch</b>"
    target = _vocab_gguf(folder / "a-target.gguf", arch, TOKENS_TARGET)
    drafter = _vocab_gguf(folder / "b-drafter.gguf", "llama", TOKENS_DRAFTER)
    window = make_window(start_engine=False, folders=(folder,))
    picker = window.picker
    with qtbot.waitSignal(picker.drafters_ranked, timeout=30_000):
        assert picker.select_target(target) or picker.target_path() == str(target)
        if picker._report_for == str(target):
            picker.drafters_ranked.emit()
    role = Qt.ItemDataRole.ToolTipRole
    target_tip = picker.target_combo.itemData(picker.target_combo.findData(str(target)), role)
    assert arch in _shown_text(target_tip)  # the characters, not an image and bold text
    drafter_tip = picker.drafter_combo.itemData(picker.drafter_combo.findData(str(drafter)), role)
    assert ZERO_IMAGE in _shown_text(drafter_tip)  # the refusal names the differing token as typed
    for combo in (picker.target_combo, picker.drafter_combo):
        for i in range(combo.count()):
            tip = combo.itemData(i, role)
            if tip:
                doc = QTextDocument()
                doc.setHtml(tip)
                assert "<img" not in doc.toHtml(), tip
                assert "font-weight:700" not in doc.toHtml(), tip


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder", "huge"])
def test_a_hostile_window_state_file_does_not_stop_the_window(
    qtbot: QtBot, make_window, specdeck_home: Path, kind: str  # type: ignore[no-untyped-def]
) -> None:
    from app.paths import config_dir
    from tests.app.test_kept_files import make_hostile

    make_hostile(config_dir() / "window.ini", kind)  # QSettings waited for ever on a FIFO here
    window = make_window(start_engine=False)  # returns: the window was built and its library scanned
    assert not window.picker.scanning
    window.close()  # saves the layout to a fresh window.ini; the hostile one was moved aside
    assert os.path.lexists(config_dir() / "window.ini.unusable")
    assert (config_dir() / "window.ini").is_file()
