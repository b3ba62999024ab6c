"""Measured acceptance per (target, drafter) pair, kept across runs so the drafter ranking can use it.

Stored as JSON in the data folder, written atomically. α is Leviathan's: the rate at which the first draft
position is accepted. A pair is recorded only when one drafter made every draft (a model drafter without
the n-gram drafter, or the n-gram drafter alone), so the figure belongs to that drafter.
"""

from __future__ import annotations

import math
from pathlib import Path

from app.errors import StorageError
from app.events import MessageStats
from app.library.recommend import NGRAM_KEY
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_json_object

FILE_NAME = "acceptance.json"
MIN_DRAFTED = 8  # fewer drafted tokens say too little to keep
WEIGHT_CAP = 2000.0  # drafted tokens the running mean remembers at most: newer runs keep counting


def default_path() -> Path:
    return data_dir() / FILE_NAME


def _key(target: str, drafter: str) -> str:
    return f"{target}\n{drafter}"


def _read(path: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, value in read_json_object(path).items():
        if isinstance(key, str) and isinstance(value, dict):
            alpha, weight = value.get("alpha"), value.get("weight")
            if isinstance(alpha, float | int) and isinstance(weight, float | int) and 0 <= alpha <= 1 and weight > 0:
                out[key] = {"alpha": float(alpha), "weight": float(weight)}
    return out


def load_measured(path: Path | None = None) -> dict[tuple[str, str], float]:
    """{(target path, drafter path or NGRAM_KEY): measured α}; empty when nothing was measured yet."""
    out: dict[tuple[str, str], float] = {}
    for key, value in _read(path or default_path()).items():
        target, _, drafter = key.partition("\n")
        out[(target, drafter)] = value["alpha"]
    return out


def measured_start(target: str, drafter: str | None) -> float | None:
    """The model drafter's measured acceptance for this pair, to start the depth policy from (None: none)."""
    return load_measured().get((target, drafter)) if drafter else None


def drafter_key(drafter_path: str | None, ngram: int) -> str | None:
    """Which drafter a run's figures belong to, or None when two drafters shared the drafts."""
    if drafter_path and ngram == 0:
        return drafter_path
    if not drafter_path and ngram > 0:
        return NGRAM_KEY
    return None


def record(target: str, drafter: str, stats: MessageStats, path: Path | None = None) -> float | None:
    """Fold one answer's acceptance into the pair's running mean; returns the new α (None if not kept).

    A full disk only means the figure is not kept: the ranking falls back to its stated default.
    """
    if stats.drafted < MIN_DRAFTED or not stats.per_position_acceptance:
        return None
    alpha = stats.per_position_acceptance[0]
    if not math.isfinite(alpha):
        return None
    path = path or default_path()
    table = _read(path)
    old = table.get(_key(target, drafter))
    weight = float(stats.drafted)
    if old is not None:
        total = min(old["weight"] + weight, WEIGHT_CAP)
        alpha = old["alpha"] + (alpha - old["alpha"]) * weight / (old["weight"] + weight)
        weight = total
    table[_key(target, drafter)] = {"alpha": alpha, "weight": weight}
    try:
        atomic_write_json(path, table)
    except StorageError:
        return None
    return alpha
