"""The target's own MTP heads draft, as llama.cpp's common/speculative.cpp drives them, and losslessly.

A tiny Qwen3.5 (Gated DeltaNet beside gated attention) with one MTP block, written with ``gguf``: random
weights (drafts seldom accepted), and a "bigram" variant whose MTP block predicts what the target predicts
after the same token, by construction (every draft accepted; with noise on its input, about half). The same
for GLM-4.5 (glm4moe) and for deepseek2 with MLA (GLM-4.7-Flash), whose MTP graphs llama.cpp drives alike.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.ceiling.mtp_heads import mtp_kv_bytes, mtp_weight_bytes
from app.ceiling.roofline import ModelShape, kv_cache_bytes
from app.engine.adaptive import DepthController
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.mtp import MTPContext, MTPDrafter
from app.engine.session import EngineSession
from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
from app.engine.suffix_tree import SuffixDrafter
from app.errors import EngineLoadError, IncompatibleDrafterError, SettingsError
from app.events import Finished, Token
from app.library.gguf_reader import read_gguf_info
from app.library.heads import mtp_refusal
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.gguf_fixtures import MTP_FIXTURE_ARCHS, write_small_gguf, write_tiny_model, write_tiny_mtp_target

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1, rs_snapshots=8)
GREEDY = SamplingSettings(temperature=0.0, max_tokens=60)
PROMPTS = ("Hello there, the quick brown fox jumps over the lazy dog.",
           "one two three, one two three, one two three, one two")
N_LAYER = 4
ARCHS = ("qwen35", *MTP_FIXTURE_ARCHS)


@pytest.fixture(scope="session")
def mtp_files(tiny_models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Path]]:
    """Each architecture's fixtures, written once: random, bigram (exact, noisy), no MTP block, two blocks (the
    other architectures' in a folder of their own, which the folder scans of other tests do not see)."""
    written: dict[str, dict[str, Path]] = {}

    def models(arch: str) -> dict[str, Path]:
        if arch in written:
            return written[arch]
        folder = tiny_models_dir if arch == "qwen35" else tmp_path_factory.mktemp(f"tiny-{arch}")

        def write(name: str, **kw: object) -> Path:
            path, label = folder / f"tiny-{arch}-{name}.gguf", f"tiny-{arch}-{name}"
            if arch == "qwen35":
                return write_tiny_model(path, arch="qwen35", n_layer=N_LAYER, name=label,
                                        **kw)  # type: ignore[arg-type]
            return write_tiny_mtp_target(path, arch, n_layer=N_LAYER, name=label,
                                         mtp_layers=kw.pop("mtp_layers", 0), **kw)  # type: ignore[arg-type]

        written[arch] = {
            "random": write("mtp", mtp_layers=1),
            "exact": write("mtp-bigram", mtp_layers=1, bigram=True),
            "noisy": write("mtp-bigram-noisy", mtp_layers=1, bigram=True, mtp_noise=0.3),
            "none": write("no-mtp"),
            "two": write("mtp2", mtp_layers=2),
        }
        return written[arch]

    return models


@pytest.fixture(scope="module", params=ARCHS)
def mtp_models(request: pytest.FixtureRequest, mtp_files: Callable[[str], dict[str, Path]]) -> dict[str, Path]:
    """One architecture's fixtures: the tests that take them run for each."""
    return mtp_files(request.param)


@pytest.fixture(scope="session")
def qwen35_models(mtp_files: Callable[[str], dict[str, Path]]) -> dict[str, Path]:
    """Qwen3.5's alone, for what does not depend on the graph (sampling, the CLI)."""
    return mtp_files("qwen35")


