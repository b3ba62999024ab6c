"""Recurrent and hybrid targets (Mamba, LFM2, Qwen3.5, Granite-4-H) load, answer and speculate losslessly.

A recurrent state cannot drop its last positions as a KV cache does. Rejected drafts are taken back with
llama.cpp's state snapshots where the architecture has them and their bounds hold (LFM2, Qwen3.5), else from a
checkpoint saved before the pass, and the accepted tokens are decoded again with the next batch (Mamba,
Granite-4-H). Every check compares against a fresh context that decoded the kept tokens, within the numeric
floor measured here between honest ways of decoding the same tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.ceiling.roofline import ModelShape, kv_bytes_per_token, recurrent_rollback
from app.engine.adaptive import DepthController
from app.engine.drafters import ModelDrafter
from app.engine.llama import (
    ROLLBACK_CHECKPOINTS,
    ROLLBACK_KV,
    ROLLBACK_SNAPSHOTS,
    Context,
    ContextParams,
    Model,
    init_backend,
)
from app.engine.session import EngineSession
from app.engine.speculative import RunTotals, SpeculativeDecoder
from app.engine.suffix_tree import SuffixDrafter
from app.events import Finished, PassStats, Token
from app.library.gguf_reader import read_gguf_info
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.app.test_engine_exactness import run as run_answer
from tests.gguf_fixtures import RECURRENT_ARCHS, attention_layers, write_tiny_model

SNAPSHOTS = 8
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1)
GREEDY = SamplingSettings(temperature=0.0, max_tokens=60)
PROMPTS = {
    "prose": "Hello there, the quick brown fox jumps over the lazy dog.",
    "repetitive": "one two three, one two three, one two three, one two",
}
EXPECTED_ROLLBACK = {"mamba": ROLLBACK_CHECKPOINTS, "lfm2": ROLLBACK_SNAPSHOTS, "qwen35": ROLLBACK_SNAPSHOTS,
                     "granitehybrid": ROLLBACK_CHECKPOINTS}


@pytest.fixture(scope="session")
def recurrent_models(tiny_models_dir: Path) -> dict[str, tuple[Path, Path, Path]]:
    """Per architecture: (target, the same weights as a drafter, a perturbed drafter), 4 layers each."""
    out = {}
    for arch in RECURRENT_ARCHS:
        target = write_tiny_model(tiny_models_dir / f"tiny-{arch}.gguf", arch=arch, n_layer=4, name=f"tiny-{arch}")
        same = write_tiny_model(tiny_models_dir / f"tiny-{arch}-same.gguf", arch=arch, n_layer=4)
        perturbed = write_tiny_model(tiny_models_dir / f"tiny-{arch}-perturbed.gguf", arch=arch, n_layer=4,
                                     perturb=0.05, perturb_seed=1)  # about 50 % greedy agreement
        out[arch] = (target, same, perturbed)
    return out


class Loaded:
    """A target with snapshots asked for, its drafters, and a fresh context to compare against."""

    def __init__(self, paths: tuple[Path, Path, Path]) -> None:
        init_backend(None)
        target, same, perturbed = paths
        self.target = Model(target, n_gpu_layers=0)
        self.ctx = Context(self.target, ContextParams(n_ctx=512, n_batch=64, n_threads=1, rs_snapshots=SNAPSHOTS))
        self.fresh = Context(self.target, PARAMS)
        self.drafters = {}
        for name, path in (("same", same), ("perturbed", perturbed)):
            model = Model(path, n_gpu_layers=0)
            self.drafters[name] = (model, Context(model, PARAMS))
        self.prompts = {name: self.target.tokenize(text, add_special=True) for name, text in PROMPTS.items()}

    def close(self) -> None:
        for model, ctx in self.drafters.values():
            ctx.close()
            model.close()
        self.ctx.close()
        self.fresh.close()
        self.target.close()


@pytest.fixture(scope="module", params=RECURRENT_ARCHS)
def loaded(request: pytest.FixtureRequest, recurrent_models: dict[str, tuple[Path, Path, Path]]) -> Iterator[Loaded]:
    lm = Loaded(recurrent_models[request.param])
    lm.arch = request.param  # type: ignore[attr-defined]
    yield lm
    lm.close()


def run(decoder: SpeculativeDecoder, prompt: list[int]) -> tuple[list[int], RunTotals]:
    answer = run_answer(decoder, prompt, GREEDY)
    assert answer.reason in ("max_tokens", "eog")
    return answer.tokens, answer.totals


def fresh_row(ctx: Context, tokens: list[int]) -> np.ndarray:
    ctx.clear()
    ctx.prefill(tokens[:-1])
    return np.array(ctx.decode([tokens[-1]])[-1], dtype=np.float64)


def numeric_floor(ctx: Context, tokens: list[int], *cuts: int) -> float:
    """The largest logit difference between honest ways of decoding ``tokens`` here (one batch, one token at
    a time, chunks of 3, and two batches cut at each of ``cuts``): rounding in this CPU's kernels, which a correct
    rollback may show too (it decodes the kept tokens in batches of other shapes)."""
    rows = []
    splits = [[(s, s + c) for s in range(0, len(tokens), c)] for c in (ctx.n_batch, 1, 3)]
    splits += [[(0, cut), (cut, len(tokens))] for cut in cuts]
    for ranges in splits:
        ctx.clear()
        for start, end in ranges:
            row = ctx.decode(tokens[start : min(end, len(tokens))])
        rows.append(np.array(row[-1], dtype=np.float64))
    ctx.clear()
    return max(float(np.abs(a - b).max()) for a in rows for b in rows)


def test_the_fixtures_are_what_they_claim(recurrent_models: dict[str, tuple[Path, Path, Path]]) -> None:
    init_backend(None)
    for arch, (target, _, _) in recurrent_models.items():
        info = read_gguf_info(target)
        assert info.architecture == arch
        layers = attention_layers(arch, 4)
        assert info.recurrent_layers == layers.count(False)
        model = Model(target, n_gpu_layers=0)
        try:
            assert model.is_recurrent
        finally:
            model.close()


def test_rollback_mechanism_follows_the_architecture(loaded: Loaded) -> None:
    arch = loaded.arch  # type: ignore[attr-defined]
    assert loaded.ctx.rollback == EXPECTED_ROLLBACK[arch]
    # llama.cpp keeps snapshots only for the architectures it lists; elsewhere it keeps none, silently.
    assert loaded.ctx.rs_snapshots == (SNAPSHOTS if EXPECTED_ROLLBACK[arch] == ROLLBACK_SNAPSHOTS else 0)
    assert loaded.ctx.recurrent_state_bytes() > 0


@pytest.mark.parametrize("width", [1, 2, 5, 9])
def test_state_after_a_rollback_equals_a_fresh_decode_of_the_kept_tokens(loaded: Loaded, width: int) -> None:
    """Decode ``width`` tokens after a prompt, keep 0, 1, several or all of them, then compare the next logits
    with a fresh context's. Covers snapshots within their bounds, a width-1 decode taken back whole (which a
    snapshot would get wrong), checkpoints, and the re-decode of the kept tokens."""
    prompt = loaded.prompts["prose"]
    extra = loaded.target.tokenize(" and the cat sat on the mat", add_special=False)[:width]
    assert len(extra) == width
    for keep in sorted({0, 1, width // 2, width - 1, width}):
        ctx = loaded.ctx
        ctx.clear()
        ctx.prefill(prompt)
        ctx.prepare_rollback(width, width)
        ctx.decode(extra, all_logits=True)
        ctx.truncate(len(prompt) + keep)
        assert ctx.n_past == len(prompt) + keep
        nxt = loaded.target.tokenize(" X", add_special=False)[0]
        kept = [*prompt, *extra[:keep], nxt]
        floor = numeric_floor(loaded.fresh, kept, len(prompt), len(kept) - 1)
        got = np.array(ctx.decode([nxt])[-1], dtype=np.float64)
        want = fresh_row(loaded.fresh, kept)
        diff = float(np.abs(got - want).max())
        assert diff <= floor + 1e-4, f"keep {keep} of {width}: logits differ by {diff} (floor {floor})"
        if keep < width:
            # The control: a state that kept one token too many is far off, so the comparison can tell.
            stale = fresh_row(loaded.fresh, [*prompt, *extra[: keep + 1], nxt])
            assert float(np.abs(stale - want).max()) > 10 * (floor + 1e-4)


def test_a_one_token_decode_taken_back_is_never_served_from_a_stale_snapshot(loaded: Loaded) -> None:
    """The case where llama.cpp's seq_rm returns true with a wrong state (width 1, roll back 1)."""
    prompt = loaded.prompts["prose"]
    ctx = loaded.ctx
    ctx.clear()
    ctx.prefill(prompt[:-2])
    ctx.decode([prompt[-2]])
    ctx.decode([prompt[-1]])
    ctx.truncate(len(prompt) - 1)
    got = np.array(ctx.decode([prompt[-1]])[-1], dtype=np.float64)
    want = fresh_row(loaded.fresh, prompt)
    floor = numeric_floor(loaded.fresh, prompt, len(prompt) - 2, len(prompt) - 1)
    assert float(np.abs(got - want).max()) <= floor + 1e-4


