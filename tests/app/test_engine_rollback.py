"""After speculation with accepts and rejects, the KV caches hold exactly the emitted tokens.

The check is behavioural: the logits of the next position from the speculative context equal those of a
fresh context that decoded the same tokens. Their tolerance is the measured numeric floor (two fresh
contexts that decoded the same tokens in different batch shapes), and a control shows that one stale token
left in the cache moves the logits far beyond it, so the comparison can tell.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from app.engine.adaptive import DepthController
from app.engine.drafters import ModelDrafter
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.speculative import SpeculativeDecoder, StopReason
from app.events import PassStats, Token
from app.params import SamplingSettings

PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1)
PROMPT = "The cat sat on the mat, and then the cat"
F64 = npt.NDArray[np.float64]


class Pair:
    def __init__(self, target: Path, drafter: Path) -> None:
        init_backend(None)
        self.target = Model(target, n_gpu_layers=0)
        self.drafter_model = Model(drafter, n_gpu_layers=0)
        self.ctx = Context(self.target, PARAMS)
        self.draft_ctx = Context(self.drafter_model, PARAMS)
        self.fresh_ctx = Context(self.target, PARAMS)
        self.fresh_draft_ctx = Context(self.drafter_model, PARAMS)

    def decoder(self, k: int = 4) -> SpeculativeDecoder:
        drafter = ModelDrafter(self.drafter_model, self.draft_ctx, p_min=0.0)
        return SpeculativeDecoder(self.target, self.ctx, drafter=drafter, controller=DepthController(8, fixed=k))

    def close(self) -> None:
        for ctx in (self.ctx, self.draft_ctx, self.fresh_ctx, self.fresh_draft_ctx):
            ctx.close()
        self.drafter_model.close()
        self.target.close()


@pytest.fixture(scope="module")
def pair(tiny_target: Path, tiny_drafter_perturbed: Path) -> Iterator[Pair]:
    p = Pair(tiny_target, tiny_drafter_perturbed)
    yield p
    p.close()


def next_logits(ctx: Context, cached: list[int], last: int) -> F64:
    """Logits after ``last`` on a context whose cache holds ``cached`` (decoded here when ``ctx`` is empty)."""
    if ctx.n_past == 0 and cached:
        ctx.prefill(cached)
    assert ctx.n_past == len(cached)
    return np.array(ctx.decode([last])[-1], dtype=np.float64)


def numeric_floor(ctx: Context, tokens: list[int]) -> float:
    """Largest logit difference between honest ways of caching ``tokens[:-1]`` on this machine's kernels:
    in batches as large as the context takes, one by one, and in chunks of the widths a speculative run
    decodes (a pass of k + 1)."""
    rows = []
    for chunk in (ctx.n_batch, 1, 2, 3, 5):
        ctx.clear()
        for start in range(0, len(tokens) - 1, chunk):
            ctx.decode(tokens[start : min(start + chunk, len(tokens) - 1)])
        rows.append(np.array(ctx.decode([tokens[-1]])[-1], dtype=np.float64))
    ctx.clear()
    return max(float(np.abs(a - b).max()) for a in rows for b in rows)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_kv_holds_exactly_the_emitted_tokens(pair: Pair, temperature: float) -> None:
    prompt = pair.target.tokenize(PROMPT, add_special=True)
    decoder = pair.decoder(k=4)
    decoder.reset_cache()
    settings = SamplingSettings(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=60)
    out: list[int] = []
    accepts = rejects = 0
    stop = StopReason()
    for event in decoder.generate(prompt, settings, stop=stop):
        if isinstance(event, Token):
            out += event.token_ids
        elif isinstance(event, PassStats):
            accepts += sum(event.accepted)
            rejects += event.accepted.count(False)
            # After every pass the cache holds everything but the newest token (which the next pass decodes).
            if len(out) < settings.max_tokens:
                assert event.context_tokens == len(prompt) + len(out) - 1
    assert stop.reason == "max_tokens"
    assert accepts > 5
    assert rejects > 5
    tokens = prompt + out
    ctx = pair.ctx
    assert ctx.n_past == len(tokens) - 1

    spec = next_logits(ctx, tokens[:-1], tokens[-1])
    pair.fresh_ctx.clear()
    fresh = next_logits(pair.fresh_ctx, tokens[:-1], tokens[-1])
    floor = numeric_floor(pair.fresh_ctx, tokens)
    tol = 2 * floor + 1e-4
    assert np.allclose(spec, fresh, rtol=0, atol=tol), np.abs(spec - fresh).max()

    # Control: one rejected draft token left behind in the cache moves the logits far beyond that tolerance.
    pair.fresh_ctx.clear()
    pair.fresh_ctx.prefill([*tokens[:-1], (tokens[-1] + 1) % pair.target.n_vocab])
    pair.fresh_ctx.truncate(len(tokens))  # no-op: the stale token stays
    stale = np.array(pair.fresh_ctx.decode([tokens[-1]])[-1], dtype=np.float64)
    pair.fresh_ctx.clear()
    assert np.abs(stale - fresh).max() > 10 * tol

    # The drafter's cache, after it catches up on the final text, matches a fresh drafter context too, within
    # the drafter's own floor (its weights differ from the target's, and so does its rounding).
    drafter = decoder.drafter
    assert drafter is not None
    drafter._sync(tokens)
    assert drafter.ctx.tokens == tokens
    assert drafter._next_row is not None
    pair.fresh_draft_ctx.clear()
    fresh_draft = np.array(pair.fresh_draft_ctx.prefill(tokens)[-1], dtype=np.float64)
    draft_tol = 2 * numeric_floor(pair.fresh_draft_ctx, tokens) + 1e-4
    assert np.allclose(drafter._next_row, fresh_draft, rtol=0, atol=draft_tol), \
        (np.abs(drafter._next_row - fresh_draft).max(), draft_tol)


def test_truncate_then_decode_equals_fresh(pair: Pair) -> None:
    """Context.truncate drops exactly the tail: A + B, back to A, then C, is A + C."""
    a = pair.target.tokenize("first part of the text", add_special=True)
    b = pair.target.tokenize(" which will be thrown away")
    c = pair.target.tokenize(" and this is kept")
    ctx = pair.fresh_ctx
    ctx.clear()
    ctx.prefill(a + b)
    ctx.truncate(len(a))
    assert ctx.n_past == len(a)
    rolled = np.array(ctx.prefill(c)[-1], dtype=np.float64)
    ctx.clear()
    fresh = np.array(ctx.prefill(a + c)[-1], dtype=np.float64)
    ctx.clear()
    floor = numeric_floor(ctx, a + c)
    assert np.allclose(rolled, fresh, rtol=0, atol=2 * floor + 1e-4)


def test_second_turn_reuses_the_cache_and_matches_a_fresh_run(pair: Pair) -> None:
    """A follow-up prompt that extends the first (an earlier turn of the same chat) keeps the shared prefix
    in the cache; its answer equals the answer of a run from an empty cache."""
    decoder = pair.decoder(k=3)
    greedy = SamplingSettings(temperature=0.0, max_tokens=40)

    def answer(prompt: list[int]) -> list[int]:
        return [t for e in decoder.generate(prompt, greedy) if isinstance(e, Token) for t in e.token_ids]

    first = pair.target.tokenize(PROMPT, add_special=True)
    decoder.reset_cache()
    reply = answer(first)
    second = first + reply + pair.target.tokenize(" and the dog")
    assert pair.ctx.n_past == len(first) + len(reply) - 1
    continued = answer(second)
    decoder.reset_cache()
    assert answer(second) == continued
