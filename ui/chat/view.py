"""The chat transcript: Markdown messages with code blocks, stop reasons, stats lines, drafter highlighting.

Model output is untrusted. It is rendered with Qt's Markdown reader with raw HTML turned off (it shows as
text) into a scratch document, where every image is replaced by its name before the view ever lays it out:
nothing is fetched or decoded (not even ``data:`` URIs), and links are never opened or followed
(``ui.chat.rendering``). Over 500 lines: incremental streaming, code blocks and highlighting share the one
document and its positions, so they live with the view; the text rules, the message and the colours do not.

Rendering stays cheap whatever the model writes: while an answer streams, only its last Markdown block is
re-rendered (the blocks before a blank line are final); a block past ``TAIL_LIMIT_CHARS``, or text past
``rendering``'s limits, is shown as plain text, cut into short
paragraphs so a relayout never covers more than one of them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QEvent, QPoint, QUrl, Signal, Slot
from PySide6.QtGui import (
    QAction,
    QContextMenuEvent,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QPalette,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
)
from PySide6.QtWidgets import QMenu, QTextBrowser, QWidget

from app.events import FROM_MODEL, FROM_NGRAM, TRAINED_DRAFTERS
from app.storage.history_rows import answer_position
from ui.chat.colours import code_background, source_colours
from ui.chat.message import ChatMessage, footer_text
from ui.chat.rendering import (
    COPY_SCHEME,
    keep_lines,
    make_safe,
    needs_plain,
    settled_tail,
    stable_prefix_length,
)

MARKDOWN = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
TAIL_LIMIT_CHARS = 1_500  # the streaming block re-rendered each frame (~5 ms here; 4,000 took 27 ms)
CHUNK_LIMIT_CHARS = 20_000  # a block rendered once, when it is complete
PLAIN_PARAGRAPH_CHARS = 2_000  # plain text is cut into paragraphs this long, so relayout stays small


ALTERNATIVE_SCHEME = "specdeck-alternative"


class ChatView(QTextBrowser):
    """One document for the whole chat; only the streaming answer's last block is rewritten as it grows."""

    link_hovered = Signal(str)
    code_copied = Signal(str)
    message_action = Signal(str, int)  # one of MESSAGE_ACTIONS, the message's index in the chat
    alternative_chosen = Signal(int)  # the last answer's alternative (1-based) the navigator asked for
    palette_changed = Signal()  # the colours the document was drawn in are no longer the palette's

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.document().setUndoRedoEnabled(False)
        self.highlight_sources = False
        # Completion mode: the transcript is one raw text, shown as written (a "# comment" is no heading).
        self.verbatim = False
        self.resource_requests: list[str] = []  # every URL the document asked for (none is ever loaded)
        self.renders = 0  # Markdown renders, for tests of the incremental path
        self._snippets: dict[int, str] = {}  # code block id -> its text, for the Copy links
        self._snippet_ids = itertools.count()
        self._answer_start: int | None = None  # where the streaming answer's body begins
        self._tail_start: int | None = None  # where its last (still changing) block begins
        self._stable_len = 0  # source characters of the answer rendered for good
        self._plain = False  # the streaming answer is shown as plain text
        self._tail_plain = False  # its last block is (too long for Markdown while it streams)
        self._shown_plain = ""  # the plain text shown from the answer's (or tail's) start
        self._follow = True  # keep the end in view: on after Send, off once the user scrolls up
        self._message_starts: list[int] = []  # where each message's heading begins, in chat order
        self._message_roles: list[str] = []
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_scroll_bar_range_changed)
        bar.valueChanged.connect(self._on_scroll_bar_value_changed)
        self.highlighted.connect(self._on_self_highlighted)
        self.anchorClicked.connect(self._on_self_anchor_clicked)

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

    @Slot(QUrl)
    def _on_self_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == ALTERNATIVE_SCHEME and url.path().isdigit():
            self.alternative_chosen.emit(int(url.path()))
            return
        if url.scheme() != COPY_SCHEME:
            return
        try:
            code = self._snippets[int(url.path())]
        except (KeyError, ValueError):
            return
        QGuiApplication.clipboard().setText(code)
        self.code_copied.emit(code)

    # --- following the end --------------------------------------------------------------------------

    def follow_end(self) -> None:
        """Scroll to the end and stay there while the text grows (after Send or Regenerate)."""
        self._follow = True
        self._scroll_to_end()

    @property
    def following(self) -> bool:
        return self._follow

    @Slot(int, int)
    def _on_scroll_bar_range_changed(self, _low: int, high: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(high)

    @Slot(int)
    def _on_scroll_bar_value_changed(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 4

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    # --- building the document ----------------------------------------------------------------------

    def show_messages(self, messages: Sequence[ChatMessage]) -> None:
        self.clear()
        self._snippets.clear()
        self._answer_start = None
        self._message_starts.clear()
        self._message_roles.clear()
        for message in messages:
            self.append_message(message)
        self.show_alternatives(messages)
        self.follow_end()

    def show_alternatives(self, messages: Sequence[ChatMessage]) -> None:
        """"‹ 2/3 ›" under the last answer when its question keeps other answers; ‹ and › link to them."""
        self._drop_alternatives()
        if len(messages) < 2 or messages[-1].role != "assistant" or not messages[-2].alternatives:
            return
        position, count = answer_position(messages[-2].alternatives)
        cursor = self._new_block()
        fmt = self._small_format()
        fmt.setProperty(QTextFormat.Property.UserProperty, "alternatives")
        fmt.setToolTip("Answers this question had before Regenerate; ‹ and › show another")
        for label, target in (("\u2039", position - 1), (f" {position}/{count} ", 0), ("\u203a", position + 1)):
            part = QTextCharFormat(fmt)
            if target and 1 <= target <= count:
                part.setAnchor(True)
                part.setAnchorHref(f"{ALTERNATIVE_SCHEME}:{target}")
                part.setForeground(self.palette().color(QPalette.ColorRole.Link))
            cursor.insertText(label, part)

    def alternatives_line(self) -> str:
        """The navigator's text ("‹ 2/3 ›"), or "" when none is shown (for tests and accessibility)."""
        lines = self._blocks_with("alternatives")
        return lines[-1] if lines else ""

    def _drop_alternatives(self) -> None:
        """The navigator belongs under the last answer only: it goes when anything is written after it."""
        last = self.document().lastBlock()
        if _block_marker(last) != "alternatives":
            return
        cursor = QTextCursor(self.document())
        cursor.setPosition(max(0, last.position() - 1))  # the new line before it too
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()

    def append_message(self, message: ChatMessage) -> None:
        self._drop_alternatives()
        self._mark_message(message.role)
        self._heading(ROLE_TITLES.get(message.role, message.role.capitalize()))
        cursor = self._new_block()
        start = cursor.position()
        # The user's own text is shown as typed: a pasted snippet keeps its lines and its spaces.
        plain = message.role == "user" or self.verbatim or needs_plain(message.text)
        self._insert_body(cursor, message.text, plain=plain)
        self._highlight(start, message)
        self._footer(message)

    def begin_answer(self) -> None:
        self._drop_alternatives()
        self._mark_message("assistant")
        self._heading(ROLE_TITLES["assistant"])
        cursor = self._new_block()
        self._answer_start = cursor.position()
        self._tail_start = cursor.position()
        self._stable_len = 0
        self._plain = False
        self._tail_plain = False
        self._shown_plain = ""

    def update_answer(self, message: ChatMessage) -> None:
        """Show the streaming answer so far: blocks that became final are rendered once, the last block
        again while it is short (TAIL_LIMIT_CHARS); text shown plain only has its new end appended."""
        if self._answer_start is None or self._tail_start is None:
            return
        text = message.text
        if not self._plain and (self.verbatim or needs_plain(text)):
            self._plain = True  # the whole answer, from here to its end
            self._restart_plain(self._answer_start)
        if self._plain:
            self._show_plain(self._answer_start, text)
            return
        stable = stable_prefix_length(text)
        if stable > self._stable_len:
            chunk = text[self._stable_len:stable]
            self._insert_body(self._cut_from(self._tail_start), chunk, plain=needs_plain(chunk, CHUNK_LIMIT_CHARS))
            # Tinted as each block becomes final, not only when the answer ends; the last block waits.
            self._highlight(self._tail_start, message, self._stable_len, stable)
            self._stable_len = stable
            self._tail_start = self._new_block().position()
            self._tail_plain = False
        tail = text[self._stable_len:]
        if needs_plain(tail, TAIL_LIMIT_CHARS):
            if not self._tail_plain:
                self._tail_plain = True
                self._restart_plain(self._tail_start)
            self._show_plain(self._tail_start, tail)
        else:
            self._tail_plain = False
            self._insert_markdown(self._cut_from(self._tail_start), settled_tail(tail))

    def _restart_plain(self, start: int) -> None:
        self._cut_from(start)
        self._shown_plain = ""

    def _show_plain(self, start: int, text: str) -> None:
        """Plain text from ``start`` to the end: only what was added since the last call is inserted."""
        if not text.startswith(self._shown_plain):
            self._restart_plain(start)
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._append_plain(cursor, text[len(self._shown_plain):])
        self._shown_plain = text

    def finish_answer(self, message: ChatMessage) -> None:
        if self._answer_start is not None and self._tail_start is not None:
            start = self._answer_start
            text = message.text
            if self._plain:
                self._show_plain(start, text)
            elif len(text) >= self._stable_len and not needs_plain(text):
                # The final blocks were rendered while streaming; only the last block is rendered again.
                tail = text[self._stable_len:]
                self._insert_body(self._cut_from(self._tail_start), tail, plain=needs_plain(tail, CHUNK_LIMIT_CHARS))
            else:
                self._insert_body(self._cut_from(start), text, plain=needs_plain(text))
            self._highlight(start, message)
        self._answer_start = None
        self._tail_start = None
        self._footer(message)

    @property
    def streaming(self) -> bool:
        return self._answer_start is not None

    def _mark_message(self, role: str) -> None:
        self._message_starts.append(self._end())
        self._message_roles.append(role)

    def message_at(self, position: int) -> int | None:
        """The index of the message shown at a document position (its heading, text or footer)."""
        index = bisect.bisect_right(self._message_starts, position) - 1
        return index if index >= 0 else None

    def message_under(self, point: QPoint) -> int | None:
        """The message shown at a viewport point. By the clicked line's block, not the cursor position: right of
        a line's end the cursor sits at the block's end, which is where the next message's record begins."""
        return self.message_at(self.cursorForPosition(point).block().position())

    def message_position(self, index: int) -> int:
        """Where a message's text begins (its first block after the heading)."""
        return self.document().findBlock(self._message_starts[index]).next().position()

    def message_menu(self, index: int, parent: QWidget | None = None) -> QMenu:
        """The actions for one message: copy it, edit it (a question), answer it again (an answer), delete it."""
        menu = QMenu(parent or self)
        role = self._message_roles[index]
        idle = not self.streaming
        labels = [("copy", "Copy message")]
        if role == "user":
            labels.append(("edit", "Edit this message…"))
        if role == "assistant":
            labels.append(("regenerate", "Regenerate this answer"))
        labels.append(("delete", "Delete message"))
        for action, label in labels:
            item = menu.addAction(label)
            item.setData(action)
            item.setEnabled(idle or action == "copy")
            item.triggered.connect(lambda _on=False, a=action: self.message_action.emit(a, index))
        return menu

    def _end(self) -> int:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor.position()

    def _cut_from(self, position: int) -> QTextCursor:
        """Remove everything from ``position`` to the end; the cursor is left there, with plain formats."""
        cursor = QTextCursor(self.document())
        cursor.setPosition(position)
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

    def _insert_body(self, cursor: QTextCursor, text: str, *, plain: bool) -> None:
        if plain:
            self._append_plain(cursor, text)
        else:
            self._insert_markdown(cursor, text)

    def _append_plain(self, cursor: QTextCursor, text: str) -> None:
        """Text as it is, in paragraphs of at most PLAIN_PARAGRAPH_CHARS (a 200 KB line is 100 of them), so
        that appending relays out one short paragraph, not the whole line."""
        fmt = QTextCharFormat()
        for i, line in enumerate(text.split("\n")):
            if i:
                cursor.insertBlock(QTextBlockFormat(), fmt)
            while line:
                room = PLAIN_PARAGRAPH_CHARS - (cursor.block().length() - 1)
                if room <= 0:
                    cursor.insertBlock(QTextBlockFormat(), fmt)
                    room = PLAIN_PARAGRAPH_CHARS
                cursor.insertText(line[:room], fmt)
                line = line[room:]

    def _insert_markdown(self, cursor: QTextCursor, text: str) -> None:
        """Markdown rendered in a scratch document, made safe and dressed there, then inserted."""
        if not text.strip():
            cursor.insertText(text.strip("\n"), QTextCharFormat())
            return
        self.renders += 1
        scratch = QTextDocument()
        scratch.setDefaultFont(self.font())
        scratch.setMarkdown(keep_lines(text), MARKDOWN)
        make_safe(scratch)
        self._dress_code_blocks(scratch)
        first = scratch.begin().blockFormat()
        start = cursor.position()
        cursor.insertFragment(QTextDocumentFragment(scratch))
        landed = self.document().findBlock(start)
        if not landed.text() and scratch.begin().text() and landed.next().isValid():
            # A fragment that starts with a list is put after the empty block it was inserted into: that block
            # would add a blank line while streaming that the chat, reopened, does not have.
            QTextCursor(landed.next()).deletePreviousChar()
        # The fragment's first block merges into the block it lands in and takes that block's plain format, so
        # each streamed block lost its paragraph spacing (and a reopened chat, rendered in one piece, had it).
        spacing = QTextBlockFormat()
        spacing.setTopMargin(first.topMargin())
        spacing.setBottomMargin(first.bottomMargin())
        QTextCursor(self.document().findBlock(start)).mergeBlockFormat(spacing)

    def _dress_code_blocks(self, doc: QTextDocument) -> None:
        """Each code block gets a tinted background, a monospace font and a header line with its language
        and a Copy link."""
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        background = code_background(self.palette())
        runs: list[tuple[QTextBlock, QTextBlock]] = []
        block = doc.begin()
        while block.isValid():
            if self.is_code_block(block):
                first = last = block
                while last.next().isValid() and self.is_code_block(last.next()):
                    last = last.next()
                runs.append((first, last))
                block = last.next()
                continue
            block = block.next()
        for first, last in reversed(runs):
            lines = []
            b = first
            while True:
                lines.append(b.text())
                fmt = b.blockFormat()
                fmt.setBackground(background)
                fmt.setLeftMargin(6)
                cursor = QTextCursor(b)
                cursor.setBlockFormat(fmt)
                cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
                char = QTextCharFormat()
                char.setFont(mono)
                cursor.mergeCharFormat(char)
                if b == last:
                    break
                b = b.next()
            snippet = next(self._snippet_ids)
            self._snippets[snippet] = "\n".join(lines)
            language = str(first.blockFormat().property(QTextFormat.Property.BlockCodeLanguage) or "").strip()
            cursor = QTextCursor(first)
            cursor.insertBlock()  # the header goes where the code began; the code moves one block down
            cursor.movePosition(QTextCursor.MoveOperation.PreviousBlock)
            header = QTextBlockFormat()
            header.setBackground(background.darker(110))
            header.setLeftMargin(6)
            header.setTopMargin(4)
            cursor.setBlockFormat(header)
            label = QTextCharFormat()
            label.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
            label.setProperty(QTextFormat.Property.UserProperty, "code_header")
            cursor.insertText(f"{language or 'code'}   ", label)
            link = QTextCharFormat(label)
            link.setAnchor(True)
            link.setAnchorHref(f"{COPY_SCHEME}:{snippet}")
            link.setFontUnderline(True)
            link.setForeground(self.palette().color(QPalette.ColorRole.Link))
            cursor.insertText("Copy", link)

    def _highlight(self, start: int, message: ChatMessage, src_from: int = 0, src_to: int | None = None) -> None:
        """Tint each drafted token's characters in the rendered text from ``start`` on, keeping the Markdown as
        rendered; ``src_from``/``src_to``: the part of the source text rendered there (default: all of it).

        Rendering drops Markdown's syntax but keeps the order of the text, so the rendered characters are
        matched to the source one by one (a character Markdown added is skipped)."""
        if not (self.highlight_sources and message.role == "assistant" and message.pieces):
            return
        colours = source_colours(self.palette())
        sources: list[str] = []
        source_text: list[str] = []
        for text, source in message.pieces:
            source_text.append(text)
            sources.extend([source] * len(text))
        src = "".join(source_text)[src_from:src_to]
        sources = sources[src_from:src_to]
        runs: list[tuple[int, int, str]] = []  # document start, end, source
        i = 0
        block = self.document().findBlock(start)
        while block.isValid():
            if _block_marker(block) == "code_header":  # our own text: nothing in the source matches it
                block = block.next()
                continue
            for offset, ch in enumerate(block.text()):
                j = src.find(ch, i, i + 64)
                if j < 0:
                    continue  # a character the rendering added
                i = j + 1
                source = sources[j]
                if source not in colours:
                    continue
                pos = block.position() + offset
                if runs and runs[-1][2] == source and runs[-1][1] == pos:
                    runs[-1] = (runs[-1][0], pos + 1, source)
                else:
                    runs.append((pos, pos + 1, source))
            block = block.next()
        cursor = QTextCursor(self.document())
        tips = {FROM_NGRAM: "from the suffix drafter", FROM_MODEL: f"from the trained drafter ({TRAINED_DRAFTERS})"}
        for a, b, source in runs:
            cursor.setPosition(a)
            cursor.setPosition(b, QTextCursor.MoveMode.KeepAnchor)
            fmt = QTextCharFormat()
            fmt.setBackground(colours[source])
            fmt.setToolTip(tips.get(source, ""))
            cursor.mergeCharFormat(fmt)

    def _footer(self, message: ChatMessage) -> None:
        text = footer_text(message)
        if not text:
            return
        cursor = self._new_block()
        fmt = self._small_format()
        fmt.setProperty(QTextFormat.Property.UserProperty, "stats")
        cursor.insertText(text, fmt)

    def _small_format(self) -> QTextCharFormat:
        """The footer's look: smaller, in the placeholder colour."""
        fmt = QTextCharFormat()
        fmt.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        small = QFont(self.font())
        small.setPointSizeF(max(6.0, self.font().pointSizeF() * 0.85))
        fmt.setFont(small)
        return fmt

    def stats_lines(self) -> list[str]:
        """The stats/status lines in the document, top to bottom (what tests and accessibility read)."""
        return self._blocks_with("stats")

    def code_headers(self) -> list[str]:
        return self._blocks_with("code_header")

    def _blocks_with(self, marker: str) -> list[str]:
        lines = []
        block = self.document().begin()
        while block.isValid():
            if _block_marker(block) == marker:
                lines.append(block.text())
            block = block.next()
        return lines

    def copy_link_position(self, index: int) -> int | None:
        """The document position of the index-th code block's Copy link (for tests and accessibility)."""
        found = 0
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                if frag.charFormat().anchorHref().startswith(f"{COPY_SCHEME}:"):
                    if found == index:
                        return frag.position()
                    found += 1
                it += 1
            block = block.next()
        return None

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

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.palette_changed.emit()

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        menu = self.createStandardContextMenu(event.pos())
        position = self.cursorForPosition(event.pos()).position()
        index = self.message_under(event.pos())
        if index is not None:
            menu.addSeparator()
            for action in self.message_menu(index, menu).actions():
                menu.addAction(action)
        code = self.code_block_at(position)
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


def _block_marker(block: QTextBlock) -> object:
    """The marker our own lines carry in their first fragment ("stats", "code_header"), or None."""
    it = block.begin()
    return None if it.atEnd() else it.fragment().charFormat().property(QTextFormat.Property.UserProperty)
