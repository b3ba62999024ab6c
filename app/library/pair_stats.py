"""Measured acceptance per (target, drafter) pair, kept across runs so the drafter ranking can use it.

Stored as JSON in the data folder, written atomically. α is Leviathan's: the rate at which the first draft
position is accepted. ``per_position`` is the measured acceptance per draft position (the share of drafts
reaching position i whose first i + 1 tokens were all accepted, as the engine's stats give it): acceptance is
clustered (a copy keeps being accepted, a chance match stops), so the ranking predicts from these rather
than from α alone. A pair is recorded only when one drafter made every draft (a model drafter without the
n-gram drafter, or the n-gram drafter alone), so the figure belongs to that drafter.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from app.errors import StorageError
from app.events import MessageStats
from app.library.recommend import NGRAM_KEY
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_json_object

FILE_NAME = "acceptance.json"
MIN_DRAFTED = 8  # fewer drafted tokens say too little to keep
WEIGHT_CAP = 2000.0  # drafted tokens the running mean remembers at most: newer runs keep counting
MAX_POSITIONS = 64  # the widest draft kept per position (the engine drafts at most DEPTH_CAP)


def default_path() -> Path:
    return data_dir() / FILE_NAME


def _key(target: str, drafter: str) -> str:
    return f"{target}\n{drafter}"


def _profile(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(v, float | int) and not isinstance(v, bool) and 0 <= v <= 1 for v in value):
        return None
    return [float(v) for v in value[:MAX_POSITIONS]]


def _read(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in read_json_object(path).items():
        if isinstance(key, str) and isinstance(value, dict):
            alpha, weight = value.get("alpha"), value.get("weight")
            if isinstance(alpha, float | int) and isinstance(weight, float | int) and 0 <= alpha <= 1 and weight > 0:
                out[key] = {"alpha": float(alpha), "weight": float(weight)}
                profile = _profile(value.get("per_position"))
                if profile is not None:
                    out[key]["per_position"] = profile
    return out


def load_measured(path: Path | None = None) -> dict[tuple[str, str], float]:
    """{(target path, drafter path or NGRAM_KEY): measured α}; empty when nothing was measured yet."""
    out: dict[tuple[str, str], float] = {}
    for key, value in _read(path or default_path()).items():
        target, _, drafter = key.partition("\n")
        out[(target, drafter)] = value["alpha"]
    return out


def load_profiles(path: Path | None = None) -> dict[tuple[str, str], tuple[float, ...]]:
    """{(target path, drafter path or NGRAM_KEY): measured acceptance per position} for the pairs that have one."""
    out: dict[tuple[str, str], tuple[float, ...]] = {}
    for key, value in _read(path or default_path()).items():
        if "per_position" in value:
            target, _, drafter = key.partition("\n")
            out[(target, drafter)] = tuple(value["per_position"])
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
    finite = [math.isfinite(a) for a in stats.per_position_acceptance]
    profile = _profile(list(stats.per_position_acceptance[: finite.index(False) if False in finite else None])) or []
    if old is not None:
        share = weight / (old["weight"] + weight)
        alpha = old["alpha"] + (alpha - old["alpha"]) * share
        before = old.get("per_position", [])
        # Positions measured on both sides move by this answer's share; the rest keep whichever side has them.
        profile = [b + (a - b) * share for a, b in zip(profile, before, strict=False)] + (
            profile[len(before):] or before[len(profile):])
        weight = min(old["weight"] + weight, WEIGHT_CAP)
    table[_key(target, drafter)] = {"alpha": alpha, "weight": weight, "per_position": profile[:MAX_POSITIONS]}
    try:
        atomic_write_json(path, table)
    except StorageError:
        return None
    return alpha
