"""The prefill rate counts only the tokens actually prefilled: a prompt found in the KV cache (the same question
asked again, a Continue) is not "millions of tokens per second", and a partly cached one is rated on its new
part alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.session import EngineSession
from app.events import Finished, PromptProcessed
from app.params import DraftSettings, LoadSettings, SamplingSettings

GREEDY = SamplingSettings(temperature=0.0, max_tokens=4)


def _run(session: EngineSession, messages: list[dict[str, str]]) -> tuple[Finished, PromptProcessed]:
    events = list(session.generate(1, messages, GREEDY))
    finished = events[-1]
    processed = next(e for e in events if isinstance(e, PromptProcessed))
    assert isinstance(finished, Finished)
    return finished, processed


def test_a_cached_prompt_has_no_prefill_rate_and_a_partly_cached_one_counts_its_new_tokens(
    tiny_target: Path,
) -> None:
    session = EngineSession(LoadSettings(str(tiny_target), DraftSettings(ngram=0), n_ctx=512, n_threads=1))
    try:
        chat = [{"role": "user", "content": "Tell me about the sea and the sky, please."}]
        tokens, _ = session.prompt_tokens(chat)
        first, processed = _run(session, chat)
        # An empty cache: every prompt token but the last (which the first pass decodes) was prefilled.
        assert first.stats.prefill_tps * processed.seconds == pytest.approx(len(tokens) - 1)

        again, _ = _run(session, chat)  # the same prompt: all of it is in the cache
        assert again.stats.prefill_tps == 0.0  # shown as "prefill cached", never as a huge rate

        longer = [*chat, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "And more?"}]
        tokens, _ = session.prompt_tokens(longer)
        cached = session.decoder.ctx.common_prefix(tokens[:-1])
        assert 0 < cached < len(tokens) - 1
        partly, processed = _run(session, longer)
        assert partly.stats.prompt_tokens == len(tokens)
        assert partly.stats.prefill_tps * processed.seconds == pytest.approx(len(tokens) - 1 - cached)
    finally:
        session.close()
