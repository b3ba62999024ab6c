"""EAGLE-3 drafters draft for their target, as llama.cpp's common/speculative.cpp drives them, losslessly.

A tiny llama target (4 layers, 64 wide) and a random EAGLE-3 head written with ``gguf`` that reads the inputs
of target layers 1, 2 and 3 and borrows the target's token embeddings and output matrix. Random weights give
low acceptance: these tests check exactness, the pairing of positions and rows, and the refusals.
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
from app.engine.eagle3 import Eagle3Context, Eagle3Drafter, check_eagle3_pairing
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.session import EngineSession
from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
from app.engine.suffix_tree import SuffixDrafter
from app.errors import AppError, IncompatibleDrafterError
from app.events import Finished, Token
from app.library.gguf_reader import read_gguf_info
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.gguf_fixtures import write_eagle3_drafter, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1)
GREEDY = SamplingSettings(temperature=0.0, max_tokens=60)
PROMPTS = ("Hello there, the quick brown fox jumps over the lazy dog.",
           "one two three, one two three, one two three, one two")


@pytest.fixture(scope="session")
def eagle_models(tiny_models_dir: Path) -> dict[str, Path]:
    d = tiny_models_dir
    return {
        "target": write_tiny_model(d / "eagle-target.gguf", n_layer=4, name="eagle-target"),
        "eagle3": write_eagle3_drafter(d / "tiny-eagle3.gguf"),
        "narrow": write_eagle3_drafter(d / "tiny-eagle3-narrow.gguf", target_hidden=32, name="narrow"),
        "deep": write_eagle3_drafter(d / "tiny-eagle3-deep.gguf", target_layers=(1, 2, 9), name="deep"),
        "mamba": write_tiny_model(d / "eagle-mamba-target.gguf", arch="mamba", n_layer=4, name="mamba"),
    }


class Loaded:
    def __init__(self, paths: dict[str, Path]) -> None:
        init_backend(None)
        self.target = Model(paths["target"], n_gpu_layers=0)
        self.model = Model(paths["eagle3"], n_gpu_layers=0)
        self.ids = check_eagle3_pairing(self.target, read_gguf_info(paths["target"]), self.model,
                                        read_gguf_info(paths["eagle3"]))
        self.ctx = Context(self.target, PARAMS)
        self.drafter = Eagle3Drafter(self.ctx, Eagle3Context(self.model, self.ctx, PARAMS), self.ids, p_min=0.0)
        self.fresh = Context(self.target, PARAMS)
        self.prompts = [self.target.tokenize(text, add_special=True) for text in PROMPTS]

    def close(self) -> None:
        self.drafter.detach()
        self.drafter.ctx.close()
        self.ctx.close()
        self.fresh.close()
        self.model.close()
        self.target.close()


@pytest.fixture(scope="module")
def loaded(eagle_models: dict[str, Path]) -> Iterator[Loaded]:
    lm = Loaded(eagle_models)
    yield lm
    lm.close()


def run(decoder: SpeculativeDecoder, prompt: list[int],
        settings: SamplingSettings = GREEDY) -> tuple[list[int], RunTotals]:
    decoder.reset_cache()
    totals, stop = RunTotals(), StopReason()
    out: list[int] = []
    for event in decoder.generate(prompt, settings, totals=totals, stop=stop):
        if isinstance(event, Token):
            out += event.token_ids
    assert stop.reason in ("max_tokens", "eog")
    return out, totals


def test_it_loads_and_reads_the_layers_it_names(loaded: Loaded) -> None:
    assert loaded.ids == [1, 2, 3]
    assert loaded.model.meta("general.architecture") == "eagle3"


@pytest.mark.parametrize("k", [1, 3, 12])
@pytest.mark.parametrize("stacked", [False, True], ids=["eagle3", "eagle3+ngram"])
def test_greedy_speculation_equals_plain_decoding(loaded: Loaded, stacked: bool, k: int) -> None:
    plain = SpeculativeDecoder(loaded.target, loaded.ctx)
    decoder = SpeculativeDecoder(loaded.target, loaded.ctx, drafter=loaded.drafter,
                                 ngram=SuffixDrafter(3) if stacked else None,
                                 controller=DepthController(k_max=12, fixed=k))
    drafted = 0
    for prompt in loaded.prompts:
        want, _ = run(plain, prompt)
        got, totals = run(decoder, prompt)
        assert got == want
        drafted += totals.drafted
    assert drafted > 0
    assert loaded.drafter.stats.gaps == 0


def _first_step(loaded: Loaded, tokens: list[int], chunk: int) -> np.ndarray:
    """The drafter's first step after ``tokens`` from fresh contexts that read ``tokens[:-1]`` in chunks."""
    ctx = Context(loaded.target, PARAMS)
    drafter = Eagle3Drafter(ctx, Eagle3Context(loaded.model, ctx, PARAMS), loaded.ids, p_min=0.0)
    try:
        for start in range(0, len(tokens) - 1, chunk):
            ctx.decode(tokens[start : min(start + chunk, len(tokens) - 1)])
        assert drafter.ctx.n_past == len(tokens) - 2  # (token p + 1, g_p) for p up to the last but one
        return np.array(drafter.ctx.step(tokens[-1], drafter._h[len(tokens) - 2]), dtype=np.float64)
    finally:
        drafter.detach()
        drafter.ctx.close()
        ctx.close()


