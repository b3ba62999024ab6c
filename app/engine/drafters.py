"""Drafters propose tokens for the target to verify.

``SuffixDrafter`` (app.engine.suffix_tree) follows what came after the longest matches of the context's end
in the prompt, the answer so far and earlier answers; ``ModelDrafter`` runs a small GGUF with the same
vocabulary in its own context. The decoder lets the free suffix draft go first and the model fill the rest.

Every drafter that runs a network (``ModelDrafter`` here; the target's MTP heads, EAGLE-3, DFlash and DSpark in
their own modules) meets ``TrainedDrafter``, which is all the loop and the session know of it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from app.engine import sampling
from app.engine.sampling import Dist
from app.events import FROM_MODEL
from app.params import SamplingSettings

if TYPE_CHECKING:  # only the model drafter drives llama.cpp
    from app.engine.llama import Context, Model


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    q: list[Dist | None] = field(default_factory=list)  # None: a point mass (q(x) = 1)
    sources: list[str] = field(default_factory=list)
    model_seconds: float = 0.0
    model_steps: int = 0
    match_len: int = 0  # suffix drafts: how many tokens before the draft matched the source
    # Suffix drafts: the chance that the draft is still right after each token, from the tree's counts (the
    # depth policy's prior per position); empty where the drafter gives none.
    probs: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, other: Draft) -> None:
        self.tokens += other.tokens
        self.q += other.q
        self.sources += other.sources
        self.probs += other.probs
        self.model_seconds += other.model_seconds
        self.model_steps += other.model_steps


class DraftContext(Protocol):
    """A drafter's own llama.cpp context, as the loop times one drafter step at load."""

    def clear(self) -> None: ...

    def decode(self, tokens: Sequence[int]) -> object: ...

    def synchronize(self) -> None: ...


class TrainedDrafter(Protocol):
    """The loop's second source of drafts, after the suffix drafter: anything with a network to run."""

    @property
    def ctx(self) -> DraftContext: ...

    @property
    def block_drafter(self) -> bool:
        """One step drafts a whole block (DFlash, DSpark): a step costs the same at any depth."""

    @property
    def keeps_recurrent_checkpoint(self) -> bool:
        """Drafts are taken back by copying a recurrent state (a recurrent draft model): memory to count."""

    def reset(self) -> None:
        """Forget everything read: the next answer starts from an empty cache."""

    def prefill(self, tokens: Sequence[int]) -> int:
        """Read the prompt while the target does; how many tokens were decoded for it."""

    def propose(self, tokens: Sequence[int], k: int, settings: SamplingSettings, rng: np.random.Generator,
                recent: npt.NDArray[np.int64] | None = None) -> Draft:
        """Up to ``k`` tokens after ``tokens`` (fewer where its confidence falls below its cut)."""

    def follow(self, on: bool) -> None:
        """Speculative answers (True) or plain ones (False) are next: a drafter that reads the target's own
        batches stops reading them for plain answers, so those cost what plain decoding costs."""


MAX_STEP_CATCH_UP = 32  # a catch-up this long or shorter costs about one drafter step; longer is a prefill


class ModelDrafter:
    """A small GGUF drafter with its own KV cache. Greedy targets get top-1 drafts; sampling targets get
    drafts sampled from q, with q kept for the acceptance test. Stops early when its confidence is low."""

    block_drafter = False

    def __init__(self, model: Model, ctx: Context, p_min: float = 0.1) -> None:
        self.model = model
        self.ctx = ctx
        self.p_min = p_min
        self._next_row: npt.NDArray[np.float32] | None = None  # logits after ctx.tokens (copied)

    @property
    def keeps_recurrent_checkpoint(self) -> bool:
        from app.engine.llama import ROLLBACK_KV

        return self.ctx.rollback != ROLLBACK_KV

    def follow(self, on: bool) -> None:
        """Nothing to do: it reads the answer through its own cache, at ``propose``."""

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
            tok = draft_step(draft, row, settings, rng, history, self.p_min if i > 0 else 0.0)
            if tok is None:
                break
            if i + 1 < k:
                row = np.array(self.ctx.decode([tok])[-1], copy=True)
                self._next_row = row
                draft.model_steps += 1
        draft.model_seconds = time.perf_counter() - t0 - prefill_seconds
        return draft


def draft_step(draft: Draft, row: npt.NDArray[np.float32], settings: SamplingSettings, rng: np.random.Generator,
               history: list[int], p_min: float) -> int | None:
    """Add one trained-drafter token from its logits ``row`` to ``draft`` (top-1 when greedy, else sampled from
    q, kept for the acceptance test); None, adding nothing, where the row's confidence is below ``p_min``.

    The stop is decided before sampling, from the row alone: stopping on the probability of the token just
    sampled would drop unlikely draws and skew the output towards confident tokens (no longer lossless: the
    acceptance test assumes the draft was drawn from q itself).
    """
    recent = np.array(history[-settings.repeat_last_n :], dtype=np.int64) if history else None
    dist = sampling.distribution(row, settings, recent)
    if p_min > 0 and (_top_prob(row) if settings.greedy else float(dist.probs.max())) < p_min:
        return None
    tok = dist.top if settings.greedy else dist.sample(rng)
    draft.tokens.append(tok)
    draft.q.append(None if settings.greedy else dist)
    draft.sources.append(FROM_MODEL)
    history.append(tok)
    return tok


def _top_prob(row: npt.NDArray[np.float32]) -> float:
    """The softmax's largest probability. In place on one scratch array, summed in float32 (numpy's pairwise
    sum, about 1e-7 relative): half the time of the float64 sum over temporaries, once per drafted token."""
    shifted = np.subtract(row, row.max(), dtype=np.float32)
    np.exp(shifted, out=shifted)
    return float(1.0 / shifted.sum())
