"""The rest of OpenAI's sampling contract in the engine: presence and frequency penalties, logit bias and log
probabilities.

The adjustment (``sampling.adjust``) is checked against llama.cpp's own logit-bias and penalties samplers, bit
for bit. Through it, sampled speculation keeps the target's distribution: the speculative answers are compared
with the exact distribution, computed from the target's logits through the same adjustment, by the chi-square
test of test_engine_sampling, and a rule that accepts draft tokens against the unadjusted row is caught by the
same test. Greedy answers obey the bias, and the log probabilities are those of a plain decode.

Measured here (4,000 answers of 3 tokens, 68 to 84 bins): the model drafter p ≈ 0.03 seeded and 0.66 to 0.77
unseeded, the suffix drafter p ≈ 0.10 seeded and 0.17 to 0.70 unseeded (unseeded runs draw afresh each time).
Accepting draft tokens against the unadjusted row, with 1,000 answers: chi-square 985 on 32 degrees of freedom
(model drafter, p ≈ 1e-186) and 7,880 on 29 (suffix drafter, p = 0).
"""

from __future__ import annotations

import ctypes
import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from app.engine import sampling
from app.engine.adaptive import DepthController
from app.engine.drafters import Draft, ModelDrafter
from app.engine.grammar import _TOKEN_DATA
from app.engine.llama import init_backend
from app.engine.speculative import SpeculativeDecoder
from app.engine.suffix_tree import SuffixDrafter
from app.errors import SettingsError
from app.events import PassStats, Token, TokenLogprob
from app.params import MAX_LOGIT_BIAS, SamplingSettings
from tests.app.test_engine_sampling import (
    ALPHA,
    MIN_EXPECTED,
    PROSE,
    REPETITIVE,
    Models,
    goodness_of_fit,
    sample_answers,
)

N_SAMPLES = 4_000
N_BROKEN = 1_000  # the broken rule is off by orders of magnitude
LENGTH = 3
SAMPLED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": LENGTH}


@pytest.fixture(scope="module")
def models(tiny_target: Path, tiny_drafter_perturbed: Path) -> Iterator[Models]:
    m = Models(tiny_target, tiny_drafter_perturbed)
    yield m
    m.close()


@pytest.fixture(scope="module")
def same(tiny_target: Path, tiny_drafter_same: Path) -> Iterator[Models]:
    """A drafter with the target's weights: its q is the target's p wherever both see the same adjustment."""
    m = Models(tiny_target, tiny_drafter_same)
    yield m
    m.close()


# --- the adjustment is llama.cpp's ---------------------------------------------------------------------


def llama_cpp_adjusted(row: npt.NDArray[np.float32], settings: SamplingSettings,
                       accepted: list[int]) -> npt.NDArray[np.float32]:
    """``row`` through llama.cpp's logit-bias sampler, then its penalties sampler after ``accepted`` tokens, chained
    in llama-server's order."""
    import llama_cpp as lc

    n = row.size
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    try:
        bias = (lc.llama_logit_bias * len(settings.logit_bias))(
            *[lc.llama_logit_bias(t, b) for t, b in settings.logit_bias])
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(n, len(settings.logit_bias), bias))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(
            n, settings.repeat_last_n, settings.repeat_penalty, settings.frequency_penalty,
            settings.presence_penalty))
        for tok in accepted:
            lc.llama_sampler_accept(chain, tok)
        buf = np.zeros(n, dtype=_TOKEN_DATA)
        buf["id"] = np.arange(n, dtype=np.int32)
        buf["logit"] = row
        data = lc.llama_token_data_array(data=buf.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), size=n,
                                         selected=-1, sorted=False)
        lc.llama_sampler_apply(chain, ctypes.byref(data))
        assert data.size == n
        out = np.zeros(n, dtype=np.float32)
        out[buf["id"]] = buf["logit"]
        return out
    finally:
        lc.llama_sampler_free(chain)


