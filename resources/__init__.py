"""Data files shipped with SpecDeck: demo-model manifest, bench prompts, the README's screenshot."""

from __future__ import annotations

from pathlib import Path

RESOURCES_DIR = Path(__file__).resolve().parent


def resource(name: str) -> Path:
    return RESOURCES_DIR / name
