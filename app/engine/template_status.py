"""Whether a model file's chat template is usable: the check ``doctor`` reports, without loading llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine.chat_template import fallback_name, render_chat

SAMPLE_CHAT = (
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Name a colour."},
)


@dataclass(frozen=True)
class TemplateStatus:
    ok: bool  # the model's own template renders a sample conversation
    fallback: str | None  # the format SpecDeck answers with instead ("Gemma", "plain ChatML"), if not ok
    message: str  # one sentence: fine, missing, or refused with the reason and the fallback


def template_status(path: str | Path) -> TemplateStatus:
    """Render a sample conversation with the file's template, in the renderer child under its limits.

    Raises ``GGUFError`` if the file itself cannot be read.
    """
    from app.library.gguf_reader import read_gguf_info

    info = read_gguf_info(path)
    fallback = fallback_name(info.architecture)
    if info.has_chat_template and info.chat_template is None:
        return TemplateStatus(False, fallback, "The model's chat template is far longer than any real one and "
                                               f"is refused; SpecDeck answers with the {fallback} format.")
    if info.chat_template is None or not info.chat_template.strip():
        return TemplateStatus(False, fallback,
                              f"The model has no chat template; SpecDeck answers with the {fallback} format.")
    rendered = render_chat(info.chat_template, list(SAMPLE_CHAT), architecture=info.architecture)
    if rendered.used_fallback:
        return TemplateStatus(False, fallback, f"The model's chat template is refused: {rendered.warning}")
    merged = " (a system message is put at the start of the first user message)" if rendered.warning else ""
    return TemplateStatus(True, None, f"The model's chat template renders correctly{merged}.")