class Loaded:
    """A target loaded with its MTP heads, its context with an MTP drafter attached, and a plain context."""

    def __init__(self, path: Path) -> None:
        init_backend(None)
        self.model = Model(path, n_gpu_layers=0, load_mtp=True)
        self.ctx = Context(self.model, PARAMS)
        self.drafter = MTPDrafter(self.ctx, MTPContext(self.model, self.ctx, PARAMS), p_min=0.0)
        self.fresh = Context(self.model, PARAMS)
        self.prompts = [self.model.tokenize(text, add_special=True) for text in PROMPTS]

    def close(self) -> None:
        self.drafter.detach()
        self.drafter.ctx.close()
        self.ctx.close()
        self.fresh.close()
        self.model.close()


@pytest.fixture(scope="module", params=["random", "exact"])
def loaded(request: pytest.FixtureRequest, mtp_models: dict[str, Path]) -> Iterator[Loaded]:
    lm = Loaded(mtp_models[request.param])
    lm.kind = request.param  # type: ignore[attr-defined]
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


def test_the_fixture_is_what_it_claims(mtp_models: dict[str, Path]) -> None:
    info = read_gguf_info(mtp_models["random"])
    assert (info.n_layer, info.mtp_layers) == (N_LAYER + 1, 1)  # block_count counts the MTP block
    # Qwen3.5's trunk alternates Gated DeltaNet and attention (the others' is attention alone); the MTP block
    # keeps no KV in the target's context.
    if info.architecture == "qwen35":
        assert info.kv_layers == (False, True, False, True, False)
        assert info.recurrent_layers == 2
    else:
        assert info.kv_layers == (True,) * N_LAYER + (False,)
        assert info.recurrent_layers == 0
    assert mtp_refusal(info) is None
    assert mtp_weight_bytes(info) > 0
    init_backend(None)
    model = Model(mtp_models["random"], n_gpu_layers=0, load_mtp=True)
    try:
        assert (model.n_layer, model.n_layer_nextn) == (N_LAYER, 1)  # as llama.cpp counts them
    finally:
        model.close()


def test_an_mtp_context_needs_the_heads_loaded(mtp_models: dict[str, Path]) -> None:
    init_backend(None)
    model = Model(mtp_models["random"], n_gpu_layers=0)  # load_mtp off: llama.cpp skips the MTP tensors
    ctx = Context(model, PARAMS)
    try:
        with pytest.raises(EngineLoadError, match="without its MTP heads"):
            MTPContext(model, ctx, PARAMS)
    finally:
        ctx.close()
        model.close()


@pytest.mark.parametrize("k", [1, 3, 12])
@pytest.mark.parametrize("stacked", [False, True], ids=["mtp", "mtp+ngram"])
def test_greedy_speculation_equals_plain_decoding(loaded: Loaded, stacked: bool, k: int) -> None:
    """Depth 12 goes past the target's 8 snapshots, so checkpoints (and the re-decode of the kept tokens, which
    the MTP context reads again too) serve there; the MTP context drops rejected positions at the next batch."""
    plain = SpeculativeDecoder(loaded.model, loaded.ctx)
    decoder = SpeculativeDecoder(loaded.model, loaded.ctx, drafter=loaded.drafter,
                                 ngram=SuffixDrafter(3) if stacked else None,
                                 controller=DepthController(k_max=12, fixed=k))
    drafted = accepted = 0
    for prompt in loaded.prompts:
        want, _ = run(plain, prompt)
        got, totals = run(decoder, prompt)
        assert got == want
        drafted += totals.drafted
        accepted += totals.accepted
    assert drafted > 0
    assert loaded.drafter.stats.gaps == 0
    if loaded.kind == "exact" and not stacked:  # type: ignore[attr-defined]
        assert accepted == drafted  # the MTP head predicts what the target does, by construction


def _first_step_logits(loaded: Loaded, tokens: list[int], chunk: int) -> np.ndarray:
    """What the MTP heads predict after ``tokens``, from a fresh target and MTP context that read
    ``tokens[:-1]`` in chunks of ``chunk``."""
    ctx = Context(loaded.model, PARAMS)
    mtp = MTPContext(loaded.model, ctx, PARAMS)
    drafter = MTPDrafter(ctx, mtp, p_min=0.0)
    try:
        for start in range(0, len(tokens) - 1, chunk):
            ctx.decode(tokens[start : min(start + chunk, len(tokens) - 1)])
        row = drafter._h[len(tokens) - 2]
        return np.array(mtp.step(tokens[-1], row), dtype=np.float64)
    finally:
        drafter.detach()
        mtp.close()
        ctx.close()


