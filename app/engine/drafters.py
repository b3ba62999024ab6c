"""Drafters propose tokens for the target to verify.

``NGramDrafter`` looks the last n tokens up in a map of what followed them earlier (prompt and output);
``ModelDrafter`` runs a small GGUF with the same vocabulary in its own context; ``StackedDrafter`` lets
the free n-gram draft go first and the model fill the rest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.config import SamplingSettings
from app.engine import sampling
from app.engine.llama import Context, Model
from app.engine.sampling import Dist
from app.events import FROM_MODEL, FROM_NGRAM


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    q: list[Dist | None] = field(default_factory=list)  # None: a point mass (q(x) = 1)
    sources: list[str] = field(default_factory=list)
    model_seconds: float = 0.0
    model_steps: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, other: Draft) -> None:
        self.tokens += other.tokens
        self.q += other.q
        self.sources += other.sources
        self.model_seconds += other.model_seconds
        self.model_steps += other.model_steps


class NGramDrafter:
    """An incremental map from each n-token key to where its latest continuation starts."""

    def __init__(self, n: int = 3) -> None:
        self.n = n
        self._map: dict[tuple[int, ...], int] = {}
        self._tokens: list[int] = []

    def reset(self) -> None:
        self._map.clear()
        self._tokens = []

    def observe(self, tokens: Sequence[int]) -> None:
        """Bring the map up to date with ``tokens`` (the whole sequence so far; a rewrite resets it)."""
        known = self._tokens
        if len(tokens) < len(known) or list(tokens[: len(known)]) != known:
            self.reset()
            known = self._tokens
        n = self.n
        for i in range(max(len(known), n), len(tokens)):
            self._map[tuple(tokens[i - n : i])] = i
        self._tokens = list(tokens)

    def propose(self, tokens: Sequence[int], k: int) -> Draft:
        self.observe(tokens)
        if k <= 0 or len(tokens) < self.n:
            return Draft()
        start = self._map.get(tuple(tokens[-self.n :]))
        if start is None:
            return Draft()
        cont = self._tokens[start : start + k]
        return Draft(tokens=list(cont), q=[None] * len(cont), sources=[FROM_NGRAM] * len(cont))


class ModelDrafter:
    """A small GGUF drafter with its own KV cache. Greedy targets get top-1 drafts; sampling targets get
    drafts sampled from q, with q kept for the acceptance test. Stops early when its confidence is low."""

    def __init__(self, model: Model, ctx: Context, p_min: float = 0.1) -> None:
        self.model = model
        self.ctx = ctx
        self.p_min = p_min
        self._cached: list[int] = []  # tokens whose KV is in ctx
        self._next_row: npt.NDArray[np.float32] | None = None  # logits after _cached (copied)

    def reset(self) -> None:
        self.ctx.clear()
        self._cached = []
        self._next_row = None

    def _sync(self, tokens: Sequence[int]) -> None:
        """Roll back to the common prefix with ``tokens`` and decode what is missing (catch-up)."""
        common = 0
        cached = self._cached
        limit = min(len(cached), len(tokens))
        while common < limit and cached[common] == tokens[common]:
            common += 1
        if common == len(tokens) and common == len(cached) and self._next_row is not None:
            return
        if common == len(tokens):  # the whole context is cached but we need its last logits again
            common -= 1
        self.ctx.truncate(common)
        del cached[common:]
        missing = list(tokens[common:])
        row = self.ctx.prefill(missing)
        cached.extend(missing)
        self._next_row = np.array(row[-1], copy=True)

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        recent: npt.NDArray[np.int64] | None = None,
    ) -> Draft:
        draft = Draft()
        if k <= 0:
            return draft
        t0 = time.perf_counter()
        room = self.ctx.n_ctx - len(tokens) - 1
        k = min(k, room)
        if k <= 0:
            return draft
        self._sync(tokens)
        row = self._next_row
        assert row is not None
        history = list(recent) if recent is not None else []
        for i in range(k):
            recent_arr = np.array(history[-settings.repeat_last_n :], dtype=np.int64) if history else None
            dist = sampling.distribution(row, settings, recent_arr)
            # Decide to stop before sampling, from the row alone: stopping on the probability of the token
            # just sampled would drop unlikely draws and skew the output towards confident tokens (no
            # longer lossless: the acceptance test assumes the draft was drawn from q itself).
            conf = _top_prob(row) if settings.greedy else float(dist.probs[0])
            if i > 0 and conf < self.p_min:
                break
            tok = dist.top if settings.greedy else dist.sample(rng)
            draft.tokens.append(tok)
            draft.q.append(None if settings.greedy else dist)
            draft.sources.append(FROM_MODEL)
            history.append(tok)
            if i + 1 < k:
                row = np.array(self.ctx.decode([tok])[-1], copy=True)
                self._cached.append(tok)
                self._next_row = row
                draft.model_steps += 1
        draft.model_seconds = time.perf_counter() - t0
        draft.model_steps = max(draft.model_steps, 1)
        return draft


def _top_prob(row: npt.NDArray[np.float32]) -> float:
    m = float(row.max())
    return float(1.0 / np.exp(row - m, dtype=np.float32).sum(dtype=np.float64))


class StackedDrafter:
    """N-gram first (free), the model drafter fills what is left of the depth."""

    def __init__(self, ngram: NGramDrafter | None, model: ModelDrafter | None) -> None:
        self.ngram = ngram
        self.model = model

    def reset(self) -> None:
        if self.ngram:
            self.ngram.reset()
        if self.model:
            self.model.reset()
