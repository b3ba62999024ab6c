"""DFlash and DSpark block drafters draft for their target, as llama.cpp's common/speculative.cpp drives them,
losslessly.

A tiny llama target (4 layers, 64 wide) and random one-layer DFlash drafters written with ``gguf`` that read the
inputs of target layers 1 and 3 and borrow the target's token embeddings and output matrix; the DSpark one also
holds the Markov head. Random weights give low acceptance: these tests check exactness, that the drafter's cache
holds the target's features at the right positions after rejections, and the refusals.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.adaptive import DepthController
from app.engine.dflash import DFlashContext, DFlashDrafter, block_size, check_dflash_pairing, is_dspark
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.session import EngineSession
from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
from app.engine.suffix_tree import SuffixDrafter
from app.errors import AppError, IncompatibleDrafterError
from app.events import FROM_MODEL, FROM_NGRAM, Finished, PassStats, Token, source_counts
from app.library.gguf_reader import read_gguf_info
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.gguf_fixtures import write_dflash_drafter, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1)
GREEDY = SamplingSettings(temperature=0.0, max_tokens=60)
PROMPTS = ("Hello there, the quick brown fox jumps over the lazy dog.",
           "one two three, one two three, one two three, one two")
BLOCK = 5


@pytest.fixture(scope="session")
def dflash_models(tiny_models_dir: Path) -> dict[str, Path]:
    d = tiny_models_dir
    return {
        "target": write_tiny_model(d / "dflash-target.gguf", n_layer=4, name="dflash-target"),
        "dflash": write_dflash_drafter(d / "tiny-dflash.gguf", block_size=BLOCK),
        "dspark": write_dflash_drafter(d / "tiny-dspark.gguf", block_size=BLOCK, dspark=True, name="tiny-dspark"),
        "narrow": write_dflash_drafter(d / "tiny-dflash-narrow.gguf", n_embd=32, name="narrow"),
        "deep": write_dflash_drafter(d / "tiny-dflash-deep.gguf", target_layers=(1, 9), name="deep"),
        "other-vocab": write_dflash_drafter(d / "tiny-dflash-alt.gguf", vocab="bytes-alt", name="alt"),
        "mamba": write_tiny_model(d / "dflash-mamba-target.gguf", arch="mamba", n_layer=4, name="mamba"),
    }


class Loaded:
    def __init__(self, paths: dict[str, Path], kind: str) -> None:
        init_backend(None)
        self.target = Model(paths["target"], n_gpu_layers=0)
        self.model = Model(paths[kind], n_gpu_layers=0)
        info = read_gguf_info(paths[kind])
        self.dspark = is_dspark(info)
        self.ids = check_dflash_pairing(self.target, read_gguf_info(paths["target"]), self.model, info)
        self.block = block_size(info)
        self.ctx = Context(self.target, PARAMS)
        self.drafter = self.make_drafter(self.ctx)
        self.fresh = Context(self.target, PARAMS)
        self.prompts = [self.target.tokenize(text, add_special=True) for text in PROMPTS]

    def make_drafter(self, ctx: Context) -> DFlashDrafter:
        return DFlashDrafter(ctx, DFlashContext(self.model, ctx, PARAMS), self.ids, self.block, dspark=self.dspark)

    def close(self) -> None:
        self.drafter.detach()
        self.drafter.ctx.close()
        self.ctx.close()
        self.fresh.close()
        self.model.close()
        self.target.close()


@pytest.fixture(scope="module", params=["dflash", "dspark"])
def loaded(request: pytest.FixtureRequest, dflash_models: dict[str, Path]) -> Iterator[Loaded]:
    lm = Loaded(dflash_models, request.param)
    yield lm
    lm.close()


def run(decoder: SpeculativeDecoder, prompt: list[int], settings: SamplingSettings = GREEDY,
        passes: list[PassStats] | None = None) -> tuple[list[int], RunTotals]:
    decoder.reset_cache()
    totals, stop = RunTotals(), StopReason()
    out: list[int] = []
    for event in decoder.generate(prompt, settings, totals=totals, stop=stop):
        if isinstance(event, Token):
            out += event.token_ids
        elif isinstance(event, PassStats) and passes is not None:
            passes.append(event)
    assert stop.reason in ("max_tokens", "eog")
    return out, totals


def test_it_is_recognised_and_reads_the_layers_it_names(loaded: Loaded) -> None:
    assert loaded.ids == [1, 3]
    assert loaded.block == BLOCK
    assert loaded.model.meta("general.architecture") == "dflash"
    # DFlash drafts the block's mask positions (B − 1 tokens); DSpark drafts from the first position (B).
    assert loaded.drafter.max_depth == (BLOCK if loaded.dspark else BLOCK - 1)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("stacked", [False, True], ids=["alone", "with-ngram"])
def test_greedy_speculation_equals_plain_decoding(loaded: Loaded, stacked: bool, k: int) -> None:
    plain = SpeculativeDecoder(loaded.target, loaded.ctx)
    decoder = SpeculativeDecoder(loaded.target, loaded.ctx, drafter=loaded.drafter,
                                 ngram=SuffixDrafter(2) if stacked else None,
                                 controller=DepthController(k_max=8, fixed=k, block_drafter=True))
    passes: list[PassStats] = []
    for prompt in loaded.prompts:
        loaded.drafter.follow(False)
        want, _ = run(plain, prompt)
        loaded.drafter.follow(True)
        got, _ = run(decoder, prompt, passes=passes)
        assert got == want
    ngram, trained = source_counts(passes)
    assert trained.drafted > 0
    assert max(p.drafted - p.drafted_ngram for p in passes) <= loaded.drafter.max_depth  # one block per draft
    if stacked:
        assert ngram.drafted > 0
    assert loaded.drafter.gaps == 0


def _block_logits(lm: Loaded, tokens: list[int], chunk: int) -> np.ndarray:
    """The drafter's block after ``tokens`` from fresh contexts that read ``tokens[:-1]`` in chunks."""
    ctx = Context(lm.target, PARAMS)
    drafter = lm.make_drafter(ctx)
    try:
        for start in range(0, len(tokens) - 1, chunk):
            ctx.decode(tokens[start : min(start + chunk, len(tokens) - 1)])
        assert drafter.ctx.n_past == len(tokens) - 1
        return drafter.ctx.block([tokens[-1], *[drafter.ctx.mask] * (BLOCK - 1)]).astype(np.float64)
    finally:
        drafter.detach()
        drafter.ctx.close()
        ctx.close()