@pytest.mark.parametrize(("repeat", "freq", "present"), [(1.3, 0.5, 0.7), (1.0, -0.4, 1.5), (0.8, 2.0, -2.0)])
def test_the_adjustment_is_llama_cpps_bias_then_penalties(repeat: float, freq: float, present: float) -> None:
    init_backend(None)
    rng = np.random.default_rng(0)
    window = 12
    for _ in range(4):
        row = (rng.normal(size=300) * 4).astype(np.float32)
        accepted = rng.integers(0, 30, size=40).tolist()  # repeats inside the window, and tokens that left it
        biased = [accepted[-1], accepted[-2], 250]  # two in the window: the order of bias and penalty shows
        settings = SamplingSettings(repeat_penalty=repeat, frequency_penalty=freq, presence_penalty=present,
                                    repeat_last_n=window, logit_bias=((biased[0], 3.5), (biased[1], -7.25),
                                                                      (biased[2], 100.0)))
        assert settings.validate().penalized
        ours = sampling.adjust(row, settings, np.array(accepted[-window:], dtype=np.int64))
        np.testing.assert_array_equal(ours, llama_cpp_adjusted(row, settings, accepted))
    assert not np.shares_memory(ours, row)  # a copy: the verify rows are llama.cpp's buffer


def test_the_adjustment_is_off_at_neutral_values_and_the_bias_needs_no_window() -> None:
    row = np.arange(10, dtype=np.float32) - 4
    recent = np.array([1, 2, 2, 9], dtype=np.int64)
    assert sampling.adjust(row, SamplingSettings(), recent) is row
    assert sampling.adjust(row, SamplingSettings(presence_penalty=1.0, repeat_last_n=0), recent) is row
    assert not SamplingSettings(presence_penalty=1.0, repeat_last_n=0).penalized
    assert SamplingSettings(frequency_penalty=-0.5).penalized
    assert not SamplingSettings().penalized
    biased = sampling.adjust(row, SamplingSettings(logit_bias=((3, -100.0), (12, 5.0))), None)
    assert biased[3] == row[3] - 100
    assert np.delete(biased, 3).tolist() == np.delete(row, 3).tolist()
    penalized = sampling.adjust(row, SamplingSettings(frequency_penalty=0.5, presence_penalty=1.0), recent)
    assert penalized.tolist() == pytest.approx([-4, -4.5, -4, -1, 0, 1, 2, 3, 4, 3.5])
    # The greedy pick and the distribution both read the adjusted row.
    assert sampling.greedy_token(row, SamplingSettings(logit_bias=((0, 9.0),)), None) == 0
    assert sampling.distribution(row, SamplingSettings(logit_bias=((9, -100.0),))).top == 8


# --- sampled speculation keeps the adjusted target's distribution --------------------------------------------------


# Positive penalties over the prompt's end and the answer, and a bias pushing one likely first token down and
# one rarer token up: the answers' distribution is far from the unadjusted one.
ADJUSTED_PROSE = {**SAMPLED, "presence_penalty": 0.8, "frequency_penalty": 0.6, "repeat_last_n": 12,
                  "logit_bias": ((114, -1.5), (94, 1.0), (89, 1.5))}
# Negative penalties favour what the window holds, which the suffix drafter copies, and the bias favours the
# token it drafts first: its drafts are accepted often, and the adjustment decides how often.
ADJUSTED_REPETITIVE = {**SAMPLED, "presence_penalty": -1.5, "frequency_penalty": -0.5, "repeat_last_n": 16,
                       "logit_bias": ((104, 3.0), (106, -2.0))}


def exact_bins(m: Models, prompt: list[int], n: int, options: dict[str, Any]) -> dict[tuple[int, ...], float]:
    """The adjusted target's probability of every full-length continuation expected at least MIN_EXPECTED
    times: a fresh decode per prefix, through the same ``sampling.distribution`` (and so ``adjust``)."""
    settings = SamplingSettings(**options).validate()

    def dist_after(prefix: list[int]) -> sampling.Dist:
        m.exact_ctx.clear()
        row = m.exact_ctx.prefill(prefix)
        recent = np.array(prefix[-settings.repeat_last_n :], dtype=np.int64)
        return sampling.distribution(np.array(row[-1]), settings, recent)

    bins: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], mass: float) -> None:
        d = dist_after(prompt + list(prefix))
        for tok, prob in zip(d.ids.tolist(), d.probs.tolist(), strict=True):
            p = mass * prob
            if n * p < MIN_EXPECTED or m.target.is_eog(tok):
                continue
            if len(prefix) + 1 == LENGTH:
                bins[(*prefix, tok)] = p
            else:
                walk((*prefix, tok), p)

    walk((), 1.0)
    return bins


