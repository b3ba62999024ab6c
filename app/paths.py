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
    getter = {
        "models": lambda: Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / "models",
        "config": lambda: Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        "data": lambda: Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        "logs": lambda: Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
        "cache": lambda: Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
    }[kind]
    return getter()


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