def test_after_speculation_the_drafter_holds_what_a_fresh_read_shows(dflash_models: dict[str, Path]) -> None:
    """After drafts, rejections and the blocks' own cells, the drafter's cache holds the target's features at
    their positions: its next block equals one from contexts that read the kept tokens afresh, within the
    rounding between honest ways of reading them, and a cache one position short differs by far more."""
    lm = Loaded(dflash_models, "dflash")
    try:
        decoder = SpeculativeDecoder(lm.target, lm.ctx, drafter=lm.drafter,
                                     controller=DepthController(k_max=8, fixed=4, block_drafter=True))
        out, totals = run(decoder, lm.prompts[0])
        assert totals.drafted > totals.accepted
        tokens = lm.prompts[0] + out
        lm.ctx.reuse_prefix(tokens[:-1])
        lm.drafter.ctx.truncate(lm.ctx.n_past)
        assert lm.drafter.ctx.tokens == tokens[:-1]
        got = lm.drafter.ctx.block([tokens[-1], *[lm.drafter.ctx.mask] * (BLOCK - 1)]).astype(np.float64)
        whole = _block_logits(lm, tokens, 64)
        single = _block_logits(lm, tokens, 1)
        floor = float(np.abs(whole - single).max())
        assert float(np.abs(got - whole).max()) <= 4 * floor + 1e-4
        lm.drafter.ctx.truncate(len(tokens) - 2)  # one position short: the block lands a position early
        short = lm.drafter.ctx.block([tokens[-1], *[lm.drafter.ctx.mask] * (BLOCK - 1)]).astype(np.float64)
        assert float(np.abs(short - whole).max()) > 10 * (floor + 1e-4)
    finally:
        lm.close()


N_SAMPLED = 5_000


class SamplingModels:
    def __init__(self, loaded: Loaded) -> None:
        self.target = loaded.target
        self.exact_ctx = loaded.fresh