class AcceptUnadjusted(SpeculativeDecoder):
    """The broken rule: draft tokens are accepted (or replaced) against the target's row without the penalties and
    the bias; the token after a fully accepted draft still comes from the adjusted row."""

    def _accept(
        self,
        rows: npt.NDArray[np.float32],
        draft: Draft,
        tokens: list[int],
        settings: SamplingSettings,
        rng: np.random.Generator,
        greedy: bool,
        penalize: bool,
        draws: sampling.SeededDraws | None = None,
    ) -> tuple[list[int], list[bool]]:
        plain = replace(settings, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=())
        emitted, accepted = super()._accept(rows, draft, tokens, plain, rng, greedy, False, draws)
        if all(accepted):
            recent = np.array((tokens + emitted[:-1])[-settings.repeat_last_n :], dtype=np.int64)
            emitted[-1] = sampling.distribution(rows[len(draft)], settings, recent).sample(rng)
        return emitted, accepted


def model_decoder(m: Models, cls: type[SpeculativeDecoder] = SpeculativeDecoder) -> SpeculativeDecoder:
    drafter = ModelDrafter(m.drafter, m.draft_ctx, p_min=0.3)
    return cls(m.target, m.ctx, drafter=drafter, controller=DepthController(k_max=8, fixed=3))


def ngram_decoder(m: Models, cls: type[SpeculativeDecoder] = SpeculativeDecoder) -> SpeculativeDecoder:
    return cls(m.target, m.ctx, ngram=SuffixDrafter(2), controller=DepthController(k_max=8, fixed=3))


CASES = [(PROSE, ADJUSTED_PROSE, model_decoder), (REPETITIVE, ADJUSTED_REPETITIVE, ngram_decoder)]
CASE_IDS = ["model", "ngram"]


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
@pytest.mark.parametrize(("text", "options", "make"), CASES, ids=CASE_IDS)
def test_speculation_keeps_the_adjusted_distribution(models: Models, text: str, options: dict[str, Any], make,  # type: ignore[no-untyped-def]
                                                     seeded: bool) -> None:
    prompt = models.target.tokenize(text, add_special=True)
    bins = exact_bins(models, prompt, N_SAMPLES, options)
    assert len(bins) > 20
    counts, drafted, _ = sample_answers(make(models), prompt, N_SAMPLES, options, seeded=seeded)
    assert drafted > N_SAMPLES // 2
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLES)
    assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


@pytest.mark.parametrize(("text", "options", "make"), CASES, ids=CASE_IDS)
def test_acceptance_without_the_adjustment_is_detected(models: Models, text: str, options: dict[str, Any],
                                                       make) -> None:  # type: ignore[no-untyped-def]
    prompt = models.target.tokenize(text, add_special=True)
    bins = exact_bins(models, prompt, N_BROKEN, options)
    counts, drafted, _ = sample_answers(make(models, AcceptUnadjusted), prompt, N_BROKEN, options, seeded=False)
    assert drafted > 0
    stat, df, p = goodness_of_fit(counts, bins, N_BROKEN)
    assert p < ALPHA, f"the broken rule went unnoticed: chi2 {stat:.1f}, df {df}, p {p:.3g}"


def test_the_model_drafters_q_has_the_adjustment(same: Models) -> None:
    """With the target's weights, the drafter's q equals the target's p only if it was adjusted the same way:
    then every sampled draft token passes min(1, p/q) (to float32 noise); without the bias and the penalties
    on q, the token the bias pushes down would be drafted and rejected again and again."""
    prompt = same.target.tokenize(PROSE, add_special=True)
    options = {**ADJUSTED_PROSE, "max_tokens": 24}
    drafter = ModelDrafter(same.drafter, same.draft_ctx, p_min=0.0)
    decoder = SpeculativeDecoder(same.target, same.ctx, drafter=drafter, controller=DepthController(k_max=8, fixed=3))
    drafted = accepted = 0
    for _ in range(20):
        decoder.reset_cache()
        for event in decoder.generate(prompt, SamplingSettings(**options, seed=-1)):
            if isinstance(event, PassStats):
                drafted += event.drafted
                accepted += sum(event.accepted)
    assert drafted > 200
    assert accepted >= 0.98 * drafted, (accepted, drafted)