def test_after_speculation_the_mtp_heads_see_what_a_fresh_read_shows(mtp_models: dict[str, Path]) -> None:
    """Every MTP position pairs its token with the target's row of the position before, also after rejected
    drafts and rollbacks: the first draft step then equals one from contexts that read the kept tokens afresh,
    within the rounding measured here between honest ways of reading them (one batch, one token at a time)."""
    lm = Loaded(mtp_models["random"])
    try:
        decoder = SpeculativeDecoder(lm.model, lm.ctx, drafter=lm.drafter,
                                     controller=DepthController(k_max=8, fixed=4))
        out, totals = run(decoder, lm.prompts[0])
        assert totals.drafted > totals.accepted  # rejections happened, so positions were taken back
        tokens = lm.prompts[0] + out
        # Bring the MTP context to the kept tokens as the loop does before a draft, and take its first step.
        lm.ctx.reuse_prefix(tokens[:-1])
        assert lm.ctx.n_past == len(tokens) - 1
        lm.drafter.ctx.truncate(lm.ctx.n_past)
        got = np.array(lm.drafter.ctx.step(tokens[-1], lm.drafter._h[len(tokens) - 2]), dtype=np.float64)
        whole = _first_step_logits(lm, tokens, 64)
        single = _first_step_logits(lm, tokens, 1)
        floor = float(np.abs(whole - single).max())
        assert float(np.abs(got - whole).max()) <= 4 * floor + 1e-4
        # A pairing off by one position reads another row: far outside that floor.
        shifted = np.array(lm.drafter.ctx.step(tokens[-1], lm.drafter._h[len(tokens) - 3]), dtype=np.float64)
        assert float(np.abs(shifted - whole).max()) > 100 * (floor + 1e-4)
    finally:
        lm.close()


# --- sampling: the output distribution is the target's own ----------------------------------------

N_SAMPLED = 5_000


class SamplingModels:
    """What the chi-square helpers of test_engine_sampling read: the target and a context for exact rows."""

    def __init__(self, loaded: Loaded) -> None:
        self.target = loaded.model
        self.exact_ctx = loaded.fresh


@pytest.mark.parametrize("broken", [False, True], ids=["lossless", "broken-rule-caught"])
def test_sampled_mtp_drafts_keep_the_target_distribution(qwen35_models: dict[str, Path], broken: bool) -> None:
    """Drafts sampled from the MTP heads' q at depth 3 (the noisy bigram: about half accepted, so second and
    third positions are verified too), rejection sampling; the control accepts every draft and must fail."""
    from tests.app.test_engine_sampling import ALPHA, AcceptEverything, exact_bins, goodness_of_fit, sample_answers

    lm = Loaded(qwen35_models["noisy"])
    try:
        prompt = lm.model.tokenize("Hello there, the quick brown fox", add_special=True)
        bins = exact_bins(SamplingModels(lm), prompt, N_SAMPLED)  # type: ignore[arg-type]
        assert len(bins) > 20
        cls = AcceptEverything if broken else SpeculativeDecoder
        decoder = cls(lm.model, lm.ctx, drafter=lm.drafter, controller=DepthController(k_max=8, fixed=3))
        counts, drafted, deep = sample_answers(decoder, prompt, N_SAMPLED)
        assert drafted > N_SAMPLED
        assert deep > N_SAMPLED // 4
        stat, df, p = goodness_of_fit(counts, bins, N_SAMPLED)
        if broken:
            assert p < ALPHA, f"the broken rule went unnoticed: chi2 {stat:.1f}, df {df}, p {p:.3g}"
        else:
            assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"
    finally:
        lm.close()


# --- the session, the refusals, the memory ---------------------------------------------------------


