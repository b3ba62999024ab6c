"""The chat transcript: Markdown answers with code blocks, stats lines, optional drafter highlighting.

Model output is untrusted. It is rendered with Qt's Markdown reader with raw HTML turned off (it shows as
text), nothing is ever fetched (``loadResource`` answers every request with nothing), and links are never
opened or followed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import (
    QAction,
    QColor,
    QContextMenuEvent,
    QFont,
    QGuiApplication,
    QPalette,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.events import FROM_MODEL, FROM_NGRAM, MessageStats

MARKDOWN = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
STATUS_NOTES = {
    "streaming": "",
    "interrupted": "(cut off: the engine stopped while answering)",
    "cancelled": "(stopped)",
    "error": "(failed)",
}


@dataclass
class ChatMessage:
    role: str
    text: str
    status: str = "complete"
    stats: MessageStats | Mapping[str, Any] | None = None
    store_id: int | None = None  # the row in the history store, when it was saved
    pieces: list[tuple[str, str]] = field(default_factory=list)  # (text, source) per token, this session


def _stat(stats: MessageStats | Mapping[str, Any], name: str) -> float:
    value = stats.get(name, 0.0) if isinstance(stats, Mapping) else getattr(stats, name, 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


def format_stats(stats: MessageStats | Mapping[str, Any]) -> str:
    """The line under an answer: TTFT, prefill and decode rates, acceptance, tokens per pass, speedup."""
    parts = [
        f"TTFT {_stat(stats, 'ttft_seconds') * 1000:.0f} ms",
        f"prefill {_stat(stats, 'prefill_tps'):.0f} tok/s",
        f"decode {_stat(stats, 'decode_tps'):.1f} tok/s",
    ]
    if _stat(stats, "drafted") > 0:
        parts.append(f"acceptance {_stat(stats, 'acceptance') * 100:.0f}%")
    parts.append(f"{_stat(stats, 'tokens_per_pass'):.2f} tokens/pass")
    parts.append(f"{_stat(stats, 'speedup_estimate'):.2f}× vs plain")
    return " · ".join(parts)


MARKDOWN_RENDER_INTERVAL_S = 0.4


class ChatView(QTextBrowser):
    """One document for the whole chat; only the streaming answer is rewritten while it grows."""

    link_hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.document().setUndoRedoEnabled(False)
        self.highlight_sources = False
        self.resource_requests: list[str] = []  # every URL the document asked for (none is ever loaded)
        self._answer_start: int | None = None
        self._shown_text: str | None = None  # the streaming answer's text as shown now
        self._last_render = 0.0
        self.highlighted.connect(self._on_self_highlighted)

    # --- safety -------------------------------------------------------------------------------------

    def loadResource(self, kind: int, url: QUrl | str) -> Any:
        """Never fetch: not http(s), not file:, not qrc. Model output must not reach the network or disk."""
        self.resource_requests.append(url.toString() if isinstance(url, QUrl) else str(url))
        return None

    def setSource(self, url: QUrl | str, *args: Any) -> None:
        return  # links in model output are never followed

    @Slot(QUrl)
    def _on_self_highlighted(self, url: QUrl) -> None:
        self.link_hovered.emit(url.toString())

    # --- building the document ----------------------------------------------------------------------

    def show_messages(self, messages: Sequence[ChatMessage]) -> None:
        self.clear()
        self._answer_start = None
        for message in messages:
            self.append_message(message)

    def append_message(self, message: ChatMessage) -> None:
        self._heading(ROLE_TITLES.get(message.role, message.role.capitalize()))
        cursor = self._new_block()
        self._insert_body(cursor, message)
        self._footer(message)
        self._scroll_to_end()

    def begin_answer(self) -> None:
        self._heading(ROLE_TITLES["assistant"])
        cursor = self._new_block()
        self._answer_start = cursor.position()
        self._shown_text = None
        self._last_render = 0.0

    def update_answer(self, message: ChatMessage) -> None:
        """Show the streaming answer so far (called at most at the paint rate).

        Re-rendering the whole answer as Markdown costs more the longer it gets, and on a small CPU that
        time comes out of decoding; so between full renders (a few a second) new text is appended as is.
        """
        if self._answer_start is None:
            return
        at_bottom = self._at_bottom()
        now = time.monotonic()
        appendable = (
            self._shown_text is not None
            and message.text.startswith(self._shown_text)
            and not (self.highlight_sources and message.pieces)
            and now - self._last_render < MARKDOWN_RENDER_INTERVAL_S
        )
        if appendable:
            assert self._shown_text is not None
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(message.text[len(self._shown_text):])
        else:
            self._insert_body(self._answer_cursor(), message)
            self._last_render = now
        self._shown_text = message.text
        if at_bottom:
            self._scroll_to_end()

    def finish_answer(self, message: ChatMessage) -> None:
        if self._answer_start is not None:
            cursor = self._answer_cursor()
            self._insert_body(cursor, message)
            self._answer_start = None
        self._footer(message)
        self._scroll_to_end()

    @property
    def streaming(self) -> bool:
        return self._answer_start is not None

    def _answer_cursor(self) -> QTextCursor:
        assert self._answer_start is not None
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._answer_start)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setBlockFormat(QTextBlockFormat())
        cursor.setCharFormat(QTextCharFormat())
        return cursor

    def _new_block(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if not self.document().isEmpty():
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        return cursor

    def _heading(self, title: str) -> None:
        cursor = self._new_block()
        fmt = QTextCharFormat()
        fmt.setFontWeight(QFont.Weight.Bold)
        block = QTextBlockFormat()
        block.setTopMargin(10)
        cursor.setBlockFormat(block)
        cursor.insertText(title, fmt)

    def _insert_body(self, cursor: QTextCursor, message: ChatMessage) -> None:
        if message.role == "assistant" and self.highlight_sources and message.pieces:
            self._insert_highlighted(cursor, message.pieces)
        elif message.role == "user":
            cursor.insertText(message.text, QTextCharFormat())  # the user's own words, shown as typed
        else:
            cursor.insertMarkdown(message.text, MARKDOWN)

    def _insert_highlighted(self, cursor: QTextCursor, pieces: Sequence[tuple[str, str]]) -> None:
        """Plain text, each token's background telling where it came from (Markdown is not applied)."""
        colours = source_colours(self.palette())
        plain = QTextCharFormat()
        formats: dict[str, QTextCharFormat] = {}
        for source, colour in colours.items():
            fmt = QTextCharFormat()
            fmt.setBackground(colour)
            fmt.setToolTip("from the n-gram drafter" if source == FROM_NGRAM else "from the drafter model")
            formats[source] = fmt
        for text, source in pieces:
            cursor.insertText(text, formats.get(source, plain))

    def _footer(self, message: ChatMessage) -> None:
        note = STATUS_NOTES.get(message.status, "")
        line = format_stats(message.stats) if message.stats and message.role == "assistant" else ""
        text = " ".join(p for p in (note, line) if p)
        if not text:
            return
        cursor = self._new_block()
        fmt = QTextCharFormat()
        fmt.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        small = QFont(self.font())
        small.setPointSizeF(max(6.0, self.font().pointSizeF() * 0.85))
        fmt.setFont(small)
        fmt.setProperty(QTextFormat.Property.UserProperty, "stats")
        cursor.insertText(text, fmt)

    def stats_lines(self) -> list[str]:
        """The stats/status lines in the document, top to bottom (what tests and accessibility read)."""
        lines = []
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            fmt = it.fragment().charFormat() if not it.atEnd() else None
            if fmt is not None and fmt.property(QTextFormat.Property.UserProperty) == "stats":
                lines.append(block.text())
            block = block.next()
        return lines

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    # --- code blocks --------------------------------------------------------------------------------

    @staticmethod
    def is_code_block(block: QTextBlock) -> bool:
        fmt = block.blockFormat()
        return fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines()

    def code_block_at(self, position: int) -> str | None:
        """The text of the code block around a document position, or None outside code."""
        block = self.document().findBlock(position)
        if not block.isValid() or not self.is_code_block(block):
            return None
        first = block
        while first.previous().isValid() and self.is_code_block(first.previous()):
            first = first.previous()
        lines = []
        current = first
        while current.isValid() and self.is_code_block(current):
            lines.append(current.text())
            current = current.next()
        return "\n".join(lines)

    def code_blocks(self) -> list[str]:
        blocks: list[str] = []
        block = self.document().begin()
        while block.isValid():
            if self.is_code_block(block):
                text = self.code_block_at(block.position())
                if text is not None:
                    blocks.append(text)
                while block.isValid() and self.is_code_block(block):
                    block = block.next()
                continue
            block = block.next()
        return blocks

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        menu = self.createStandardContextMenu(event.pos())
        code = self.code_block_at(self.cursorForPosition(event.pos()).position())
        if code is not None:
            action = QAction("Copy code block", menu)
            action.triggered.connect(lambda: QGuiApplication.clipboard().setText(code))
            first = menu.actions()[0] if menu.actions() else None
            if first is not None:
                menu.insertAction(first, action)
            else:
                menu.addAction(action)
        menu.exec(event.globalPos())
        menu.deleteLater()


def source_colours(palette: QPalette) -> dict[str, QColor]:
    """Backgrounds for drafted tokens, readable on a light or a dark palette."""
    dark = palette.color(QPalette.ColorRole.Base).lightness() < 128
    if dark:
        return {FROM_NGRAM: QColor(40, 90, 60), FROM_MODEL: QColor(40, 70, 120)}
    return {FROM_NGRAM: QColor(200, 240, 200), FROM_MODEL: QColor(200, 220, 250)}
