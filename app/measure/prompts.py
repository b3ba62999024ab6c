"""Prompts files for `specdeck bench` and `specdeck tune`: JSONL, one ``{"messages": [...]}`` per line.

The file is input from the user (or from anywhere), so every way it can be wrong is one sentence naming
the line: not UTF-8, not JSON, nested too deeply, a message without text content, an empty conversation,
a role other than system/user/assistant. A pipe, a device or a huge file is refused before it is read.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from app.errors import SettingsError

MAX_FILE_BYTES = 64 * 1024 * 1024
SHAPE = '{"messages": [{"role": "user", "content": "..."}]}'
Prompt = list[dict[str, str]]  # one conversation: its messages up to the answer to time
# Plain text turns only: a tool result needs the call it answers, which a prompts file cannot carry.
ROLES = ("system", "user", "assistant")


def _read_regular(path: Path) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise SettingsError(f"Cannot read the prompts file {path}: {exc.strerror or exc}.") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SettingsError(f"The prompts file {path} is not a regular file (a folder, pipe or device).")
        if info.st_size > MAX_FILE_BYTES:
            raise SettingsError(f"The prompts file {path} is {info.st_size / 1e6:.0f} MB; at most "
                                f"{MAX_FILE_BYTES // 1_000_000} MB are read.")
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise SettingsError(f"Cannot read the prompts file {path}: {exc.strerror or exc}.") from exc
    finally:
        os.close(fd)


def _messages(doc: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(doc, dict) or "messages" not in doc:
        raise SettingsError(f"{where} is not {SHAPE}.")
    messages = doc["messages"]
    if not isinstance(messages, list):
        raise SettingsError(f"{where}: \"messages\" must be a list of messages, not {type(messages).__name__}.")
    if not messages:
        raise SettingsError(f"{where}: \"messages\" is empty; a prompt needs at least one message.")
    out = []
    for n, m in enumerate(messages, 1):
        if not isinstance(m, dict):
            raise SettingsError(f"{where}: message {n} is not {{\"role\": ..., \"content\": ...}}.")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise SettingsError(f"{where}: message {n} has role {str(role)[:40]!r}; only "
                                f"{', '.join(ROLES)} are supported.")
        if not isinstance(content, str):
            raise SettingsError(f"{where}: message {n} has content of type {type(content).__name__}; "
                                "it must be text.")
        out.append({"role": str(role), "content": content})
    return out


def read_prompts(path: Path) -> list[Prompt]:
    """Every prompt in the file, in order. Raises SettingsError with the file, the line and the reason."""
    path = Path(path)
    data = _read_regular(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # an editor's byte-order mark
    prompts = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SettingsError(f"{where} is not UTF-8 text (byte {exc.start + 1} of the line); save the file "
                                "as UTF-8.") from None
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except RecursionError:
            raise SettingsError(f"{where} is nested too deeply to be a prompt.") from None
        except ValueError as exc:
            raise SettingsError(f"{where} is not valid JSON ({exc}).") from None
        prompts.append(_messages(doc, where))
    if not prompts:
        raise SettingsError(f"{path} holds no prompts; write one {SHAPE} per line.")
    return prompts
