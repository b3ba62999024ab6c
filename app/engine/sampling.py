"""One transform from a logits row to a probability distribution, shared by target (p) and drafter (q).

Order: the logits adjustment (``adjust``: logit bias, then llama.cpp's penalties), temperature, min-p, top-k,
top-p, each on what the previous kept. A token whose probability is below 1e-12 of the top token's is treated
as impossible, which keeps the support small without changing any probability float32 logits can express.
Temperature 0 is greedy. Distributions are sparse: the ids kept and their probabilities (float64, summing to 1).
``log_softmax`` and ``most_likely`` give the log probabilities an answer reports, from the adjusted row.

``SeededDraws``: with a fixed seed, the token at each position is drawn by the Gumbel-max trick from noise
keyed by (seed, position, token id), so the same seed gives the same answer however many tokens each pass
drafted, and with speculation or without.
"""

from __future__ import annotations

import functools
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


def adjust(row: npt.NDArray[np.float32], settings: SamplingSettings,
           recent: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float32]:
    """The row every sampler reads, for target and drafter alike: the logit bias added, then llama.cpp's
    penalties sampler over ``recent`` (the window; read only when ``settings.penalized``).

    As llama-server chains them: bias first; then for each token in the window, a positive logit is divided by
    the repetition penalty and any other multiplied by it, and count * frequency + presence is subtracted.
    Float32 throughout, as llama.cpp computes it. Ids past the row (a drafter's smaller vocabulary) are skipped;
    the target's are checked against its vocabulary before an answer starts. A copy when anything changes.
    """
    penalize = settings.penalized and recent is not None and recent.size > 0
    if not settings.logit_bias and not penalize:
        return row
    out = np.array(row, dtype=np.float32, copy=True)
    if settings.logit_bias:
        ids, biases = _bias_arrays(settings.logit_bias)
        inside = ids < out.size
        out[ids[inside]] += biases[inside]  # each id once (SamplingSettings.validate)
    if penalize:
        assert recent is not None
        ids, counts = np.unique(recent, return_counts=True)
        inside = (ids >= 0) & (ids < out.size)
        ids, counts = ids[inside], counts[inside]
        vals = out[ids]
        repeat = np.float32(settings.repeat_penalty)
        vals = np.where(vals > 0, vals / repeat, vals * repeat).astype(np.float32)
        vals -= counts.astype(np.float32) * np.float32(settings.frequency_penalty) \
            + np.float32(settings.presence_penalty)
        out[ids] = vals
    return out


@functools.lru_cache(maxsize=16)
def _bias_arrays(logit_bias: tuple[tuple[int, float], ...]) -> tuple[IntArray, npt.NDArray[np.float32]]:
    """A request's bias as arrays, made once per answer rather than once per row."""
    ids = np.array([int(t) for t, _ in logit_bias], dtype=np.int64)
    biases = np.array([b for _, b in logit_bias], dtype=np.float32)
    ids.flags.writeable = biases.flags.writeable = False  # shared by every caller of the cache
    return ids, biases


def greedy_token(row: npt.NDArray[np.float32], settings: SamplingSettings, recent: npt.NDArray[np.int64] | None) -> int:
    return int(np.argmax(adjust(row, settings, recent)))


def distribution(
    row: npt.NDArray[np.float32], settings: SamplingSettings, recent: npt.NDArray[np.int64] | None = None
) -> Dist:
    """The sampling distribution for one logits row (a point mass on the argmax when greedy)."""
    row = adjust(row, settings, recent)
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


NO_LOGPROB = -9999.0  # a token the row rules out (-inf): a number JSON can carry, as OpenAI's API reports it


def log_softmax(row: npt.NDArray[np.float32]) -> FloatArray:
    """Log probabilities of a logits row (float64), with ruled-out tokens at NO_LOGPROB rather than -inf."""
    x = row.astype(np.float64)
    top = float(x.max())
    if not math.isfinite(top):  # nothing allowed (never the case for a row a token came from)
        return np.full(x.size, NO_LOGPROB)
    out: FloatArray = np.maximum(x - (top + math.log(float(np.exp(x - top).sum()))), NO_LOGPROB)
    return out


def most_likely(logprobs: FloatArray, n: int) -> IntArray:
    """The ``n`` most likely ids, most likely first; ties in id order, as argmax breaks them."""
    n = min(n, logprobs.size)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    cut = np.partition(logprobs, logprobs.size - n)[logprobs.size - n]
    ids = np.flatnonzero(logprobs >= cut)  # every tie at the cut, so the order below decides between them
    order = np.lexsort((ids, -logprobs[ids]))
    out: IntArray = ids[order[:n]].astype(np.int64)
    return out


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