# --- greedy ----------------------------------------------------------------------------------------------------


def answer(decoder: SpeculativeDecoder, prompt: list[int], settings: SamplingSettings) -> tuple[list[int], list[
        TokenLogprob], int, int]:
    """(tokens, their log probabilities, draft tokens verified, draft tokens accepted)."""
    decoder.reset_cache()
    out: list[int] = []
    logprobs: list[TokenLogprob] = []
    drafted = accepted = 0
    for event in decoder.generate(prompt, settings):
        if isinstance(event, Token):
            out += event.token_ids
            logprobs += event.logprobs
            assert len(event.logprobs) == (len(event.token_ids) if settings.logprobs else 0)
        elif isinstance(event, PassStats):
            drafted += event.drafted
            accepted += sum(event.accepted)
    return out, logprobs, drafted, accepted


def decoders(m: Models) -> dict[str, SpeculativeDecoder]:
    drafter = ModelDrafter(m.drafter, m.draft_ctx, p_min=0.0)
    return {
        "plain": SpeculativeDecoder(m.target, m.ctx),
        "model": SpeculativeDecoder(m.target, m.ctx, drafter=drafter, controller=DepthController(k_max=8, fixed=4)),
        "suffix": SpeculativeDecoder(m.target, m.ctx, ngram=SuffixDrafter(2),
                                     controller=DepthController(k_max=8, fixed=4)),
    }


GREEDY = {"temperature": 0.0, "max_tokens": 32}


def test_a_bias_of_minus_100_bans_a_token_and_plus_100_forces_it(same: Models) -> None:
    prompt = same.target.tokenize(REPETITIVE, add_special=True)
    plain, _, _, _ = answer(SpeculativeDecoder(same.target, same.ctx), prompt, SamplingSettings(**GREEDY))
    banned = Counter(plain).most_common(1)[0][0]
    forced = next(t for t in range(5, same.target.n_vocab) if t not in plain)
    for name, decoder in decoders(same).items():
        out, _, _, _ = answer(decoder, prompt, SamplingSettings(**GREEDY, logit_bias=((banned, -100.0),)))
        assert len(out) == GREEDY["max_tokens"], name
        assert banned not in out, name
        out, _, drafted, accepted = answer(decoder, prompt, SamplingSettings(**GREEDY, logit_bias=((forced, 100.0),)))
        assert out == [forced] * GREEDY["max_tokens"], name
        if name != "plain":
            # The drafters draft under the same bias: the model drafter (the target's weights) is always right,
            # and the suffix drafter copies the forced run once it has one.
            assert drafted > 0, name
            assert accepted == drafted if name == "model" else accepted > 0, name


def test_greedy_speculation_equals_plain_under_penalties_and_bias(same: Models) -> None:
    prompt = same.target.tokenize(REPETITIVE, add_special=True)
    settings = SamplingSettings(**GREEDY, presence_penalty=0.9, frequency_penalty=0.4, repeat_penalty=1.1,
                                repeat_last_n=10, logit_bias=((106, -3.0), (264, 2.0))).validate()
    runs = {name: answer(decoder, prompt, settings) for name, decoder in decoders(same).items()}
    unadjusted, _, _, _ = answer(SpeculativeDecoder(same.target, same.ctx), prompt, SamplingSettings(**GREEDY))
    assert runs["plain"][0] != unadjusted  # the adjustment changed the answer
    for name, (out, _, _, _) in runs.items():
        assert out == runs["plain"][0], name
    _, _, drafted, accepted = runs["model"]
    assert drafted > 0
    assert accepted == drafted  # the drafter (the target's weights) drafted under the same adjustment


def test_a_bias_outside_the_vocabulary_is_refused_and_the_engine_goes_on(same: Models) -> None:
    prompt = same.target.tokenize(PROSE, add_special=True)
    decoder = decoders(same)["model"]
    n_vocab = same.target.n_vocab
    bad = SamplingSettings(**GREEDY, logit_bias=((7, 1.0), (n_vocab, 2.0))).validate()  # valid until the model
    with pytest.raises(SettingsError, match=rf"token {n_vocab}, but this model's vocabulary has {n_vocab} tokens"):
        answer(decoder, prompt, bad)
    out, _, _, _ = answer(decoder, prompt, SamplingSettings(**GREEDY, logit_bias=((n_vocab - 1, 1.0),)))
    assert len(out) == GREEDY["max_tokens"]


