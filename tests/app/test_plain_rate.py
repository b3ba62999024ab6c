""""N× the plain rate" divides by the answer's own one-token passes (issue 38, item 2): an adaptive answer that
drafts pass after pass takes a plain pass every PLAIN_PASS_EVERY, and its plain rate is those passes' own, timed
as its decode window is. Checked on the passes' own clocks, never against a speed."""

from __future__ import annotations

from itertools import groupby, pairwise
from pathlib import Path
from typing import Any

import pytest

from app.engine.adaptive import DepthController
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.speculative import MIN_PLAIN_PASSES, PLAIN_PASS_EVERY, RunTotals, SpeculativeDecoder, StopReason
from app.engine.suffix_tree import SuffixDrafter
from app.events import PassStats
from app.params import K_MAX, MAX_BIAS, NGRAM_KEY_LENGTH, SamplingSettings


def answer(path: Path, *, fixed: int | None = None, tokens: int = 1200) -> tuple[list[PassStats], RunTotals]:
    init_backend(None)
    model = Model(path, n_gpu_layers=0)
    ctx = Context(model, ContextParams(n_ctx=2048, n_batch=64, n_threads=1))
    try:
        decoder = SpeculativeDecoder(model, ctx, ngram=SuffixDrafter(NGRAM_KEY_LENGTH),
                                     controller=DepthController(k_max=K_MAX, fixed=fixed))
        # No end token: the answer runs its whole length (the bigram model's greedy text is a cycle by then).
        never_end = tuple((t, -MAX_BIAS) for t in range(model.n_vocab) if model.is_eog(t))
        sampling = SamplingSettings(temperature=0.0, max_tokens=tokens, logit_bias=never_end).validate()
        totals = RunTotals()
        events = list(decoder.generate(model.tokenize("abcab", add_special=True), sampling, totals=totals,
                                       stop=StopReason()))
    finally:
        ctx.close()
        model.close()
    return [e for e in events if isinstance(e, PassStats)], totals


def own_plain_rate(passes: list[PassStats]) -> float:
    """One-token passes after the first, each from the emission before it to its own, less its proposal."""
    seconds = [p.t_emitted - before.t_emitted - p.draft_seconds
               for before, p in pairwise(passes) if p.verify_width == 1 and p.emitted == 1]
    assert len(seconds) >= MIN_PLAIN_PASSES
    return len(seconds) / sum(seconds)


def test_a_copying_answer_takes_a_plain_pass_among_its_drafts_and_divides_by_those(tiny_model_factory: Any) -> None:
    # The next token depends on the last one alone, so greedy text cycles and the suffix drafter copies it.
    passes, totals = answer(tiny_model_factory(bigram=True))
    drafting_runs = [len(list(run)) for drafts, run in groupby(passes, key=lambda p: p.k > 0) if drafts]
    assert sum(drafting_runs) >= 2 * PLAIN_PASS_EVERY  # it copied
    assert max(drafting_runs) <= PLAIN_PASS_EVERY
    stats = totals.summary(totals.plain_rate())
    assert stats.accepted > 0
    assert stats.plain_tps == pytest.approx(own_plain_rate(passes), rel=1e-9)
    assert stats.speedup_estimate == pytest.approx(stats.decode_tps / stats.plain_tps, rel=1e-9)


def test_a_fixed_depth_is_kept_and_a_plain_answer_is_its_own_plain_rate(tiny_model_factory: Any) -> None:
    path = tiny_model_factory(bigram=True)
    passes, _ = answer(path, fixed=3, tokens=400)
    drafting_runs = [len(list(run)) for drafts, run in groupby(passes, key=lambda p: p.k == 3) if drafts]
    assert max(drafting_runs) > 2 * PLAIN_PASS_EVERY  # a depth the user fixed is not interrupted
    passes, totals = answer(path, fixed=0, tokens=60)
    stats = totals.summary(totals.plain_rate())
    assert stats.plain_tps == pytest.approx(own_plain_rate(passes), rel=1e-9)
    assert stats.speedup_estimate == 0.0  # nothing accepted: no ratio


def test_too_few_plain_passes_give_no_plain_rate_and_no_ratio() -> None:
    totals = RunTotals(tokens=40, passes=5, accepted=30, first_pass_tokens=1, t_first_token=1.0, t_last_token=2.0)
    for _ in range(MIN_PLAIN_PASSES - 1):
        totals.add_plain_pass(0.01)
    assert totals.plain_rate() is None
    assert totals.summary(totals.plain_rate()).speedup_estimate == 0.0
    totals.add_plain_pass(0.01)
    assert totals.plain_rate() == pytest.approx(100.0)
