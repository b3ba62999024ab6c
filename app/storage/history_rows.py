"""The chat history's rows: the schema and its migrations (``PRAGMA user_version``; ``MIGRATIONS[n]`` takes
version n to n + 1), the rows as dataclasses, how text and JSON side-records are cleaned for SQLite and read
back (a damaged one never hides its message), and a chat written out as Markdown or JSON.
``app.storage.history`` opens, writes and repairs the file."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")
MODES = ("chat", "completion")  # a chat's mode: through the chat template, or the raw text continued
ORIGINS = ("window", "api")  # where a chat came from: typed in the window, or a request to `specdeck serve`
STATUSES = ("complete", "streaming", "interrupted", "cancelled", "error")
FINAL_STATUSES = ("complete", "interrupted", "cancelled", "error")

STATUS_NOTES = {
    "streaming": "still being written",
    "interrupted": "interrupted: SpecDeck stopped before this answer finished",
    "cancelled": "stopped by the user",
    "error": "ended by an error",
}

# Each entry takes the schema from version n to n + 1, inside one transaction.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE chats (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,
            updated REAL NOT NULL
        )""",
        # AUTOINCREMENT: an id is never reused, so a late flush for a deleted answer cannot land in a
        # newer message that happened to get the same id.
        f"""CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN {ROLES!r}),
            text TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN {STATUSES!r}),
            target_model TEXT,
            drafter TEXT,
            sampling TEXT,
            stats TEXT,
            created REAL NOT NULL,
            updated REAL NOT NULL
        )""",
        "CREATE INDEX messages_by_chat ON messages(chat_id, id)",
        "CREATE INDEX messages_by_status ON messages(status)",
    ),
    # Why an answer ended ("eog", "max_tokens", "context_full", "cancelled", "error", "crashed"); NULL for
    # user messages and for answers saved before version 2.
    ("ALTER TABLE messages ADD COLUMN stop_reason TEXT",),
    # Where each chat came from (ORIGINS); chats saved before version 3 were typed in the window.
    ("ALTER TABLE chats ADD COLUMN origin TEXT NOT NULL DEFAULT 'window'",),
    # Which characters of an answer a drafter proposed: JSON [[start, end, source], ...] (see
    # app.events.drafted_spans); NULL for user messages, plain answers and answers saved before version 4.
    ("ALTER TABLE messages ADD COLUMN drafted TEXT",),
    # A chat kept as the earlier version of another (an edit or a regenerate of an earlier message moved
    # the old continuation there): that chat's id; NULL for every other chat.
    ("ALTER TABLE chats ADD COLUMN version_of INTEGER",),
    # How the chat was written (MODES): chat turns or raw completion; NULL: the model's own default.
    ("ALTER TABLE chats ADD COLUMN mode TEXT",),
    # The answers a regenerate of the last answer replaced, kept under their question as alternatives
    # (1-based positions; the answer in the chat holds the one position missing here).
    (
        """CREATE TABLE alternatives (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            question_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            text TEXT NOT NULL,
            status TEXT NOT NULL,
            target_model TEXT,
            drafter TEXT,
            sampling TEXT,
            stats TEXT,
            stop_reason TEXT,
            drafted TEXT
        )""",
        "CREATE INDEX alternatives_by_question ON alternatives(question_id, position)",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class ChatSummary:
    id: int
    title: str
    system_prompt: str
    created: float  # unix seconds
    updated: float
    message_count: int
    origin: str = "window"
    version_of: int | None = None  # the chat this one is an earlier version of
    mode: str | None = None  # MODES, or None: the model's default


@dataclass(frozen=True)
class StoredMessage:
    id: int
    chat_id: int
    role: str
    text: str
    status: str
    target_model: str | None
    drafter: str | None
    sampling: dict[str, Any] | None
    stats: dict[str, Any] | None
    created: float
    updated: float
    stop_reason: str | None = None
    drafted: tuple[tuple[int, int, str], ...] = ()  # drafted character spans (start, end, source)
    alternatives: tuple[int, ...] = ()  # a question's kept earlier answers, by position (see MIGRATIONS)


def answer_position(alternatives: Sequence[int]) -> tuple[int, int]:
    """(position, count) of the answer in the chat among its question's alternatives: the position missing."""
    count = len(alternatives) + 1
    taken = set(alternatives)
    return next((p for p in range(1, count + 1) if p not in taken), count), count


def spans_json(spans: Sequence[Sequence[Any]] | None) -> str | None:
    if not spans:
        return None
    return json.dumps([[int(a), int(b), str(src)] for a, b, src in spans], separators=(",", ":"))


def read_spans(text: str | None) -> tuple[tuple[int, int, str], ...]:
    """The stored spans, or none when unreadable: a damaged side-record must not hide the message."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return ()
    if not isinstance(value, list):
        return ()
    out = []
    for span in value:
        if (isinstance(span, list) and len(span) == 3 and isinstance(span[0], int) and isinstance(span[1], int)
                and isinstance(span[2], str) and 0 <= span[0] < span[1]):
            out.append((span[0], span[1], span[2]))
    return tuple(out)


def clean_text(text: str) -> str:
    """Text SQLite and every exporter can hold: valid surrogate pairs joined, lone ones U+FFFD, NULs gone."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text.replace("\x00", "")


def finite_json(value: Any) -> Any:
    """JSON-ready copy with NaN/infinity as null (strict JSON readers reject them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    if isinstance(value, str):
        return clean_text(value)
    return value


def to_json(value: object) -> str | None:
    if value is None:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a dataclass or a mapping, not {type(value).__name__}")
    return json.dumps(finite_json(value), ensure_ascii=False, allow_nan=False)


def from_json(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None  # an unreadable side-record must not hide the message itself
    return value if isinstance(value, dict) else None


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")


def chat_markdown(chat: ChatSummary, messages: Sequence[StoredMessage]) -> str:
    """A chat as Markdown: its title, system prompt and messages, with a note on every answer that did not end."""
    lines = [f"# {chat.title}", "", f"_Exported from SpecDeck. Chat started {iso_time(chat.created)}._", ""]
    if chat.system_prompt:
        lines += ["## System", "", chat.system_prompt, ""]
    for m in messages:
        heading = m.role.capitalize()
        if m.role == "assistant" and m.target_model:
            heading += f" ({Path(m.target_model).name}"
            heading += f" + {Path(m.drafter).name})" if m.drafter else ")"
        lines += [f"## {heading}", ""]
        lines += [m.text, ""] if m.text else []
        if m.status != "complete":
            lines += [f"_({STATUS_NOTES.get(m.status, m.status)})_", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def chat_json(chat: ChatSummary, messages: Sequence[StoredMessage]) -> str:
    """A chat as JSON (format "specdeck-chat", version 1), NaN and infinity as null."""
    doc = {
        "format": "specdeck-chat",
        "version": 1,
        "title": chat.title,
        "system_prompt": chat.system_prompt,
        "created": iso_time(chat.created),
        "updated": iso_time(chat.updated),
        "messages": [
            {
                "role": m.role,
                "content": m.text,
                "status": m.status,
                "target_model": m.target_model,
                "drafter": m.drafter,
                "sampling": m.sampling,
                "stats": m.stats,
                "created": iso_time(m.created),
                "updated": iso_time(m.updated),
            }
            for m in messages
        ],
    }
    return json.dumps(finite_json(doc), ensure_ascii=False, indent=2, allow_nan=False) + "\n"
