"""Untrusted text (model output, GGUF metadata, file names) made safe to write to a terminal.

A terminal obeys control characters in what it prints: ESC starts sequences that clear the screen,
hide text or write the clipboard (OSC 52), and CR returns to the line start to fake what was printed.
Everything untrusted goes through :func:`terminal_safe` before it reaches stdout or stderr.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar, cast

T = TypeVar("T")

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and isolates
# (which reorder what the reader sees: "Trojan Source").
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: object, *, one_line: bool = False) -> str:
    """``text`` with every control character written out visibly (ESC becomes the four characters ``\\x1b``).

    Newline and tab are kept unless ``one_line`` (metadata, names, single-line messages), where they are
    escaped as ``\\n`` and ``\\t`` so a value cannot fake a line of its own. Lone surrogates, which no
    terminal encoding can print, become U+FFFD.
    """
    value = text if isinstance(text, str) else str(text)
    value = (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_visible, value)
    return _SURROGATE.sub("\ufffd", value)


def terminal_safe_values(value: T) -> T:
    """A report (dataclasses, dicts, lists, tuples) with every string in it made one terminal-safe line."""
    return cast(T, _safe_values(value))


def _safe_values(value: Any) -> Any:
    if isinstance(value, str):
        return terminal_safe(value, one_line=True)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: _safe_values(getattr(value, f.name)) for f in fields(value) if f.init})
    if isinstance(value, Mapping):
        return {_safe_values(k): _safe_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_safe_values(v) for v in value)
    return value