@pytest.mark.parametrize("broken", [False, True], ids=["lossless", "broken-rule-caught"])
def test_sampled_block_drafts_keep_the_target_distribution(loaded: Loaded, broken: bool) -> None:
    """Each block position sampled from its own row's q at depth 3, verified by rejection sampling; the control
    accepts every draft and must fail the same test."""
    from tests.app.test_engine_sampling import ALPHA, AcceptEverything, exact_bins, goodness_of_fit, sample_answers

    prompt = loaded.target.tokenize("Hello there, the quick brown fox", add_special=True)
    bins = exact_bins(SamplingModels(loaded), prompt, N_SAMPLED)  # type: ignore[arg-type]
    assert len(bins) > 20
    cls = AcceptEverything if broken else SpeculativeDecoder
    decoder = cls(loaded.target, loaded.ctx, drafter=loaded.drafter,
                  controller=DepthController(k_max=8, fixed=3, block_drafter=True))
    counts, drafted, deep = sample_answers(decoder, prompt, N_SAMPLED)
    assert drafted > N_SAMPLED
    assert deep > N_SAMPLED // 4
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLED)
    if broken:
        assert p < ALPHA, f"the broken rule went unnoticed: chi2 {stat:.1f}, df {df}, p {p:.3g}"
    else:
        assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


def test_a_session_drafts_with_it_beside_the_ngram_drafter(dflash_models: dict[str, Path]) -> None:
    settings = LoadSettings(target_path=str(dflash_models["target"]), n_ctx=1024, n_batch=64, n_threads=1,
                            draft=DraftSettings(drafter_path=str(dflash_models["dspark"]), ngram=2)).validate()
    lines: list[str] = []
    session = EngineSession(settings, log=lines.append)
    try:
        assert isinstance(session.decoder.drafter, DFlashDrafter)
        assert session.decoder.drafter.dspark
        assert session.decoder.controller.block_drafter
        events = list(session.generate(1, [{"role": "user", "content": "Say hello."}],
                                       SamplingSettings(temperature=0.0, max_tokens=24)))
        finished = [e for e in events if isinstance(e, Finished)]
        assert finished
        assert finished[0].stats.drafted > 0
        sources = {s for e in events if isinstance(e, Token) for s in e.sources}
        assert sources <= {FROM_MODEL, FROM_NGRAM, "target"}
        # The drafter's one-layer cache as the memory figures count it, against llama.cpp's log.
        logged = [float(m.group(1)) for m in re.finditer(
            r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*\d+ cells,\s*1 layers", "".join(lines))]
        assert logged
        assert abs(session.drafter_kv_per_token * session.ctx.n_ctx / 2**20 - logged[-1]) < 0.01
    finally:
        session.close()


@pytest.mark.parametrize(("target", "drafter", "words"), [
    ("target", "narrow", "trained on a target 32 wide"),
    ("target", "deep", "reads target layers"),
    ("target", "other-vocab", "cannot draft for"),
    ("mamba", "dflash", "layer inputs it needs"),
])
def test_wrong_pairings_are_refused_in_one_sentence(dflash_models: dict[str, Path], target: str, drafter: str,
                                                    words: str) -> None:
    settings = LoadSettings(target_path=str(dflash_models[target]), n_ctx=256, n_batch=64, n_threads=1,
                            draft=DraftSettings(drafter_path=str(dflash_models[drafter])))
    with pytest.raises(IncompatibleDrafterError, match=words) as caught:
        EngineSession(settings.validate()).close()
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith(".")


def test_it_is_not_a_chat_model(dflash_models: dict[str, Path]) -> None:
    settings = LoadSettings(target_path=str(dflash_models["dflash"]), n_ctx=256, n_batch=64, n_threads=1)
    with pytest.raises(AppError, match="DFlash drafter, not a chat model"):
        EngineSession(settings.validate()).close()


@pytest.mark.process
def test_bench_json_reports_the_block_cost_and_each_source(dflash_models: dict[str, Path], tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "one two three, one two"}]}) + "\n")
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(dflash_models["target"]), "--drafter",
           str(dflash_models["dflash"]), "--ngram", "2", "--k", "3", "--prompts", str(prompts), "--max-tokens", "40",
           "--threads", "1", "--baseline", "--json", str(out)]
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical True" in proc.stdout
    report = json.loads(out.read_text())
    assert report["c"] > 0
    assert report["drafter_step_ms"] > 0
    assert report["total"]["sources"][FROM_MODEL]["drafted"] > 0