# --- log probabilities -----------------------------------------------------------------------------------------


# A plain decode's rows are the reference's own one-token rows: they agree to float32 rounding (measured: 1e-6).
# A verify pass's rows come from a batched decode, whose float32 logits differ from one-token ones by up to 3e-3
# on this model (measured at widths 2 to 9); a log-softmax moves by at most twice the largest logit change.
PLAIN_TOL = 1e-5
BATCHED_TOL = 1e-2


def reference_logprobs(m: Models, prompt: list[int], out: list[int], settings: SamplingSettings) -> list[
        npt.NDArray[np.float64]]:
    """The log-softmax of the adjusted row after each prefix, from a fresh one-token-at-a-time decode."""
    m.exact_ctx.clear()
    row = np.array(m.exact_ctx.prefill(prompt)[-1])
    tokens = list(prompt)
    rows = []
    for tok in out:
        recent = np.array(tokens[-settings.repeat_last_n :], dtype=np.int64)
        x = sampling.adjust(row, settings, recent).astype(np.float64)
        rows.append(x - (x.max() + math.log(np.exp(x - x.max()).sum())))
        tokens.append(tok)
        row = np.array(m.exact_ctx.decode([tok])[-1])
    return rows


@pytest.mark.parametrize("adjusted", [False, True], ids=["plain-settings", "penalties-and-bias"])
def test_logprobs_are_the_targets_from_the_verify_rows(same: Models, adjusted: bool) -> None:
    prompt = same.target.tokenize(REPETITIVE, add_special=True)
    extra: dict[str, Any] = {"presence_penalty": 0.9, "frequency_penalty": 0.4, "repeat_last_n": 10,
                             "logit_bias": ((106, -3.0), (264, 2.0))} if adjusted else {}
    settings = SamplingSettings(**GREEDY, **extra, logprobs=True, top_logprobs=5).validate()
    runs = {name: answer(decoder, prompt, settings) for name, decoder in decoders(same).items()}
    out, plain_lps, _, _ = runs["plain"]
    assert runs["model"][3] > GREEDY["max_tokens"] // 2  # most tokens came from multi-token verify passes
    expected = reference_logprobs(same, prompt, out, settings)
    for name, (tokens, lps, _, _) in runs.items():
        assert tokens == out, name
        assert len(lps) == len(out)
        tol = PLAIN_TOL if name == "plain" else BATCHED_TOL
        for tok, lp, ref, plain_lp in zip(tokens, lps, expected, plain_lps, strict=True):
            assert lp.logprob == pytest.approx(ref[tok], abs=tol), name
            assert lp.logprob == pytest.approx(plain_lp.logprob, abs=tol), name  # speculation on and off
            assert lp.token_bytes == same.target.piece(tok)
            assert lp.token == same.target.piece(tok).decode("utf-8", errors="replace")
            assert len(lp.top) == 5
            assert lp.top[0].token_bytes == lp.token_bytes
            assert lp.top[0].logprob == lp.logprob
            assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
            assert [t.logprob for t in lp.top] == pytest.approx(sorted(ref, reverse=True)[:5], abs=tol)


def test_logprobs_are_off_unless_asked_and_sampled_answers_have_them(models: Models) -> None:
    prompt = models.target.tokenize(PROSE, add_special=True)
    out, lps, _, _ = answer(model_decoder(models), prompt, SamplingSettings(**SAMPLED, seed=5))
    assert out
    assert lps == []
    out, lps, _, _ = answer(model_decoder(models), prompt, SamplingSettings(**ADJUSTED_PROSE, seed=5, logprobs=True))
    assert len(lps) == len(out) == LENGTH
    assert all(-50 < lp.logprob <= 0 and lp.top == () for lp in lps)


YES_NO = json.dumps({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
                     "additionalProperties": False})


