"""Findings of the engine review, each pinned by a test that failed before its fix: the KV-cache record lives on
the shared Context, the drafter's catch-up decode counts as a step, a pass's cost includes building the
distributions it accepts from, greedy n-gram decoding probes, the decode rate counts tokens and time over
one window, and the engine's KV bytes are what llama.cpp allocates."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.adaptive import PROBE_K, CostModel, DepthController
from app.engine.drafters import MAX_STEP_CATCH_UP, ModelDrafter
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.session import EngineSession
from app.engine.speculative import RunTotals, SpeculativeDecoder
from app.engine.suffix_tree import SuffixDrafter
from app.events import PassStats, Token
from app.params import DraftSettings, LoadSettings, SamplingSettings

PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1)
GREEDY = SamplingSettings(temperature=0.0, max_tokens=40)
MIB = 1024 * 1024


class Tiny:
    def __init__(self, target: Path, same: Path) -> None:
        init_backend(None)
        self.target = Model(target, n_gpu_layers=0)
        self.drafter = Model(same, n_gpu_layers=0)
        self.ctx = Context(self.target, PARAMS)
        self.draft_ctx = Context(self.drafter, PARAMS)

    def tokens(self, text: str) -> list[int]:
        return self.target.tokenize(text, add_special=True)

    def close(self) -> None:
        self.ctx.close()
        self.draft_ctx.close()
        self.drafter.close()
        self.target.close()


@pytest.fixture(scope="module")
def tiny(tiny_target: Path, tiny_drafter_same: Path) -> Iterator[Tiny]:
    t = Tiny(tiny_target, tiny_drafter_same)
    yield t
    t.close()


def answer(decoder: SpeculativeDecoder, prompt: list[int], settings: SamplingSettings = GREEDY) -> list[int]:
    return [t for e in decoder.generate(prompt, settings) if isinstance(e, Token) for t in e.token_ids]


def test_the_context_records_its_cached_tokens(tiny: Tiny) -> None:
    ctx = tiny.ctx
    ctx.clear()
    ctx.prefill([5, 6, 7, 8])
    ctx.decode([9, 10], all_logits=True)
    assert ctx.tokens == [5, 6, 7, 8, 9, 10]
    assert ctx.n_past == 6
    ctx.truncate(3)
    assert ctx.tokens == [5, 6, 7]
    assert ctx.common_prefix([5, 6, 1, 2]) == 2
    ctx.reuse_prefix([5, 6, 1, 2])
    assert ctx.tokens == [5, 6]
    ctx.clear()
    assert ctx.tokens == []
    assert ctx.n_past == 0


def test_two_decoders_on_one_context_never_reuse_each_others_cache(tiny: Tiny) -> None:
    """A session's speculative and plain decoders share the target context. One answers a chat, the other
    writes a different one into the cache, then the first continues its chat: its answer must equal the
    answer from an empty cache (the prefix it remembers is no longer there)."""
    first = SpeculativeDecoder(tiny.target, tiny.ctx, ngram=SuffixDrafter(2),
                               controller=DepthController(k_max=4, fixed=3))
    second = SpeculativeDecoder(tiny.target, tiny.ctx)
    chat = tiny.tokens("The cat sat on the mat, and then the cat")
    first.reset_cache()
    reply = answer(first, chat)
    answer(second, tiny.tokens("Something else entirely: 1 2 3 4 5 6 7 8 9"))
    follow_up = chat + reply + tiny.target.tokenize(" and the dog")
    continued = answer(first, follow_up)
    first.reset_cache()
    assert continued == answer(first, follow_up)


def test_the_drafters_catch_up_decode_counts_as_a_step(tiny: Tiny) -> None:
    drafter = ModelDrafter(tiny.drafter, tiny.draft_ctx, p_min=0.0)
    drafter.reset()
    prompt = tiny.tokens("Hello there, the quick brown fox")
    greedy = SamplingSettings(temperature=0.0)
    rng = np.random.default_rng(0)
    draft = drafter.propose(prompt, 3, greedy, rng)
    # One catch-up decode (the prompt) gives the first token's row, two one-token decodes the other two.
    assert len(draft) == 3
    assert draft.model_steps == 3
    assert tiny.draft_ctx.n_past == len(prompt) + 2
    # Nothing to catch up on: the rows are cached, so only the draft's own decodes count.
    again = drafter.propose(prompt + draft.tokens[:2], 2, greedy, rng)
    assert again.model_steps == 1


def test_the_drafters_prompt_prefill_is_not_a_drafter_step(tiny: Tiny) -> None:
    """A prompt-long catch-up counted as one step made c look like 28 on the F16/Q4_1 pair: the policy then
    never drafted with the model again. The prompt's prefill is left out of the step cost."""
    drafter = ModelDrafter(tiny.drafter, tiny.draft_ctx, p_min=0.0)
    drafter.reset()
    prompt = tiny.tokens(" ".join(["the quick brown fox jumps over the lazy dog"] * 8))
    assert len(prompt) > MAX_STEP_CATCH_UP
    greedy = SamplingSettings(temperature=0.0)
    draft = drafter.propose(prompt, 3, greedy, np.random.default_rng(0))
    assert len(draft) == 3
    assert draft.model_steps == 2  # the two one-token decodes; the prefill is not one
    assert tiny.draft_ctx.n_past == len(prompt) + 2
    again = drafter.propose(prompt + draft.tokens, 2, greedy, np.random.default_rng(0))
    assert again.model_steps == 2  # a short catch-up (the last token) is a step, and one decode


