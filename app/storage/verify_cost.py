"""This machine's measured verify-cost curve per target: milliseconds of one target pass by width.

`specdeck bench` and `specdeck tune` measure it (the engine's cost model after a run) and keep it here, as
JSON beside acceptance.json, written atomically; the latest measurement of a target replaces its curve.
A narrower measurement keeps the wider widths measured before. The drafter ranking uses the curve instead
of the bandwidth-bound assumption that a pass of any width costs one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import StorageError
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_json_object

FILE_NAME = "verify_cost.json"


def default_path() -> Path:
    return data_dir() / FILE_NAME


@dataclass(frozen=True)
class VerifyCurve:
    widths_ms: dict[int, float]  # at least width 1
    backend: str
    when: float  # unix seconds

    def describe(self) -> str:
        day = time.strftime("%Y-%m-%d", time.localtime(self.when))
        return f"this machine's measured verify cost ({self.backend}, {day})"

    def relative(self, width: int) -> float:
        """A pass of ``width`` tokens in one-token passes: interpolated between measured widths, beyond
        them extended with the slope of the two widest (never falling)."""
        known = sorted(self.widths_ms)
        one = self.widths_ms[1]
        if width in self.widths_ms:
            return self.widths_ms[width] / one
        lower = [w for w in known if w < width]
        upper = [w for w in known if w > width]
        if lower and upper:
            a, b = lower[-1], upper[0]
            ta, tb = self.widths_ms[a], self.widths_ms[b]
            return (ta + (tb - ta) * (width - a) / (b - a)) / one
        a = lower[-1]
        slope = (self.widths_ms[a] - self.widths_ms[lower[-2]]) / (a - lower[-2]) if len(lower) > 1 else 0.0
        return (self.widths_ms[a] + max(slope, 0.0) * (width - a)) / one


def _parse(value: Any) -> VerifyCurve | None:
    if not isinstance(value, dict) or not isinstance(value.get("widths_ms"), dict):
        return None
    widths: dict[int, float] = {}
    for w, ms in value["widths_ms"].items():
        try:
            width = int(w)
        except ValueError:
            return None
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms) or ms <= 0 or width < 1:
            return None
        widths[width] = float(ms)
    when = value.get("when", 0.0)
    if 1 not in widths or isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        return None
    return VerifyCurve(widths, str(value.get("backend", "")), float(when))


def load_curves(path: Path | None = None) -> dict[str, VerifyCurve]:
    """{model path: its measured curve} for every model measured here (invalid entries left out)."""
    out = {}
    for target, value in read_json_object(path or default_path()).items():
        curve = _parse(value)
        if curve is not None:
            out[target] = curve
    return out


def load_curve(target: str, path: Path | None = None) -> VerifyCurve | None:
    """The measured curve for ``target`` (its path), or None when it was never measured here."""
    return _parse(read_json_object(path or default_path()).get(target))


def record(target: str, widths_ms: Mapping[str, float], backend: str, path: Path | None = None) -> bool:
    """Keep a bench's ``verify_cost_ms`` ({"1": ms, "2": ms, ...}) for ``target``; False when it was not kept
    (no width-1 figure, an invalid value, or a full disk: the ranking then keeps its stated assumption)."""
    entry = {"widths_ms": dict(widths_ms), "backend": backend, "when": time.time()}
    if _parse(entry) is None:
        return False
    path = path or default_path()
    table = read_json_object(path)
    old = _parse(table.get(target))
    if old is not None and old.backend == backend:
        # A narrower run (a small k_max) keeps the wider widths measured before.
        wider = {str(w): ms for w, ms in old.widths_ms.items() if w > max(int(w2) for w2 in widths_ms)}
        entry["widths_ms"] = {**dict(widths_ms), **wider}
    table[target] = entry
    try:
        atomic_write_json(path, table)
    except StorageError:
        return False
    return True