def test_logprobs_under_a_grammar_are_finite_and_masked(same: Models) -> None:
    """Where the grammar allows fewer tokens than asked for, the rest of the top read -9999 (not -inf or NaN),
    and the emitted tokens' figures are the masked rows' own, with speculation on and off."""
    prompt = same.target.tokenize('As JSON: {"answer": "yes"} {"answer": "no"} {"answer":', add_special=True)
    settings = SamplingSettings(temperature=0.0, max_tokens=12, response_format=YES_NO, logprobs=True,
                                top_logprobs=20)
    runs = {name: answer(decoder, prompt, settings) for name, decoder in decoders(same).items()}
    out, lps, _, _ = runs["plain"]
    assert out
    figures = [t.logprob for lp in lps for t in (lp, *lp.top)]
    assert all(math.isfinite(x) for x in figures)
    assert sampling.NO_LOGPROB in figures  # some position allowed fewer than 20 tokens
    assert all(lp.logprob > sampling.NO_LOGPROB for lp in lps)
    for name, (tokens, spec_lps, _, _) in runs.items():
        assert tokens == out, name
        assert [lp.logprob for lp in spec_lps] == pytest.approx([lp.logprob for lp in lps], abs=BATCHED_TOL), name


def test_log_softmax_and_the_top_ids() -> None:
    row = np.array([1.0, 3.0, -np.inf, 3.0, 0.0], dtype=np.float32)
    lp = sampling.log_softmax(row)
    assert np.exp(lp[[0, 1, 3, 4]]).sum() == pytest.approx(1.0)
    assert lp[2] == sampling.NO_LOGPROB
    assert sampling.most_likely(lp, 3).tolist() == [1, 3, 0]  # a tie in id order, as argmax picks
    assert sampling.most_likely(lp, 1).tolist() == [1]
    assert sampling.most_likely(lp, 9).tolist() == [1, 3, 0, 4, 2]
    assert sampling.most_likely(lp, 0).tolist() == []
    assert np.all(sampling.log_softmax(np.full(3, -np.inf, dtype=np.float32)) == sampling.NO_LOGPROB)


# --- the settings ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    ({"presence_penalty": math.nan}, "Presence penalty must be a finite number"),
    ({"presence_penalty": 2.5}, "Presence penalty must be between -2 and 2; 2.5 is out of range"),
    ({"frequency_penalty": -math.inf}, "Frequency penalty must be a finite number"),
    ({"frequency_penalty": -2.01}, "Frequency penalty must be between -2 and 2"),
    ({"frequency_penalty": "1"}, "Frequency penalty must be a number"),
    ({"logit_bias": ((5, math.nan),)}, "The logit bias of token 5 must be a finite number"),
    ({"logit_bias": ((5, math.inf),)}, "The logit bias of token 5 must be a finite number"),
    ({"logit_bias": ((5, 100.5),)}, "The logit bias of token 5 must be between -100 and 100"),
    ({"logit_bias": ((-1, 1.0),)}, "A logit bias's token id must be between 0 and"),
    ({"logit_bias": ((1.5, 1.0),)}, "A logit bias's token id must be a whole number"),
    ({"logit_bias": (("5", 1.0),)}, "A logit bias's token id must be a number"),
    ({"logit_bias": ((5, 1.0, 2.0),)}, r"Logit bias must be a list of \(token id, bias\) pairs"),
    ({"logit_bias": {5: 1.0}}, r"Logit bias must be a list of \(token id, bias\) pairs"),
    ({"logit_bias": ((5, 1.0), (5, 2.0))}, "Logit bias lists token 5 twice"),
    ({"logit_bias": tuple((t, 1.0) for t in range(MAX_LOGIT_BIAS + 1))}, "Logit bias takes at most 1024 tokens"),
    ({"logprobs": 1}, "Log probabilities must be true or false"),
    ({"logprobs": True, "top_logprobs": 21}, "Top log probabilities must be between 0 and 20"),
    ({"logprobs": True, "top_logprobs": -1}, "Top log probabilities must be between 0 and 20"),
    ({"top_logprobs": 3}, "Top log probabilities need log probabilities turned on"),
])
def test_bad_settings_are_refused_in_a_sentence(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        SamplingSettings(**change).validate()


def test_good_settings_pass() -> None:
    SamplingSettings(presence_penalty=-2.0, frequency_penalty=2.0, logprobs=True, top_logprobs=20,
                     logit_bias=tuple((t, -100.0 + t / 10) for t in range(MAX_LOGIT_BIAS))).validate()