class RecordingCost(CostModel):
    def __init__(self) -> None:
        super().__init__()
        self.verify_seen: list[tuple[int, float]] = []

    def observe_verify(self, width: int, seconds: float) -> None:
        self.verify_seen.append((width, seconds))
        super().observe_verify(width, seconds)


def test_a_pass_costs_its_decode_and_its_acceptance(tiny: Tiny) -> None:
    drafter = ModelDrafter(tiny.drafter, tiny.draft_ctx, p_min=0.0)
    cost = RecordingCost()
    decoder = SpeculativeDecoder(tiny.target, tiny.ctx, drafter=drafter,
                                 controller=DepthController(k_max=4, fixed=3, cost=cost))
    decoder.reset_cache()
    sampled = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3, max_tokens=30)
    passes = [e for e in decoder.generate(tiny.tokens("Hello there"), sampled) if isinstance(e, PassStats)]
    assert passes
    assert all(p.accept_seconds > 0 for p in passes)
    assert len(cost.verify_seen) == len(passes)
    for p, (width, seconds) in zip(passes, cost.verify_seen, strict=True):
        assert width == p.verify_width
        assert seconds == pytest.approx(p.verify_seconds + p.accept_seconds, rel=1e-9, abs=1e-12)


def test_greedy_ngram_decoding_probes_when_it_does_not_draft(tiny: Tiny) -> None:
    """Greedy n-gram proposals are scored without drafting, so acceptance needs no probes; the cost of a
    wide pass does. With rates that never justify a draft, probes still come, at PROBE_K."""
    controller = DepthController(k_max=4)
    for width in range(1, 6):
        for _ in range(controller.cost.WINDOW):
            controller.cost.observe_verify(width, 0.010 * (1 + 0.5 * (width - 1)))
    controller.cost.observe_verify = lambda width, seconds: None  # type: ignore[method-assign]
    for bucket in controller.ngram_buckets:
        bucket.rates = [0.0] * 4
        bucket.seen = [100] * 4
    controller.score_proposal = lambda *args: None  # type: ignore[method-assign]
    decoder = SpeculativeDecoder(tiny.target, tiny.ctx, ngram=SuffixDrafter(1), controller=controller)
    decoder.reset_cache()
    ks = [e.k for e in decoder.generate(tiny.tokens("one two three, one two three, one two"),
                                        SamplingSettings(temperature=0.0, max_tokens=200))
          if isinstance(e, PassStats)]
    assert PROBE_K in ks
    assert set(ks) <= {0, PROBE_K}
    assert ks.count(PROBE_K) <= len(ks) // 10


def test_decode_rate_counts_tokens_and_time_over_one_window() -> None:
    """The first pass (it ends at the first token) emitted 5 tokens; 5 more came in the next second."""
    totals = RunTotals(t_request=0.0, t_first_token=1.0, t_last_token=2.0, first_pass_tokens=5, tokens=10,
                       passes=6)
    stats = totals.summary(plain_tps=None)
    assert stats.decode_tps == pytest.approx(5.0)  # not 9 tokens in that second
    assert stats.decode_tokens == 5
    plain = RunTotals(t_request=0.0, t_first_token=1.0, t_last_token=2.0, first_pass_tokens=1, tokens=6,
                      passes=6)
    assert plain.summary(plain_tps=None).decode_tps == pytest.approx(5.0)


@pytest.mark.demo
@pytest.mark.parametrize("which", [0, 1], ids=["smollm2", "gemma"])
def test_the_engines_kv_bytes_are_what_llama_cpp_allocates(demo_models: tuple[Path, Path], which: int) -> None:
    path = demo_models[which]
    lines: list[str] = []
    settings = LoadSettings(str(path), DraftSettings(ngram=0), n_ctx=1024, n_threads=1)
    session = EngineSession(settings, log=lines.append)
    try:
        loaded = session.loaded_event()
    finally:
        session.close()
        init_backend(None)
    sizes = re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", "".join(lines))
    assert sizes, "no KV cache size in llama.cpp's log"
    allocated = sum(float(s) for s in sizes) * MIB
    assert loaded.kv_bytes_total == pytest.approx(allocated, rel=0.05)
    assert loaded.kv_bytes_per_token * loaded.n_ctx == pytest.approx(allocated, rel=0.05)