def test_after_speculation_the_drafter_sees_what_a_fresh_read_shows(eagle_models: dict[str, Path]) -> None:
    """Each cache position p holds (token p + 1, g_p), also after rejections: the first draft step equals one
    from contexts that read the kept tokens afresh, within the rounding between honest ways of reading them."""
    lm = Loaded(eagle_models)
    try:
        decoder = SpeculativeDecoder(lm.target, lm.ctx, drafter=lm.drafter,
                                     controller=DepthController(k_max=8, fixed=4))
        out, totals = run(decoder, lm.prompts[0])
        assert totals.drafted > totals.accepted
        tokens = lm.prompts[0] + out
        lm.ctx.reuse_prefix(tokens[:-1])
        lm.drafter.ctx.truncate(lm.ctx.n_past - 1)
        got = np.array(lm.drafter.ctx.step(tokens[-1], lm.drafter._h[len(tokens) - 2]), dtype=np.float64)
        whole = _first_step(lm, tokens, 64)
        single = _first_step(lm, tokens, 1)
        floor = float(np.abs(whole - single).max())
        assert float(np.abs(got - whole).max()) <= 4 * floor + 1e-4
        shifted = np.array(lm.drafter.ctx.step(tokens[-1], lm.drafter._h[len(tokens) - 3]), dtype=np.float64)
        assert float(np.abs(shifted - whole).max()) > 10 * (floor + 1e-4)
    finally:
        lm.close()


N_SAMPLED = 5_000


class SamplingModels:
    def __init__(self, loaded: Loaded) -> None:
        self.target = loaded.target
        self.exact_ctx = loaded.fresh


@pytest.mark.parametrize("broken", [False, True], ids=["lossless", "broken-rule-caught"])
def test_sampled_eagle3_drafts_keep_the_target_distribution(loaded: Loaded, broken: bool) -> None:
    """Drafts sampled from the EAGLE-3 head's q at depth 3, verified by rejection sampling; the control accepts
    every draft and must fail the same test."""
    from tests.app.test_engine_sampling import ALPHA, AcceptEverything, exact_bins, goodness_of_fit, sample_answers

    prompt = loaded.target.tokenize("Hello there, the quick brown fox", add_special=True)
    bins = exact_bins(SamplingModels(loaded), prompt, N_SAMPLED)  # type: ignore[arg-type]
    assert len(bins) > 20
    cls = AcceptEverything if broken else SpeculativeDecoder
    decoder = cls(loaded.target, loaded.ctx, drafter=loaded.drafter, controller=DepthController(k_max=8, fixed=3))
    counts, drafted, deep = sample_answers(decoder, prompt, N_SAMPLED)
    assert drafted > N_SAMPLED
    assert deep > N_SAMPLED // 4
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLED)
    if broken:
        assert p < ALPHA, f"the broken rule went unnoticed: chi2 {stat:.1f}, df {df}, p {p:.3g}"
    else:
        assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