def decoder_for(loaded: Loaded, kind: str, k: int | None) -> SpeculativeDecoder:
    drafter = ModelDrafter(*loaded.drafters[kind], p_min=0.0) if kind in ("same", "perturbed") else None
    ngram = SuffixDrafter(3) if kind in ("ngram", "stacked") else None
    if kind == "stacked":
        drafter = ModelDrafter(*loaded.drafters["perturbed"], p_min=0.0)
    return SpeculativeDecoder(loaded.target, loaded.ctx, ngram=ngram, drafter=drafter,
                              controller=DepthController(k_max=12, fixed=k))


@pytest.mark.parametrize("k", [1, 3, 12])
@pytest.mark.parametrize("kind", ["same", "perturbed", "ngram", "stacked"])
def test_greedy_speculation_equals_plain_decoding(loaded: Loaded, kind: str, k: int) -> None:
    """All drafts accepted (the same weights), some (perturbed), n-gram, and both stacked; depth 12 goes past
    the snapshots (8) on LFM2 and Qwen3.5, so checkpoints serve there too."""
    plain = SpeculativeDecoder(loaded.target, loaded.ctx)
    rejected = accepted = 0
    for prompt in loaded.prompts.values():
        want, _ = run(plain, prompt)
        got, totals = run(decoder_for(loaded, kind, k), prompt)
        assert got == want
        accepted += totals.accepted
        rejected += totals.drafted - totals.accepted
    assert accepted + rejected > 0  # drafts were verified (a random model rarely repeats its prompt: the
    if kind != "ngram":  # suffix drafter's drafts are mostly rejected)
        assert accepted > 0
    if kind == "same":
        assert rejected == 0  # identical weights: every draft is accepted
    if kind == "perturbed":
        assert rejected > 0


