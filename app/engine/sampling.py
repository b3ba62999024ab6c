"""One transform from a logits row to a probability distribution, shared by target (p) and drafter (q).

Order: repetition penalty, temperature, min-p, top-k, top-p, each on what the previous kept. A token
whose probability is below 1e-12 of the top token's is treated as impossible, which keeps the support
small without changing any probability float32 logits can express. Temperature 0 is greedy.
Distributions are sparse: the ids kept and their probabilities (float64, summing to 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.config import SamplingSettings

FLOOR_LOG = math.log(1e-12)
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Dist:
    ids: IntArray  # sorted by probability, highest first
    probs: FloatArray

    def prob(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        u = rng.random()
        idx = int(np.searchsorted(np.cumsum(self.probs), u * float(self.probs.sum()), side="right"))
        return int(self.ids[min(idx, self.ids.size - 1)])

    @property
    def top(self) -> int:
        return int(self.ids[0])


def point_mass(token: int) -> Dist:
    return Dist(np.array([token], dtype=np.int64), np.array([1.0]))


def apply_penalty(
    row: npt.NDArray[np.float32], recent: npt.NDArray[np.int64], penalty: float
) -> npt.NDArray[np.float32]:
    """llama.cpp's repetition penalty on a copy: positive logits divided, negative multiplied."""
    out = np.array(row, dtype=np.float32, copy=True)
    ids = np.unique(recent)
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def greedy_token(row: npt.NDArray[np.float32], settings: SamplingSettings, recent: npt.NDArray[np.int64] | None) -> int:
    if settings.repeat_penalty != 1.0 and recent is not None and recent.size:
        row = apply_penalty(row, recent, settings.repeat_penalty)
    return int(np.argmax(row))


def distribution(
    row: npt.NDArray[np.float32], settings: SamplingSettings, recent: npt.NDArray[np.int64] | None = None
) -> Dist:
    """The sampling distribution for one logits row (a point mass on the argmax when greedy)."""
    if settings.repeat_penalty != 1.0 and recent is not None and recent.size:
        row = apply_penalty(row, recent, settings.repeat_penalty)
    if settings.temperature == 0.0:
        return point_mass(int(np.argmax(row)))
    inv_t = 1.0 / settings.temperature
    top = float(row.max())
    # Tokens under min-p (or the 1e-12 floor) relative to the top token never survive: cut them first.
    cut = max(math.log(settings.min_p), FLOOR_LOG) if settings.min_p > 0 else FLOOR_LOG
    ids = np.flatnonzero(row >= top + cut * settings.temperature).astype(np.int64)
    logits = row[ids].astype(np.float64) * inv_t
    if 0 < settings.top_k < ids.size:
        keep = np.argpartition(logits, -settings.top_k)[-settings.top_k :]
        ids, logits = ids[keep], logits[keep]
    order = np.argsort(-logits, kind="stable")
    ids, logits = ids[order], logits[order]
    probs = np.exp(logits - logits[0])
    probs /= probs.sum()
    if settings.top_p < 1.0:
        # Smallest prefix whose mass reaches top_p (at least one token).
        n = int(np.searchsorted(np.cumsum(probs), settings.top_p, side="left")) + 1
        ids, probs = ids[:n], probs[:n]
        probs = probs / probs.sum()
    return Dist(ids, probs)


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p − q)): where to sample from after a draft token was rejected."""
    q_map = dict(zip(q.ids.tolist(), q.probs.tolist(), strict=True))
    diff = np.array([max(0.0, pp - q_map.get(t, 0.0)) for t, pp in zip(p.ids.tolist(), p.probs.tolist(), strict=True)])
    total = diff.sum()
    if total <= 0.0:  # p == q: any rejection is impossible, but keep a valid answer
        return p
    keep = diff > 0
    return Dist(p.ids[keep], diff[keep] / total)
