"""What a measured plain decode delivered, beside what the roofline promised: delivered bytes/s and FLOP/s,
and the efficiency (measured over ceiling)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.ceiling.roofline import PassEstimate


@dataclass(frozen=True)
class Calibration:
    """What a measured plain decode delivered, beside what the spec sheet promises."""

    passes_per_second: float
    bytes_per_pass: float
    flops_per_pass: float
    delivered_bandwidth: float  # bytes/s
    delivered_flops: float  # FLOP/s
    ceiling_passes_per_second: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.passes_per_second  # plain decoding emits one token per pass

    @property
    def efficiency(self) -> float | None:
        """Measured over ceiling (0..1 when the ceiling is honest)."""
        if not self.ceiling_passes_per_second:
            return None
        return self.passes_per_second / self.ceiling_passes_per_second


def make_calibration(
    passes_per_second: float, bytes_per_pass: float, flops_per_pass: float,
    ceiling_passes_per_second: float | None = None,
) -> Calibration:
    """Turn a measured plain-decode rate into delivered bytes/s and FLOP/s."""
    if not (math.isfinite(passes_per_second) and passes_per_second >= 0):
        raise ValueError("passes per second must be a finite number >= 0")
    return Calibration(
        passes_per_second=passes_per_second,
        bytes_per_pass=bytes_per_pass,
        flops_per_pass=flops_per_pass,
        delivered_bandwidth=passes_per_second * bytes_per_pass,
        delivered_flops=passes_per_second * flops_per_pass,
        ceiling_passes_per_second=ceiling_passes_per_second,
    )


def calibrate(measured_passes_per_second: float, estimate: PassEstimate) -> Calibration:
    """The calibration of a measured rate against the pass estimate for the same model and context."""
    return make_calibration(measured_passes_per_second, estimate.bytes, estimate.flops,
                            estimate.passes_per_second)
