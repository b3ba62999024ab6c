"""The model details rows for real GGUF files: identity from general.* keys, the shape, the tokenizer, the
chat template (the file's own text), the chat mode, and a file that cannot be read."""

from __future__ import annotations

from pathlib import Path

from app.library.discovery import FOLDER, LibraryEntry, describe
from app.library.model_details import model_details
from tests.gguf_fixtures import write_tiny_model


def describe_file(path: Path) -> LibraryEntry:
    info, error, error_type = describe(path)
    return LibraryEntry(str(path), FOLDER, path.name, str(path), path.stat().st_size, info, error, error_type)


HOSTILE = "<b>bold</b>\x1b[31m{{ raise_exception('no') }}"


def test_a_chat_model_names_its_licence_shape_tokenizer_and_template(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "tiny.gguf", name="Tiny Chat", metadata={
        "general.license": "apache-2.0", "general.author": "Someone", "general.url": "https://example.org/tiny",
        "general.organization": "   "})
    details = model_details(describe_file(path), completion_mode=False)
    rows = dict(details.rows)
    assert rows["File"] == str(path)
    assert (rows["Name"], rows["Architecture"], rows["Licence"], rows["Author"]) == (
        "Tiny Chat", "llama", "apache-2.0", "Someone")
    assert rows["URL"] == "https://example.org/tiny"
    assert "Organisation" not in rows  # blank: no row
    assert rows["Layers"] == "2"
    assert rows["Attention heads"] == "4 query, 2 KV; head size 16"
    assert rows["Trained context"] == "4,096 tokens"
    assert rows["Vocabulary"].startswith("269 tokens, gpt2 tokenizer")
    assert rows["Chat template"] == "the file's own (below)"
    assert rows["Opens in"] == "chat mode"
    assert details.chat_template is not None
    assert "{%" in details.chat_template or "{{" in details.chat_template


def test_a_base_model_and_a_hostile_header_are_told_as_they_are(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "base.gguf", chat_template=None, metadata={"general.license": HOSTILE})
    details = model_details(describe_file(path), completion_mode=True)
    rows = dict(details.rows)
    assert rows["Chat template"].startswith("none: a base model")
    assert rows["Opens in"] == "Completion mode"
    assert rows["Licence"] == HOSTILE.strip()  # the file's words, shown by the dialog as plain text
    assert details.chat_template is None


def test_an_unreadable_file_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    rows = dict(model_details(describe_file(broken)).rows)
    assert rows["File"] == str(broken)
    assert rows["Problem"]
    assert "Architecture" not in rows