def test_a_session_drafts_with_the_mtp_heads_and_counts_their_memory(mtp_models: dict[str, Path]) -> None:
    lines: list[str] = []
    n_ctx = 4096
    settings = LoadSettings(target_path=str(mtp_models["exact"]), n_ctx=n_ctx, n_batch=64, n_threads=1,
                            draft=DraftSettings(mtp=True, ngram=3)).validate()
    session = EngineSession(settings, log=lines.append)
    try:
        messages = [{"role": "user", "content": "Say hello."}]
        greedy = SamplingSettings(temperature=0.0, max_tokens=24)

        def answer(**kw: object) -> Finished:
            return next(e for e in session.generate(1, messages, greedy, **kw)  # type: ignore[arg-type]
                        if isinstance(e, Finished))

        drafter = session.decoder.drafter
        assert isinstance(drafter, MTPDrafter)
        first = answer()
        assert first.stats.accepted > 0
        # A plain answer (bench's baseline) does not run the MTP heads: it costs what plain decoding costs.
        mirrored = drafter.stats.batches
        plain = answer(decoder=session.plain_decoder)
        assert drafter.stats.batches == mirrored
        assert plain.text == first.text
        again = answer()  # the heads follow again: the prompt is read through both caches
        assert again.text == first.text
        assert again.stats.accepted > 0
        info = read_gguf_info(mtp_models["exact"])
        predicted = mtp_kv_bytes(info, session.ctx.n_ctx)
        assert session.mtp_kv_bytes == predicted
        assert predicted > 0
        assert session.kv_bytes_total >= predicted
        # llama.cpp's own figure for the MTP context's cache: the one KV cache with a single layer.
        logged = [float(m.group(1)) for m in re.finditer(
            r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*\d+ cells,\s*1 layers", "".join(lines))]
        assert logged
        assert info.mla == (info.architecture == "deepseek2")  # MLA caches K alone (V is read from it)
        assert abs(logged[-1] - predicted / 2**20) < 0.01
        # And the target's own cache (its trunk's attention layers): the same count as the fit and doctor make.
        shape = ModelShape.from_gguf(info)
        main = [float(m.group(1)) for m in re.finditer(
            rf"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*\d+ cells,\s*{shape.n_kv_layers} layers",
            "".join(lines))]
        assert main
        assert abs(main[0] - kv_cache_bytes(shape, session.ctx.n_ctx) / 2**20) < 0.01
    finally:
        session.close()


def test_wrong_pairings_are_refused_in_one_sentence(mtp_models: dict[str, Path], tiny_target: Path) -> None:
    def load(path: Path, **draft: object) -> None:
        settings = LoadSettings(target_path=str(path), n_ctx=256, n_batch=64, n_threads=1,
                                draft=DraftSettings(**draft))  # type: ignore[arg-type]
        EngineSession(settings.validate()).close()

    cases = [
        (mtp_models["none"], {"mtp": True}, IncompatibleDrafterError, "has no MTP heads"),
        (tiny_target, {"mtp": True}, IncompatibleDrafterError, "has no MTP heads"),
        # Two blocks: llama.cpp's Qwen3.5 MTP graph asserts one (it would abort the process), so never loaded.
        (mtp_models["two"], {"mtp": True}, IncompatibleDrafterError, "with exactly 1"),
        (mtp_models["random"], {"mtp": True, "drafter_path": str(tiny_target)}, SettingsError, "not both"),
    ]
    for path, draft, error, words in cases:
        with pytest.raises(error, match=words) as caught:
            load(path, **draft)
        message = str(caught.value)
        assert message.count(". ") == 0
        assert message.endswith(".")
        assert "\n" not in message


_MLA = {"key_length_mla": 16, "value_length_mla": 16}


@pytest.mark.parametrize(("arch", "keys", "words"), [
    ("deepseek2", {}, "without MLA"),
    ("deepseek2", _MLA, "no query LoRA"),
    ("deepseek2", {**_MLA, "q_lora_rank": 8, "temperature_scale": 0.5}, "temperature"),
    ("deepseek2", {**_MLA, "q_lora_rank": 8, "leading_dense_block_count": 5}, "dense FFN"),
    ("glm4moe", {"key_length": 16, "value_length": 8}, "differ in width"),
    ("deepseek2", {**_MLA, "q_lora_rank": 8}, None),
    ("glm4moe", {}, None),
], ids=["deepseek2-mha", "deepseek2-lite", "deepseek2-temperature", "dense-mtp-block", "glm4moe-k-v", "mla",
        "glm4moe"])
def test_headers_the_moe_mtp_graphs_assert_against_are_refused_first(
        tmp_path: Path, arch: str, keys: dict[str, float], words: str | None) -> None:
    """llama.cpp's glm4moe and deepseek2 MTP graphs abort the process on these headers: refused from the header."""
    def prepare(writer: object) -> None:
        w: Any = writer
        w.add_name(f"tiny-{arch}")
        w.add_block_count(5)
        w.add_nextn_predict_layers(1)
        w.add_embedding_length(8)
        w.add_head_count(1)
        w.add_head_count_kv(1)
        for key, value in keys.items():
            where = "" if key == "leading_dense_block_count" else "attention."
            if isinstance(value, float):
                w.add_float32(f"{arch}.{where}{key}", value)
            else:
                w.add_uint32(f"{arch}.{where}{key}", value)

    refusal = mtp_refusal(read_gguf_info(write_small_gguf(tmp_path / f"{arch}.gguf", arch, prepare)))
    if words is None:
        assert refusal is None
        return
    assert refusal is not None
    assert words in refusal
    assert refusal.count(". ") == 0
    assert refusal.endswith(".")
    assert "\n" not in refusal


@pytest.mark.process
def test_bench_json_reports_the_mtp_step_cost(qwen35_models: dict[str, Path], tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "one two three, one two"}]}) + "\n")
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(qwen35_models["exact"]), "--mtp", "--k", "3",
           "--prompts", str(prompts), "--max-tokens", "40", "--threads", "1", "--baseline", "--json", str(out)]
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the target's MTP heads" in proc.stdout
    assert "identical True" in proc.stdout
    report = json.loads(out.read_text())
    assert report["mtp"] is True
    assert report["c"] > 0
    assert report["drafter_step_ms"] > 0
    assert report["total"]["acceptance"] == 1.0  # the bigram fixture's head agrees by construction


