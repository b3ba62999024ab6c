"""τ (tokens per pass) counts the end-of-turn token a pass yields: a pass always yields at least one token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
from app.events import PassStats, Token
from app.params import SamplingSettings


def test_a_pass_yielding_only_the_end_token_counts_one_token(tiny_model_factory: Any) -> None:
    path: Path = tiny_model_factory(ends_at_once=True)
    init_backend(None)
    model = Model(path, n_gpu_layers=0)
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=32, n_threads=1))
    try:
        decoder = SpeculativeDecoder(model, ctx)
        totals, stop = RunTotals(), StopReason()
        events = list(decoder.generate(model.tokenize("Hello", add_special=True),
                                       SamplingSettings(temperature=0.0, max_tokens=16), totals=totals, stop=stop))
    finally:
        ctx.close()
        model.close()
    passes = [e for e in events if isinstance(e, PassStats)]
    assert stop.reason == "eog"
    assert not [e for e in events if isinstance(e, Token) and e.token_ids]
    assert len(passes) == 1
    assert passes[0].emitted == 0
    assert passes[0].ended
    summary = totals.summary(None)
    assert summary.completion_tokens == 0
    assert summary.passes == 1
    assert summary.tokens_per_pass == 1.0
    assert summary.counts.tokens_per_pass == 1.0  # the bench sums these counts
