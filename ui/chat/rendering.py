"""Markdown as the transcript renders it: how much of a streaming answer is final, the limits past which text
is shown as written, hard line breaks, and the safety pass over every rendered document (no image is loaded,
no link is ours unless we made it)."""

from __future__ import annotations

import re

from PySide6.QtGui import QTextCharFormat, QTextCursor, QTextDocument

# Qt's Markdown reader is superlinear in a line's length and a table's size (a 200 KB line took 6 s): past
# these, text is shown as it is.
MARKDOWN_LIMIT_CHARS = 60_000
LINE_LIMIT_CHARS = 4_000
# Qt lays out a table at roughly 0.2-0.6 ms a cell (a 50×50 table: 1.6 s): bigger tables stay text.
TABLE_CELL_LIMIT = 300
COPY_SCHEME = "specdeck-copy"
_FENCE = re.compile(r"^ {0,3}(```|~~~)", re.MULTILINE)
# A last line of only Markdown markers ("-", "=", "#", "1.", "> ", "```"): its meaning depends on what follows
# ("Intro\n-" is a heading for one frame, "Intro\n- item" a list), so a streaming answer shows it once it has text.
_MARKERS_ONLY = re.compile(r"[ \t\-=#*+>|`~_:\d.)]+")
_TABLE_RULE = re.compile(r"^ {0,3}\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")  # a table's |---|:--:| line


def stable_prefix_length(text: str) -> int:
    """How much of a streaming Markdown text is final: up to the last blank line outside a code fence."""
    cut = text.rfind("\n\n")
    while cut >= 0:
        if len(_FENCE.findall(text, 0, cut)) % 2 == 0:
            return cut + 2
        cut = text.rfind("\n\n", 0, cut)
    return 0


def settled_tail(text: str) -> str:
    """The streaming tail without a last line of Markdown markers only (see _MARKERS_ONLY), which would change
    the lines above it for a frame (a paragraph turned heading and back: the spacing jumped)."""
    cut = text.rfind("\n")
    if cut >= 0 and _MARKERS_ONLY.fullmatch(text, cut + 1):
        return text[:cut]
    return text


def keep_lines(text: str) -> str:
    """Markdown that reads as it was written: every line break outside code is a hard break (Markdown joins
    consecutive lines into one paragraph, which collapsed unfenced code and line-by-line answers), and a pipe
    table right under a line of text gets the blank line Markdown needs to see it as a table."""
    lines = text.split("\n")
    out: list[str] = []
    fence: str | None = None
    indented = False  # in an indented code block (it keeps its lines already, and a break would be copied)
    previous_blank = True
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else None
        blank = not line.strip()
        opened = _FENCE.match(line)
        if opened:
            marker = opened.group(1)
            fence = None if fence == marker else (fence or marker)
        elif fence is None:
            if line.startswith(("    ", "\t")):
                indented = indented or previous_blank
            elif not blank:
                indented = False
            starts_table = "|" in line and following is not None and _TABLE_RULE.match(following) is not None
            if starts_table and not previous_blank:
                out.append("")
            in_table = "|" in line and (starts_table or _TABLE_RULE.match(line) is not None or
                                        (following is not None and "|" in following))
            if (not (indented or blank or in_table) and following is not None and following.strip()
                    and not line.endswith(("  ", "\\"))):
                line += "  "
        out.append(line)
        previous_blank = blank
    return "\n".join(out)


def needs_plain(text: str, limit: int = MARKDOWN_LIMIT_CHARS) -> bool:
    """Whether Qt's Markdown reader would take too long on this text (see the limits above)."""
    if len(text) > limit or text.count("|") > TABLE_CELL_LIMIT:
        return True
    return any(len(line) > LINE_LIMIT_CHARS for line in text.split("\n"))


def make_safe(doc: QTextDocument) -> None:
    """Images become their name in brackets before anything lays them out; links we did not make lose
    their ``specdeck-copy`` scheme."""
    block = doc.begin()
    replacements: list[tuple[int, int, str]] = []
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt = frag.charFormat()
            if fmt.isImageFormat():
                name = fmt.toImageFormat().name()
                shown = name if not name.startswith("data:") else "data: image"
                replacements.append((frag.position(), frag.length(), f"[image not loaded: {shown[:80]}]"))
            elif fmt.isAnchor() and any(h.startswith(f"{COPY_SCHEME}:") for h in fmt.anchorHref().split()):
                replacements.append((frag.position(), frag.length(), frag.text()))
            it += 1
        block = block.next()
    for position, length, text in reversed(replacements):
        cursor = QTextCursor(doc)
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
        cursor.insertText(text, QTextCharFormat())