@pytest.mark.process
def test_doctor_and_models_name_the_mtp_heads(qwen35_models: dict[str, Path], tmp_path: Path) -> None:
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    doctor = subprocess.run([sys.executable, "-m", "app", "doctor", "--model", str(qwen35_models["random"])],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    assert "MTP heads: 1 (" in doctor.stdout
    assert "--mtp" in doctor.stdout
    models = subprocess.run([sys.executable, "-m", "app", "models", "--folder", str(qwen35_models["random"].parent)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert models.returncode == 0, models.stderr[-2000:]
    line = next(ln for ln in models.stdout.splitlines() if "tiny-qwen35-mtp " in ln or "tiny-qwen35-mtp.gguf" in ln)
    assert "MTP heads: 1" in line


def test_a_build_without_the_mtp_functions_is_refused_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MTP functions are looked up by their C++ names; a libllama that lacks them (another compiler's
    mangling, another llama.cpp) gets a sentence, not an AttributeError."""
    from app.engine import mtp

    symbols = dict(mtp._SYMBOLS)
    symbols["get_embeddings_nextn"] = ("_Z26llama_no_such_symbol_for_mtpP13llama_context", [], None)
    monkeypatch.setattr(mtp, "_SYMBOLS", symbols)
    monkeypatch.setattr(mtp, "_api", None)
    with pytest.raises(EngineLoadError, match="cannot draft here") as caught:
        mtp.nextn_api()
    assert "\n" not in str(caught.value)
    assert str(caught.value).count(". ") == 0
