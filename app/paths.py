"""Where SpecDeck keeps its files (platformdirs), overridable with SPECDECK_HOME for tests and portable use."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "SpecDeck"


def _base(kind: str) -> Path:
    home = os.environ.get("SPECDECK_HOME")
    if home:
        return Path(home) / kind
    if kind == "models":
        return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "models"
    if kind == "config":
        return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    if kind == "data":
        return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    if kind == "logs":
        return Path(platformdirs.user_log_dir(APP_NAME, appauthor=False))
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    """The default folder for models, demo models included (SPECDECK_MODELS_DIR overrides)."""
    override = os.environ.get("SPECDECK_MODELS_DIR")
    return Path(override) if override else _base("models")


def config_dir() -> Path:
    return _base("config")


def data_dir() -> Path:
    return _base("data")


def logs_dir() -> Path:
    return _base("logs")


def cache_dir() -> Path:
    return _base("cache")


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
