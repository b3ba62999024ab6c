"""Drafters propose tokens for the target to verify.

``NGramDrafter`` looks the last n tokens up in a map of what followed them earlier (prompt and output);
``ModelDrafter`` runs a small GGUF with the same vocabulary in its own context. The decoder lets the
free n-gram draft go first and the model fill the rest.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from app.engine import sampling
from app.engine.params import SamplingSettings
from app.engine.sampling import Dist
from app.events import FROM_MODEL, FROM_NGRAM

if TYPE_CHECKING:  # the n-gram drafter is plain Python; only the model drafter drives llama.cpp
    from app.engine.llama import Context, Model


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    q: list[Dist | None] = field(default_factory=list)  # None: a point mass (q(x) = 1)
    sources: list[str] = field(default_factory=list)
    model_seconds: float = 0.0
    model_steps: int = 0
    match_len: int = 0  # n-gram drafts: how many tokens before the draft matched the source

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, other: Draft) -> None:
        self.tokens += other.tokens
        self.q += other.q
        self.sources += other.sources
        self.model_seconds += other.model_seconds
        self.model_steps += other.model_steps


class NGramDrafter:
    """Maps from the last m tokens (m = n down to 1) to where their continuations start.

    The longest key that matches wins; among its recent occurrences, the one whose match reaches furthest
    back is followed (in a copy, that is the spot being copied, not the latest place a common phrase
    appeared). The draft reports that reach (``match_len``): a long exact match means a copy in progress,
    where drafts are reliable.

    Earlier contexts (a chat before the current one, its answers included) stay in a bounded pool, as in
    SuffixDecoding. Where the pool matches a longer key than the current context does, the draft follows
    the pool's most frequent continuation token by token, and stops where the product of those frequencies
    (the estimated chance that the draft is still right) falls below POOL_MIN_PROB. ``reset`` empties the
    pool too, so runs that start from a reset (the bench's) never draft from each other.
    """

    MATCH_CAP = 64
    OCCURRENCES = 8  # recent occurrences kept per key
    POOL_TOKENS = 1 << 16  # tokens of earlier contexts kept (the oldest contexts go first)
    POOL_OCCURRENCES = 32  # occurrences kept per key in the pool: the frequencies come from these
    POOL_MIN_KEY = 2  # one token says too little about which earlier context is being repeated
    POOL_MIN_PROB = 0.3

    def __init__(self, n: int = 3, min_n: int = 1) -> None:
        self.n = n
        self.min_n = max(1, min(min_n, n))
        self._maps: dict[int, dict[tuple[int, ...], list[int]]] = {m: {} for m in range(self.min_n, n + 1)}
        self._tokens: list[int] = []
        self._pool: list[list[int]] = []
        self._pool_maps: dict[int, dict[tuple[int, ...], list[tuple[int, int]]]] = {}

    def reset(self) -> None:
        """Forget everything, the pool of earlier contexts included."""
        self._forget_context()
        self._pool = []
        self._pool_maps = {}

    def _forget_context(self) -> None:
        for table in self._maps.values():
            table.clear()
        self._tokens = []

    def observe(self, tokens: Sequence[int]) -> None:
        """Bring the maps up to date with ``tokens`` (the whole sequence so far). A rewrite starts them over
        and moves the old context to the pool."""
        known = self._tokens
        if len(tokens) < len(known) or list(tokens[: len(known)]) != known:
            self._remember(known)
            self._forget_context()
            known = self._tokens
        seq = list(tokens)
        for m, table in self._maps.items():
            for i in range(max(len(known), m), len(seq)):
                spots = table.setdefault(tuple(seq[i - m : i]), [])
                spots.append(i)
                if len(spots) > self.OCCURRENCES:
                    del spots[0]
        self._tokens = seq

    def _remember(self, seq: list[int]) -> None:
        """Keep a finished context in the pool; past POOL_TOKENS the oldest go (and the index is rebuilt)."""
        if len(seq) <= self.POOL_MIN_KEY:
            return
        self._pool.append(seq[-self.POOL_TOKENS :])
        if sum(len(s) for s in self._pool) <= self.POOL_TOKENS:
            self._index(len(self._pool) - 1)
            return
        # Down to half the budget at once: the index is rebuilt once per half-budget of new tokens, not at
        # every context (a full pool otherwise costs a whole rebuild per answer).
        while len(self._pool) > 1 and sum(len(s) for s in self._pool) > self.POOL_TOKENS // 2:
            del self._pool[0]
        self._pool_maps = {}
        for doc in range(len(self._pool)):
            self._index(doc)

    def _index(self, doc: int) -> None:
        tokens = self._pool[doc]
        for m in range(max(self.POOL_MIN_KEY, self.min_n), self.n + 1):
            table = self._pool_maps.setdefault(m, {})
            for i in range(m, len(tokens)):
                spots = table.setdefault(tuple(tokens[i - m : i]), [])
                spots.append((doc, i))
                if len(spots) > self.POOL_OCCURRENCES:
                    del spots[0]

    def _reach(self, start: int, m: int) -> int:
        """How many tokens before ``start`` equal the ones before the current end (at least the key)."""
        seq, reach = self._tokens, m
        while reach < self.MATCH_CAP and start - reach - 1 >= 0 and seq[start - reach - 1] == seq[-reach - 1]:
            reach += 1
        return reach

    def _pool_draft(self, k: int, longer_than: int) -> Draft | None:
        """A draft from the pool when it matches a key longer than ``longer_than`` tokens, else None."""
        seq = self._tokens
        for m in range(min(self.n, len(seq)), max(self.POOL_MIN_KEY, self.min_n, longer_than + 1) - 1, -1):
            live = self._pool_maps.get(m, {}).get(tuple(seq[-m:]))
            if not live:
                continue
            tokens: list[int] = []
            chance = 1.0
            while len(tokens) < k and live:
                j = len(tokens)
                counts = Counter(self._pool[d][i + j] for d, i in live if i + j < len(self._pool[d]))
                if not counts:
                    break
                tok, count = counts.most_common(1)[0]
                chance *= count / sum(counts.values())
                if chance < self.POOL_MIN_PROB:
                    break
                tokens.append(tok)
                live = [(d, i) for d, i in live if i + j < len(self._pool[d]) and self._pool[d][i + j] == tok]
            if not tokens:
                return None
            return Draft(tokens=tokens, q=[None] * len(tokens), sources=[FROM_NGRAM] * len(tokens), match_len=m)
        return None

    def propose(self, tokens: Sequence[int], k: int) -> Draft:
        self.observe(tokens)
        seq = self._tokens
        if k <= 0:
            return Draft()
        best: tuple[int, int] | None = None  # (reach, start)
        for m in range(min(self.n, len(seq)), self.min_n - 1, -1):
            spots = self._maps[m].get(tuple(seq[-m:]))
            if spots:
                best = max((self._reach(i, m), i) for i in spots)
                break
        pooled = self._pool_draft(k, best[0] if best else 0) if self._pool else None
        if pooled is not None or best is None:
            return pooled or Draft()
        reach, start = best
        cont = list(seq[start : start + k])
        period = len(seq) - start
        if reach >= period:
            # The text repeats with this period (at least one whole period matched): past the end of what
            # is known the continuation goes on with itself, so "aye, aye, ..." is drafted to full
            # depth instead of being cut where the text ends.
            while len(cont) < k:
                cont.append(cont[len(cont) - period])
        return Draft(tokens=cont, q=[None] * len(cont), sources=[FROM_NGRAM] * len(cont), match_len=reach)


MAX_STEP_CATCH_UP = 32  # a catch-up this long or shorter costs about one drafter step; longer is a prefill


class ModelDrafter:
    """A small GGUF drafter with its own KV cache. Greedy targets get top-1 drafts; sampling targets get
    drafts sampled from q, with q kept for the acceptance test. Stops early when its confidence is low."""

    def __init__(self, model: Model, ctx: Context, p_min: float = 0.1) -> None:
        self.model = model
        self.ctx = ctx
        self.p_min = p_min
        self._next_row: npt.NDArray[np.float32] | None = None  # logits after ctx.tokens (copied)

    def reset(self) -> None:
        self.ctx.clear()
        self._next_row = None

    def prefill(self, tokens: Sequence[int]) -> int:
        """Bring the cache up to ``tokens`` (the prompt, while the target prefills it); how many it read."""
        return self._sync(tokens) if tokens else 0

    def _sync(self, tokens: Sequence[int]) -> int:
        """Roll back to the common prefix with ``tokens`` and decode what is missing (catch-up).

        Returns how many tokens the catch-up decoded (0: none was needed).
        """
        common = self.ctx.common_prefix(tokens)
        if common == len(tokens) == self.ctx.n_past and self._next_row is not None:
            return 0
        if common == len(tokens):  # the whole context is cached but we need its last logits again
            common -= 1
        self.ctx.truncate(common)
        if common == 0:
            self.ctx.clear()
        row = self.ctx.prefill(list(tokens[common:]))
        self._next_row = np.array(row[-1], copy=True)
        return len(tokens) - common

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
        t_sync = time.perf_counter()
        caught_up = self._sync(tokens)
        prefill_seconds = 0.0
        if caught_up > MAX_STEP_CATCH_UP:
            # A long catch-up (a probe after many passes at k = 0, or a prompt not read by `prefill`) is not
            # a drafter step: counted as one, a 200-token catch-up made a step look like 28 target passes.
            prefill_seconds = time.perf_counter() - t_sync
        elif caught_up:
            draft.model_steps += 1  # the few tokens of the last pass, in one batch: about one step
        row = self._next_row
        assert row is not None
        self.ctx.prepare_rollback(k - 1, 1)  # a recurrent drafter's state, before its steps
        history = list(recent) if recent is not None else []
        for i in range(k):
            recent_arr = np.array(history[-settings.repeat_last_n :], dtype=np.int64) if history else None
            dist = sampling.distribution(row, settings, recent_arr)
            # Decide to stop before sampling, from the row alone: stopping on the probability of the token
            # just sampled would drop unlikely draws and skew the output towards confident tokens (no
            # longer lossless: the acceptance test assumes the draft was drawn from q itself).
            conf = _top_prob(row) if settings.greedy else float(dist.probs.max())
            if i > 0 and conf < self.p_min:
                break
            tok = dist.top if settings.greedy else dist.sample(rng)
            draft.tokens.append(tok)
            draft.q.append(None if settings.greedy else dist)
            draft.sources.append(FROM_MODEL)
            history.append(tok)
            if i + 1 < k:
                row = np.array(self.ctx.decode([tok])[-1], copy=True)
                self._next_row = row
                draft.model_steps += 1
        draft.model_seconds = time.perf_counter() - t0 - prefill_seconds
        return draft


def _top_prob(row: npt.NDArray[np.float32]) -> float:
    m = float(row.max())
    return float(1.0 / np.exp(row - m, dtype=np.float32).sum(dtype=np.float64))
