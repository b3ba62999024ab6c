"""One transform from a logits row to a probability distribution, shared by target (p) and drafter (q).

Order: repetition penalty, temperature, min-p, top-k, top-p, each on what the previous kept. A token
whose probability is below 1e-12 of the top token's is treated as impossible, which keeps the support
small without changing any probability float32 logits can express. Temperature 0 is greedy.
Distributions are sparse: the ids kept and their probabilities (float64, summing to 1).

``SeededDraws``: with a fixed seed, the token at each position is drawn by the Gumbel-max trick from noise
keyed by (seed, position, token id), so the same seed gives the same answer however many tokens each pass
drafted, and with speculation or without.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.params import SamplingSettings

FLOOR_LOG = math.log(1e-12)
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Dist:
    ids: IntArray  # in no particular order
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
        return int(self.ids[int(np.argmax(self.probs))])


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
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if settings.top_p < 1.0:
        ids, probs = _nucleus(ids, probs, settings.top_p)
    return Dist(ids, probs)


def _nucleus(ids: IntArray, probs: FloatArray, top_p: float) -> tuple[IntArray, FloatArray]:
    """Smallest set of most likely tokens whose mass reaches ``top_p`` (at least one), renormalised.

    Sorts only as many candidates as it needs (a growing top slice), not the whole vocabulary.
    """
    n = probs.size
    m = min(64, n)
    while True:
        top = np.argpartition(probs, n - m)[n - m :] if m < n else np.arange(n)
        top = top[np.argsort(-probs[top], kind="stable")]
        cum = np.cumsum(probs[top])
        if cum[-1] >= top_p or m == n:
            cut = min(int(np.searchsorted(cum, top_p, side="left")) + 1, m)
            keep = top[:cut]
            kept = probs[keep]
            return ids[keep], kept / kept.sum()
        m = min(m * 4, n)


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p − q)): where to sample from after a draft token was rejected."""
    order = np.argsort(q.ids)
    q_ids, q_probs = q.ids[order], q.probs[order]
    at = np.minimum(np.searchsorted(q_ids, p.ids), q_ids.size - 1)
    q_at_p = np.where(q_ids[at] == p.ids, q_probs[at], 0.0)
    diff = np.maximum(p.probs - q_at_p, 0.0)
    total = diff.sum()
    if total <= 0.0:  # p == q: any rejection is impossible, but keep a valid answer
        return p
    keep = diff > 0
    return Dist(p.ids[keep], diff[keep] / total)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser, elementwise (uint64 arithmetic wraps, as the algorithm wants)."""
    x = (x + _GOLDEN) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    out: npt.NDArray[np.uint64] = x ^ (x >> np.uint64(31))
    return out


class SeededDraws:
    """The target's draws for a fixed seed: one uniform per (position, token id), independent of the depth.

    A draft token is accepted when it equals the token drawn here, which keeps the output exactly the
    target's distribution (each position's draw is an exact sample of p) and makes it a function of the seed
    alone. A point-mass draft (the suffix drafter's) is accepted with probability p(x), as under the usual
    min(1, p/q) test; a sampled model draft agrees less often than under that test.
    """

    def __init__(self, seed: int) -> None:
        self._key = _splitmix64(np.array([seed], dtype=np.uint64))[0]

    def uniforms(self, position: int, ids: IntArray) -> FloatArray:
        """Uniforms in (0, 1) for ``ids`` at ``position``: 53 bits of a hash of (seed, position, id)."""
        at = _splitmix64(np.array([position], dtype=np.uint64) ^ self._key)[0]
        bits = _splitmix64(ids.astype(np.uint64) ^ at) >> np.uint64(11)
        out: FloatArray = (bits.astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
        return out

    def token(self, dist: Dist, position: int) -> int:
        """A sample of ``dist`` for ``position``: the argmax of log p plus Gumbel noise."""
        if dist.ids.size == 1:
            return int(dist.ids[0])
        gumbel = -np.log(-np.log(self.uniforms(position, dist.ids)))
        with np.errstate(divide="ignore"):
            return int(dist.ids[int(np.argmax(np.log(dist.probs) + gumbel))])