def test_a_session_drafts_with_it_and_counts_its_cache(eagle_models: dict[str, Path]) -> None:
    lines: list[str] = []
    settings = LoadSettings(target_path=str(eagle_models["target"]), n_ctx=4096, n_batch=64, n_threads=1,
                            draft=DraftSettings(drafter_path=str(eagle_models["eagle3"]), ngram=3)).validate()
    session = EngineSession(settings, log=lines.append)
    try:
        assert isinstance(session.decoder.drafter, Eagle3Drafter)
        finished = [e for e in session.generate(1, [{"role": "user", "content": "Say hello."}],
                                                SamplingSettings(temperature=0.0, max_tokens=24))
                    if isinstance(e, Finished)]
        assert finished
        assert finished[0].stats.drafted > 0
        # The drafter's one-layer cache, as llama.cpp logs it (the target's has four layers).
        logged = [float(m.group(1)) for m in re.finditer(
            r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*\d+ cells,\s*1 layers", "".join(lines))]
        assert logged
        assert abs(session.drafter_kv_per_token * session.ctx.n_ctx / 2**20 - logged[-1]) < 0.01
    finally:
        session.close()


@pytest.mark.parametrize(("target", "drafter", "words"), [
    ("target", "narrow", "trained on a target 32 wide"),
    ("target", "deep", "reads target layers"),
    ("mamba", "eagle3", "layer inputs it needs"),
])
def test_wrong_pairings_are_refused_in_one_sentence(eagle_models: dict[str, Path], target: str, drafter: str,
                                                    words: str) -> None:
    settings = LoadSettings(target_path=str(eagle_models[target]), n_ctx=256, n_batch=64, n_threads=1,
                            draft=DraftSettings(drafter_path=str(eagle_models[drafter])))
    with pytest.raises(IncompatibleDrafterError, match=words) as caught:
        EngineSession(settings.validate()).close()
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith(".")


@pytest.mark.process
def test_it_is_not_a_chat_model(eagle_models: dict[str, Path], tmp_path: Path) -> None:
    settings = LoadSettings(target_path=str(eagle_models["eagle3"]), n_ctx=256, n_batch=64, n_threads=1)
    with pytest.raises(AppError, match="EAGLE-3 drafter, not a chat model"):
        EngineSession(settings.validate()).close()
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    models = subprocess.run([sys.executable, "-m", "app", "models", "--folder", str(eagle_models["eagle3"].parent)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert models.returncode == 0, models.stderr[-2000:]
    line = next(ln for ln in models.stdout.splitlines() if "tiny-eagle3.gguf" in ln)
    assert "EAGLE-3 drafter (not a chat model" in line


@pytest.mark.process
def test_bench_json_reports_the_eagle3_step_cost(eagle_models: dict[str, Path], tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "one two three, one two"}]}) + "\n")
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(eagle_models["target"]), "--drafter",
           str(eagle_models["eagle3"]), "--k", "3", "--prompts", str(prompts), "--max-tokens", "40",
           "--threads", "1", "--baseline", "--json", str(out)]
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical True" in proc.stdout
    report = json.loads(out.read_text())
    assert report["c"] > 0
    assert report["drafter_step_ms"] > 0


@pytest.mark.process
def test_models_lists_the_heads_for_a_target_with_their_reasons(eagle_models: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """`specdeck models --target` names each head that reads the target's hidden states: fits, or why not."""
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    cmd = [sys.executable, "-m", "app", "models", "--folder", str(eagle_models["eagle3"].parent), "--target",
           str(eagle_models["target"])]
    text = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert text.returncode == 0, text.stderr[-2000:]
    heads = text.stdout.split("Trained heads for it", 1)[1].splitlines()
    assert any("tiny-eagle3.gguf" in ln and ln.endswith(": fits") for ln in heads)
    assert any("tiny-eagle3-narrow.gguf" in ln and "does not fit: " in ln and "wide" in ln for ln in heads)
    doc = json.loads(subprocess.run([*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                    env=env).stdout)
    by_path = {Path(h["path"]).name: h for h in doc["heads"] if h["path"]}
    assert by_path["tiny-eagle3.gguf"]["fits"]
    assert by_path["tiny-eagle3.gguf"]["reason"] is None
    assert not by_path["tiny-eagle3-deep.gguf"]["fits"]
