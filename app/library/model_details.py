"""What the model details view says about one GGUF file: who made it and under which licence, its shape, its
tokenizer and chat template, and what SpecDeck keeps for it. Everything read from the header is the file's
own claim (strings capped by the reader); the view shows it as plain text."""

from __future__ import annotations

from dataclasses import dataclass

from app.library.discovery import LibraryEntry
from app.library.gguf_reader import GGUFInfo
from app.storage.tuned import load_tuned
from app.units import format_bytes, format_count

# general.* keys worth a row, as llama.cpp's convert scripts write them (gguf-py's Keys.General).
IDENTITY = (
    ("general.license", "Licence"),
    ("general.license.name", "Licence name"),
    ("general.license.link", "Licence link"),
    ("general.author", "Author"),
    ("general.organization", "Organisation"),
    ("general.finetune", "Fine-tune"),
    ("general.size_label", "Size label"),
    ("general.source.huggingface.repository", "Source repository"),
    ("general.source.url", "Source URL"),
    ("general.url", "URL"),
    ("general.quantized_by", "Quantized by"),
)
TEMPLATE_CHARS = 100_000  # shown at most; a template is a few kB


@dataclass(frozen=True)
class ModelDetails:
    rows: tuple[tuple[str, str], ...]  # (label, value), in the order shown
    chat_template: str | None  # the file's own, cut at TEMPLATE_CHARS; None when it has none


def _shape(info: GGUFInfo) -> list[tuple[str, str]]:
    layers = f"{info.n_layer}"
    if info.mtp_layers:
        layers += f" (the last {info.mtp_layers} an MTP head)"
    if info.recurrent_layers:
        layers += f", {info.recurrent_layers} of them recurrent"
    heads = f"{info.n_head} query, {info.n_head_kv} KV; head size {info.head_dim_k}"
    if info.head_dim_v != info.head_dim_k:
        heads += f" (values {info.head_dim_v})"
    rows = [("Layers", layers), ("Embedding width", str(info.n_embd)), ("Attention heads", heads)]
    if info.sliding_window:
        rows.append(("Sliding window", f"{info.sliding_window} tokens on {sum(info.swa_layers)} layers"))
    return rows


def model_details(entry: LibraryEntry, *, completion_mode: bool | None = None) -> ModelDetails:
    """The details of a library entry. ``completion_mode``: the chat mode SpecDeck opens the model in, where
    the window knows it."""
    rows: list[tuple[str, str]] = [("File", entry.path)]
    if entry.real_path != entry.path:
        rows.append(("Read from", entry.real_path))
    rows.append(("Found in", entry.source))
    info = entry.info
    if info is None:
        rows.append(("Problem", entry.error or "The file could not be read."))
        return ModelDetails(tuple(rows), None)
    size = format_bytes(info.file_size)
    if info.split_count > 1:
        size += f" in this part, {format_bytes(info.tensor_bytes)} of weights in {info.split_count} parts"
    rows += [("Name", info.name), ("Size", size), ("Architecture", info.architecture),
             ("Parameters", format_count(info.n_params)), ("Quantization", info.quantization),
             ("Trained context", f"{info.context_length:,} tokens")]
    rows += _shape(info)
    vocab = f"{info.n_vocab:,} tokens, {info.vocab_type or 'no'} tokenizer"
    if info.tokenizer_pre:
        vocab += f" ({info.tokenizer_pre})"
    rows.append(("Vocabulary", vocab))
    rows.append(("Chat template", "the file's own (below)" if info.has_chat_template
                 else "none: a base model, which continues text (Completion mode by default)"))
    if completion_mode is not None:
        rows.append(("Opens in", "Completion mode" if completion_mode else "chat mode"))
    for key, label in IDENTITY:
        value = info.metadata.get(key)
        if isinstance(value, str) and value.strip():
            rows.append((label, value.strip()))
    tuned = load_tuned(entry.path, None)
    if tuned is not None:
        rows.append(("Tuned alone", f"{tuned.speedup:.2f}× ({tuned.speedup_min:.2f}–{tuned.speedup_max:.2f}) "
                                    f"over plain on {tuned.prompts} prompts"))
    if info.missing_shards:
        rows.append(("Missing parts", ", ".join(info.missing_shards)))
    template = info.chat_template[:TEMPLATE_CHARS] if info.chat_template else None
    return ModelDetails(tuple(rows), template)
