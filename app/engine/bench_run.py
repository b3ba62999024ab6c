"""The worker's side of `specdeck bench`: one timed answer (``BenchRun``) and a bare decode loop (``RawDecode``),
run inside the engine worker so that the pipe costs nothing in the timed window. The bench itself, which sends
these and reads the replies, is ``app.measure.bench``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from app.events import (
    BenchResult,
    BenchRun,
    Finished,
    MessageStats,
    PassStats,
    RawDecode,
    RawDecoded,
    Token,
    source_counts,
)

if TYPE_CHECKING:
    from app.engine.session import EngineSession


def bench_run(session: EngineSession, request: BenchRun) -> BenchResult:
    """One answer from an empty cache (so runs are comparable), with or without speculation."""
    decoder = session.plain_decoder if request.plain else session.decoder
    decoder.reset_cache()
    prompt, warning = session.prompt_tokens(request.messages)
    token_ids: list[int] = []
    text: list[str] = []
    overheads: list[float] = []
    passes: list[PassStats] = []
    stats: MessageStats | None = None
    reason = ""
    t0 = time.perf_counter()
    t_first = 0.0
    for event in session.generate(request.request_id, (), request.sampling, prompt=prompt, decoder=decoder):
        if isinstance(event, Token):
            if event.token_ids and not token_ids:
                t_first = time.perf_counter()
            token_ids += event.token_ids
            text.append(event.text)
        elif isinstance(event, PassStats):
            overheads.append(event.overhead_seconds)
            passes.append(event)
        elif isinstance(event, Finished):
            stats, reason = event.stats, event.reason
    seconds = time.perf_counter() - t0
    assert stats is not None  # session.generate always ends with Finished
    cost = session.decoder.controller.cost.widths
    return BenchResult(
        request_id=request.request_id, prompt_tokens=len(prompt), token_ids=tuple(token_ids), text="".join(text),
        reason=reason, stats=stats, seconds=seconds, ttft_seconds=t_first - t0 if t_first else 0.0,
        overhead_seconds=tuple(overheads), verify_cost=tuple(sorted(cost.items())), warning=warning,
        draft_step_seconds=session.decoder.controller.cost.draft_step, sources=source_counts(passes),
        prompt_ids=tuple(prompt),
    )


def raw_decode(session: EngineSession, request: RawDecode) -> RawDecoded:
    """Prefill ``request.messages`` as a chat prompt, or ``request.text`` (or the BOS token), then ``n_tokens``
    bare greedy one-token decodes."""
    model, ctx = session.target, session.ctx
    session.decoder.reset_cache()
    if request.messages:
        prompt, _warning = session.prompt_tokens(list(request.messages))
    elif request.text:
        prompt = model.tokenize(request.text, add_special=True, parse_special=True)
    else:
        prompt = [model.bos if model.bos >= 0 else 0]
    try:
        first = int(np.argmax(ctx.prefill(prompt)[-1]))
        done, seconds = ctx.greedy_loop(first, request.n_tokens)
    finally:
        session.decoder.reset_cache()
    return RawDecoded(request.request_id, len(prompt), done, seconds)