def test_a_chat_over_two_turns_reuses_the_state(loaded: Loaded) -> None:
    """The second turn's prompt extends the first turn's answer: the state is kept, not read again."""
    decoder = decoder_for(loaded, "ngram", None)
    decoder.calibrate()
    plain = SpeculativeDecoder(loaded.target, loaded.fresh)
    first = loaded.prompts["repetitive"]
    answer: list[int] = []
    for event in decoder.generate(first, GREEDY):
        if isinstance(event, Token):
            answer += event.token_ids
    second = [*first, *answer, *loaded.target.tokenize(" and again:", add_special=False)]
    cached_before = loaded.ctx.common_prefix(second)
    assert cached_before >= len(first) + len(answer) - 1
    totals = RunTotals()
    got = []
    for event in decoder.generate(second, GREEDY, totals=totals):
        if isinstance(event, Token):
            got += event.token_ids
    plain.reset_cache()
    want = [t for e in plain.generate(second, GREEDY) if isinstance(e, Token) for t in e.token_ids]
    assert got == want


# --- the session, the commands ------------------------------------------------------------------


@pytest.mark.parametrize("arch", RECURRENT_ARCHS)
def test_a_session_loads_with_the_ngram_drafter_on_and_answers(
        arch: str, recurrent_models: dict[str, tuple[Path, Path, Path]]) -> None:
    target, _, perturbed = recurrent_models[arch]
    draft = DraftSettings(ngram=3, drafter_path=str(perturbed))
    session = EngineSession(LoadSettings(target_path=str(target), draft=draft, n_ctx=512, n_batch=64, n_threads=1))
    try:
        assert session.ctx.rollback == EXPECTED_ROLLBACK[arch]
        loaded_event = session.loaded_event()
        assert loaded_event.kv_bytes_total >= session.state_bytes > 0
        messages = [{"role": "user", "content": "one two three, one two three, one two"}]
        sampling = SamplingSettings(temperature=0.0, max_tokens=40)
        spec = [e for e in session.generate(1, messages, sampling)]
        plain = [e for e in session.generate(2, messages, sampling, decoder=session.plain_decoder)]
        finished = next(e for e in spec if isinstance(e, Finished))
        assert finished.text == next(e for e in plain if isinstance(e, Finished)).text
        assert finished.stats.completion_tokens > 0
        assert all(p.kv_bytes_used >= session.state_bytes for p in spec if isinstance(p, PassStats))
    finally:
        session.close()


