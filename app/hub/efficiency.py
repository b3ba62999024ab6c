"""The share of the roofline ceiling that `specdeck doctor --decode-check` measured plain decoding to deliver on
this machine, kept per device (the one that bound the pass), so a quant not yet downloaded is predicted at what
this machine delivers rather than at the spec sheet's promise.

JSON beside the other measurement stores, written atomically; the latest measurement of a device replaces it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.ceiling.roofline import Device
from app.errors import StorageError
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_json_object

FILE_NAME = "ceiling_efficiency.json"


def default_path() -> Path:
    return data_dir() / FILE_NAME


def device_id(kind: str, name: str) -> str:
    # Kind and name, not the key: "gpu0" names another card after a swap.
    return f"{kind}:{name}"


@dataclass(frozen=True)
class MeasuredEfficiency:
    efficiency: float  # measured plain tok/s over the roofline ceiling, for the same model and context
    device: str  # device_id of the binding device
    backend: str  # llama.cpp's backend doctor ran on ("cuda", "cpu", ...), "" when unknown
    model: str  # the model doctor measured, for the record
    when: float  # unix seconds

    def describe(self) -> str:
        day = time.strftime("%Y-%m-%d", time.localtime(self.when))
        on = f", {self.backend}" if self.backend else ""
        return f"predicted from doctor's measured {self.efficiency * 100:.0f} % of the ceiling ({day}{on})"


def _parse(device: str, raw: Any) -> MeasuredEfficiency | None:
    if not isinstance(raw, dict):
        return None
    eff = raw.get("efficiency")
    when = raw.get("when")
    # A ratio above 2 is a ceiling that was wrong, not a machine twice as fast as physics.
    if not isinstance(eff, int | float) or not math.isfinite(eff) or not 0 < eff <= 2:
        return None
    return MeasuredEfficiency(float(eff), device, str(raw.get("backend") or ""), str(raw.get("model") or ""),
                              float(when) if isinstance(when, int | float) and math.isfinite(when) else 0.0)


def load_all(path: Path | None = None) -> dict[str, MeasuredEfficiency]:
    raw = read_json_object(path or default_path())
    out = {}
    for key, value in raw.items():
        parsed = _parse(key, value)
        if parsed is not None:
            out[key] = parsed
    return out


def efficiency_for(device: Device, path: Path | None = None) -> MeasuredEfficiency | None:
    """The measurement for this device, or None when doctor never measured it here."""
    return load_all(path).get(device_id(device.kind, device.name))


def save_efficiency(device: str, efficiency: float, *, backend: str = "", model: str = "",
                    path: Path | None = None) -> MeasuredEfficiency:
    """Keep a measurement (``device``: a device_id); raises StorageError when it cannot be written."""
    entry = _parse(device, {"efficiency": efficiency, "backend": backend, "model": model, "when": time.time()})
    if entry is None:
        raise ValueError(f"an efficiency must be in (0, 2], not {efficiency!r}")
    target = path or default_path()
    raw = read_json_object(target)
    raw[device] = {"efficiency": entry.efficiency, "backend": entry.backend, "model": entry.model,
                   "when": entry.when}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(target, raw)
    except OSError as exc:
        raise StorageError(f"could not keep the measured efficiency in {target}: {exc.strerror or exc}") from exc
    return entry


def record_doctor_report(report: Mapping[str, Any], path: Path | None = None) -> MeasuredEfficiency | None:
    """Keep the efficiency a `doctor --decode-check` report measured, against the device that bound its
    ceiling; None when the report has no passed check with an efficiency."""
    check = report.get("decode_check")
    ceiling = report.get("ceiling")
    if not isinstance(check, Mapping) or not isinstance(ceiling, Mapping) or not check.get("ok"):
        return None
    cal = check.get("calibration")
    eff = cal.get("efficiency") if isinstance(cal, Mapping) else None
    if not isinstance(eff, int | float):
        return None
    key = ceiling.get("binding_device")
    dev = next((d for d in report.get("devices") or () if isinstance(d, Mapping) and d.get("key") == key), None)
    if dev is None:
        return None
    backend = report.get("backend")
    target = report.get("target")
    return save_efficiency(device_id(str(dev.get("kind")), str(dev.get("name"))), float(eff),
                           backend=str(backend.get("backend") or "") if isinstance(backend, Mapping) else "",
                           model=str(target.get("path") or "") if isinstance(target, Mapping) else "",
                           path=path)
