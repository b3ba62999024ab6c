"""Untrusted text (GGUF metadata, file names, a remote server's answers) shown in a tooltip as typed.

Qt renders a tooltip as rich text whenever it looks like HTML (``Qt::mightBeRichText``): a model file's
architecture ``<img src="/dev/zero">`` froze the window on hover. Every tooltip that holds such text is
built here, escaped inside a paragraph that keeps its line breaks, so it is always rich text whose visible
characters are exactly the ones given.
"""

from __future__ import annotations

import html


def plain_tooltip(text: str) -> str:
    """``text`` as a tooltip that shows its characters, never markup (empty stays empty: no tooltip)."""
    if not text:
        return ""
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>"
