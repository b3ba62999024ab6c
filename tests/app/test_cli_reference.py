"""docs/reference.md is what the commands' own parsers say: regenerated here and compared, so an option added,
renamed or reworded without the reference fails this test (`python -m app.cli.reference > docs/reference.md`)."""

from __future__ import annotations

from pathlib import Path

from app.cli import SUBCOMMANDS
from app.cli.reference import reference_markdown

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_the_reference_is_current() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/reference.md is stale: run `.venv/bin/python -m app.cli.reference > docs/reference.md`")


def test_every_command_and_load_option_is_in_it() -> None:
    text = reference_markdown()
    for name in SUBCOMMANDS:
        assert f"## `specdeck {name}`" in text
    for option in ("`--gpu-layers auto\\|all\\|N` (`-ngl`, `--n-gpu-layers`)", "`--ctx N` (`-c`, `--ctx-size`)"):
        assert text.count(option) == 5  # chat, bench, tune, serve and doctor take the one set of load options