def test_a_recurrent_drafter_drafts_for_a_dense_target(tiny_target: Path, tiny_models_dir: Path) -> None:
    """A Mamba drafter with the target's vocabulary takes its drafts back by checkpoint."""
    drafter = write_tiny_model(tiny_models_dir / "tiny-mamba-drafter.gguf", arch="mamba", n_layer=2)
    init_backend(None)
    target = Model(tiny_target, n_gpu_layers=0)
    dmodel = Model(drafter, n_gpu_layers=0)
    ctx, dctx = Context(target, PARAMS), Context(dmodel, PARAMS)
    try:
        assert ctx.rollback == ROLLBACK_KV
        assert dctx.rollback == ROLLBACK_CHECKPOINTS
        prompt = target.tokenize(PROMPTS["prose"], add_special=True)
        want, _ = run(SpeculativeDecoder(target, ctx), prompt)
        spec = SpeculativeDecoder(target, ctx, drafter=ModelDrafter(dmodel, dctx, p_min=0.0),
                                  controller=DepthController(k_max=8, fixed=4))
        got, totals = run(spec, prompt)
        assert got == want
        assert totals.drafted > 0
    finally:
        for c in (ctx, dctx):
            c.close()
        dmodel.close()
        target.close()


def test_the_memory_figures_count_the_state(recurrent_models: dict[str, tuple[Path, Path, Path]]) -> None:
    """The state llama.cpp copies (measured) is the state the GGUF's shape gives, plus a small header; the KV
    cache counts only attention layers; snapshots multiply the state where llama.cpp keeps them."""
    init_backend(None)
    for arch, (target, _, _) in recurrent_models.items():
        info = read_gguf_info(target)
        shape = ModelShape.from_gguf(info)
        attention = attention_layers(arch, 4).count(True)
        per_layer_kv = shape.kv_layer_bytes_per_cell("f16")
        assert kv_bytes_per_token(shape, "f16") == attention * per_layer_kv
        model = Model(target, n_gpu_layers=0)
        ctx = Context(model, PARAMS)
        try:
            ctx.decode(model.tokenize("hello", add_special=True))
            measured = ctx.recurrent_state_bytes()
            assert shape.state_bytes <= measured <= shape.state_bytes + 4096, arch
        finally:
            ctx.close()
            model.close()
        plan = recurrent_rollback(shape, arch, 16)
        if EXPECTED_ROLLBACK[arch] == ROLLBACK_SNAPSHOTS:
            assert plan.mechanism == "snapshots"
            assert plan.snapshots == 16
            assert plan.allocated_bytes == 17 * shape.state_bytes
        else:
            assert plan.mechanism == "checkpoints"
            assert plan.allocated_bytes == 2 * shape.state_bytes


# --- sampling: the output distribution is the target's own ----------------------------------------

N_SAMPLED = 5_000


class SamplingModels:
    """What the chi-square helpers of test_engine_sampling read: the target and a context for exact rows."""

    def __init__(self, loaded: Loaded) -> None:
        self.target = loaded.target
        self.exact_ctx = loaded.fresh


@pytest.mark.parametrize("broken", [False, True], ids=["lossless", "broken-rule-caught"])
def test_sampled_speculation_keeps_the_target_distribution(loaded: Loaded, broken: bool) -> None:
    """A model drafter of the same architecture at depth 3, rejection sampling, every rollback path; the
    control accepts every draft and must fail the same test."""
    from tests.app.test_engine_sampling import (
        ALPHA,
        AcceptEverything,
        exact_bins,
        goodness_of_fit,
        sample_answers,
    )

    if broken and loaded.arch != "granitehybrid":  # type: ignore[attr-defined]
        pytest.skip("the control runs on one architecture")
    prompt = loaded.target.tokenize("Hello there, the quick brown fox", add_special=True)
    bins = exact_bins(SamplingModels(loaded), prompt, N_SAMPLED)  # type: ignore[arg-type]
    assert len(bins) > 20
    drafter = ModelDrafter(*loaded.drafters["perturbed"], p_min=0.3)
    cls = AcceptEverything if broken else SpeculativeDecoder
    decoder = cls(loaded.target, loaded.ctx, drafter=drafter, controller=DepthController(k_max=8, fixed=3))
    counts, drafted, deep = sample_answers(decoder, prompt, N_SAMPLED)
    assert drafted > N_SAMPLED
    assert deep > N_SAMPLED // 4
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLED)
    if broken:
        assert p < ALPHA, f"the broken rule went unnoticed: chi2 {stat:.1f}, df {df}, p {p:.3g}"
    else:
        assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"
