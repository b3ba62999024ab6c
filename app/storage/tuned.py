"""The drafting settings `specdeck tune` found fastest per (target, drafter) pair, kept across runs.

Stored as JSON beside acceptance.json, written atomically. The window reads a pair's entry when that pair
is chosen, says what it gave and offers it; it replaces the user's drafting settings only when asked. A
file that is missing, damaged or holds invalid values gives no tuned settings (the defaults), never an
error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import SettingsError
from app.params import DraftSettings
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_json_object

FILE_NAME = "tuned.json"
NO_DRAFTER = ""  # the drafter half of the key when no drafter model was given


def default_path() -> Path:
    return data_dir() / FILE_NAME


@dataclass(frozen=True)
class TunedSettings:
    """The winning settings of one tune, with what it measured."""

    draft: DraftSettings  # drafter_path is None when the model drafter lost to the n-gram drafter or none
    speedup: float  # median speedup over plain decoding on the tuned prompts
    speedup_min: float
    speedup_max: float
    prompts: int  # how many prompts it was measured on
    source: str  # the prompts file, or "history"
    when: float  # unix seconds

    def summary(self) -> str:
        """The line the window shows, e.g. "tuned: 1.90× on your prompts"."""
        return f"tuned: {self.speedup:.2f}× on your prompts"

    def as_json(self) -> dict[str, Any]:
        d = self.draft
        return {
            "drafter_path": d.drafter_path, "ngram": d.ngram, "adaptive": d.adaptive, "k": d.k,
            "k_max": d.k_max, "speedup": self.speedup, "speedup_min": self.speedup_min,
            "speedup_max": self.speedup_max, "prompts": self.prompts, "source": self.source, "when": self.when,
        }

    @classmethod
    def from_json(cls, raw: object) -> TunedSettings:
        """Raises SettingsError, ValueError, KeyError or TypeError for anything but a valid entry."""
        if not isinstance(raw, dict):
            raise TypeError("an entry must be an object")
        drafter = raw["drafter_path"]
        if drafter is not None and not isinstance(drafter, str):
            raise TypeError("drafter_path must be a path or null")
        for name in ("ngram", "k", "k_max"):
            if isinstance(raw[name], bool) or not isinstance(raw[name], int):
                raise TypeError(f"{name} must be a whole number")
        if not isinstance(raw["adaptive"], bool):
            raise TypeError("adaptive must be true or false")
        draft = DraftSettings(drafter_path=drafter or None, ngram=raw["ngram"], adaptive=raw["adaptive"],
                              k=raw["k"], k_max=raw["k_max"]).validate()
        numbers = [float(raw[n]) for n in ("speedup", "speedup_min", "speedup_max", "when")]
        if not all(math.isfinite(v) and v >= 0 for v in numbers):
            raise ValueError("figures must be finite and not negative")
        prompts = raw["prompts"]
        if isinstance(prompts, bool) or not isinstance(prompts, int) or prompts < 0:
            raise TypeError("prompts must be a count")
        return cls(draft, numbers[0], numbers[1], numbers[2], prompts, str(raw["source"]), numbers[3])


def _key(target: str, drafter: str | None) -> str:
    return f"{target}\n{drafter or NO_DRAFTER}"


def load_tuned(target: str, drafter: str | None, path: Path | None = None) -> TunedSettings | None:
    """The tuned settings for this pair (``drafter`` None: the target alone), or None."""
    entry = read_json_object(path or default_path()).get(_key(target, drafter))
    if entry is None:
        return None
    try:
        return TunedSettings.from_json(entry)
    except (SettingsError, ValueError, KeyError, TypeError):
        return None


def save_tuned(target: str, drafter: str | None, tuned: TunedSettings, path: Path | None = None) -> Path:
    """Keep ``tuned`` as the pair's settings (other pairs' entries are kept). Raises StorageError."""
    path = path or default_path()
    table = read_json_object(path)
    table[_key(target, drafter)] = tuned.as_json()
    atomic_write_json(path, table)
    return path

