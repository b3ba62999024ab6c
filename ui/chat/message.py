"""A message as the chat shows it, and the grey line under an answer: why it ended, who wrote it, its figures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.events import MessageStats
from app.params import stops_text
from ui.figures import acceptance_text, decode_text, prefill_text, speedup_text, tau_text

STATUS_NOTES = {
    "streaming": "",
    "interrupted": "cut off: the engine stopped while answering",
    "cancelled": "stopped",
    "error": "failed",
}
STOP_NOTES = {
    "eog": "end of turn",
    "max_tokens": "cut at Max tokens",
    "context_full": "context full",
    "stop": "ended at a stop sequence",
    "cancelled": "stopped",
    "error": "failed",
    "crashed": "engine crashed",
}


@dataclass
class ChatMessage:
    role: str
    text: str
    status: str = "complete"
    stats: MessageStats | Mapping[str, Any] | None = None
    store_id: int | None = None  # the row in the history store, when it was saved
    pieces: list[tuple[str, str]] = field(default_factory=list)  # (text, source) per token, this session
    stop_reason: str | None = None  # Finished.reason, "crashed", or None (user messages, older answers)
    model: str | None = None  # the target model's path, for answers
    drafter: str | None = None  # the drafter model's path, when one drafted
    stop_sequence: str | None = None  # stop_reason "stop": the stop string that ended it, this session
    alternatives: tuple[int, ...] = ()  # a question's kept earlier answers, by position (history_rows)


def _stat(stats: MessageStats | Mapping[str, Any], name: str) -> float:
    value = stats.get(name, 0.0) if isinstance(stats, Mapping) else getattr(stats, name, 0.0)
    return float(value) if isinstance(value, int | float) else 0.0


def format_stats(stats: MessageStats | Mapping[str, Any]) -> str:
    """The line under an answer: TTFT, prefill and decode rates, acceptance, tokens per pass, speedup."""
    parts = [
        f"TTFT {_stat(stats, 'ttft_seconds') * 1000:.0f} ms",
        prefill_text(_stat(stats, "prefill_tps")),
        f"decode {decode_text(_stat(stats, 'decode_tps'))}",
    ]
    if _stat(stats, "drafted") > 0:
        parts.append(f"acceptance {acceptance_text(_stat(stats, 'acceptance'))}")
    if _stat(stats, "passes") > 0:  # a remote server reports no passes, so neither figure exists for its answers
        parts.append(f"{tau_text(_stat(stats, 'tokens_per_pass'))} tokens/pass")
    speedup = _stat(stats, "speedup_estimate")
    if _stat(stats, "drafted") > 0 and speedup > 0:  # measured against the plain rate, and something drafted
        parts.append(speedup_text(speedup))
    return " · ".join(parts)


def describe_writer(message: ChatMessage) -> str:
    """Which model (by file name) and drafter wrote an answer; a drafter that drafted nothing in it is named as
    such, not credited."""
    if not message.model:
        return ""
    name = Path(message.model).name
    if not message.drafter:
        return name
    stats = message.stats
    counted = stats is not None and (not isinstance(stats, Mapping) or "model_drafted" in stats)
    idle = counted and stats is not None and _stat(stats, "model_drafted") == 0  # -1: not counted
    drafter = Path(message.drafter).name
    return f"{name} ({drafter} drafted nothing)" if idle else f"{name} + {drafter}"


def footer_text(message: ChatMessage) -> str:
    """The grey line under a message: why it ended, who wrote it, and its figures."""
    if message.role != "assistant":
        return ""
    note = STATUS_NOTES.get(message.status, "")
    if message.stop_reason and message.status not in ("streaming", "interrupted"):
        note = STOP_NOTES.get(message.stop_reason, message.stop_reason)
        if message.stop_reason == "stop" and message.stop_sequence:
            note = f"stopped at “{stops_text([message.stop_sequence])}”"  # \n as typed in the field
    parts = [p for p in (note, describe_writer(message)) if p]
    if message.stats:
        parts.append(format_stats(message.stats))
    return " · ".join(parts)
