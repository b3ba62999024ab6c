"""Speculative sampling is lossless: with a drafter, the first tokens of an answer follow the target's own
distribution, and a deliberately broken acceptance rule is caught by the same test.

The reference is exact, not another sample: the target's probability of every likely 3-token continuation
is computed from its logits (a fresh decode per prefix, through the same ``sampling.distribution``), and the
speculative samples are compared with it by a chi-square goodness-of-fit test. Bins are the continuations
expected at least 5 times; everything else (rarer continuations, answers ended early by an EOG token) is one
more bin, so no outcome is dropped. Seeds are fixed, so the figures are reproducible.

Measured here (20,000 answers of 3 tokens, 269-token vocabulary, ~190 bins): the target alone p ≈ 0.13, the
perturbed model drafter p ≈ 0.93, the n-gram drafter p ≈ 0.24. Accepting every draft token gives chi-square
16,580 on 81 degrees of freedom (model drafter) and 59,150 on 47 (n-gram) with 5,000 answers: p = 0. Before
the fix in ``ModelDrafter.propose`` (it stopped drafting when the token it had just *sampled* was unlikely,
which drops unlikely draws), the model drafter gave p ≈ 1e-97, so this test also guards that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import scipy.stats

from app.engine import sampling
from app.engine.adaptive import DepthController
from app.engine.drafters import Draft, ModelDrafter
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.speculative import SpeculativeDecoder
from app.engine.suffix_tree import SuffixDrafter
from app.events import PassStats, Token
from app.params import SamplingSettings

N_SAMPLES = 20_000
N_BROKEN = 5_000  # the broken rule is off by orders of magnitude; fewer answers keep the test quick
LENGTH = 3
MIN_EXPECTED = 5.0
# Seeds are fixed, but each CPU rounds its own way, so every machine draws its own samples: a lossless
# rule still fails a test at rate ALPHA per machine. 0.1 % keeps such false alarms rare; a broken rule
# scores orders of magnitude below it.
ALPHA = 0.001
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_threads=1)
FULL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "max_tokens": LENGTH}


# --- chi-square ------------------------------------------------------------------------------------


def chi2_sf(stat: float, df: int) -> float:
    return float(scipy.stats.chi2.sf(stat, df))


# --- fixtures -----------------------------------------------------------------------------------


class Models:
    def __init__(self, target: Path, drafter: Path) -> None:
        init_backend(None)
        self.target = Model(target, n_gpu_layers=0)
        self.drafter = Model(drafter, n_gpu_layers=0)
        self.ctx = Context(self.target, PARAMS)
        self.draft_ctx = Context(self.drafter, PARAMS)
        self.exact_ctx = Context(self.target, PARAMS)

    def close(self) -> None:
        for ctx in (self.ctx, self.draft_ctx, self.exact_ctx):
            ctx.close()
        self.drafter.close()
        self.target.close()


@pytest.fixture(scope="module")
def models(tiny_target: Path, tiny_drafter_perturbed: Path) -> Iterator[Models]:
    m = Models(tiny_target, tiny_drafter_perturbed)
    yield m
    m.close()


class AcceptEverything(SpeculativeDecoder):
    """The broken rule: every draft token is accepted, whatever the target thinks of it."""

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
        emitted = list(draft.tokens)
        emitted.append(sampling.distribution(rows[len(emitted)], settings).sample(rng))
        return emitted, [True] * len(draft.tokens)


# --- the statistics -----------------------------------------------------------------------------


def exact_bins(m: Models, prompt: list[int], n: int, options: dict[str, Any] = FULL) -> dict[tuple[int, ...], float]:
    """The target's probability of every full-length continuation expected at least MIN_EXPECTED times."""
    settings = SamplingSettings(**options)

    def dist_after(prefix: list[int]) -> sampling.Dist:
        m.exact_ctx.clear()
        row = m.exact_ctx.prefill(prefix)
        recent = np.array(prefix[-settings.repeat_last_n :], dtype=np.int64) if settings.repeat_penalty != 1.0 else None
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


def sample_answers(decoder: SpeculativeDecoder, prompt: list[int], n: int, options: dict[str, Any] = FULL,
                   *, seeded: bool = True) -> tuple[Counter[tuple[int, ...]], int, int]:
    """n answers of LENGTH tokens with seeds 0..n-1 (the seeded draws: a draft is kept when it equals the
    target's draw), or unseeded (the min(1, p/q) test and its residual); also the number of draft tokens the
    target verified and the number of passes that verified two draft tokens or more."""
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = deep = 0
    decoder.reset_cache()
    for seed in range(n):
        out: list[int] = []
        for event in decoder.generate(prompt, SamplingSettings(**options, seed=seed if seeded else -1)):
            if isinstance(event, Token):
                out += event.token_ids
            elif isinstance(event, PassStats):
                drafted += event.drafted
                deep += event.drafted >= 2
        counts[tuple(out)] += 1
    return counts, drafted, deep


def goodness_of_fit(
    counts: Counter[tuple[int, ...]], bins: dict[tuple[int, ...], float], n: int
) -> tuple[float, int, float]:
    """(chi-square statistic, degrees of freedom, p-value) of the observed answers against ``bins``."""
    observed = [counts.get(key, 0) for key in bins]
    expected = [n * p for p in bins.values()]
    observed.append(n - sum(observed))  # everything else, including answers cut short by an EOG token
    expected.append(n - sum(expected))
    assert expected[-1] >= MIN_EXPECTED
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    df = len(observed) - 1
    return stat, df, chi2_sf(stat, df)


PROSE = "Hello there, the quick brown fox"
REPETITIVE = "abc abd abc abd abc abd abc ab"  # the last two tokens occurred before: the n-gram drafter drafts


def model_decoder(m: Models, cls: type[SpeculativeDecoder] = SpeculativeDecoder) -> SpeculativeDecoder:
    # p_min 0.5 makes the drafter stop early in about a third of the passes, so that path is exercised too.
    drafter = ModelDrafter(m.drafter, m.draft_ctx, p_min=0.5)
    return cls(m.target, m.ctx, drafter=drafter, controller=DepthController(k_max=8, fixed=3))


def ngram_decoder(m: Models, cls: type[SpeculativeDecoder] = SpeculativeDecoder) -> SpeculativeDecoder:
    return cls(m.target, m.ctx, ngram=SuffixDrafter(2), controller=DepthController(k_max=8, fixed=3))


def test_target_alone_fits_its_exact_distribution(models: Models) -> None:
    """The control: the reference and the test statistic are right, so a pass below means something."""
    prompt = models.target.tokenize(PROSE, add_special=True)
    bins = exact_bins(models, prompt, N_SAMPLES)
    assert len(bins) > 50  # a spread-out distribution, not a near point mass
    counts, drafted, _ = sample_answers(SpeculativeDecoder(models.target, models.ctx), prompt, N_SAMPLES)
    assert drafted == 0
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLES)
    assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
def test_model_drafter_is_lossless(models: Models, seeded: bool) -> None:
    prompt = models.target.tokenize(PROSE, add_special=True)
    bins = exact_bins(models, prompt, N_SAMPLES)
    counts, drafted, deep = sample_answers(model_decoder(models), prompt, N_SAMPLES, seeded=seeded)
    # Most answers had their 2nd (and often 3rd) token drafted, so acceptance and the residual both mattered.
    assert drafted > N_SAMPLES
    # Drafts of two and three tokens were verified too: the drafter's stop rule reads its most likely
    # token's probability (with top-p 1 a Dist's ids are unordered, and its first probability is arbitrary).
    assert deep > N_SAMPLES // 4
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLES)
    assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


# Every filter on, and a repetition penalty over the prompt and the answer.
FILTERED = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02, "repeat_penalty": 1.3,
            "repeat_last_n": 8, "max_tokens": LENGTH}
N_FILTERED = 10_000


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
def test_model_drafter_is_lossless_with_every_filter_and_penalties(models: Models, seeded: bool) -> None:
    prompt = models.target.tokenize(PROSE, add_special=True)
    bins = exact_bins(models, prompt, N_FILTERED, FILTERED)
    assert len(bins) > 20
    drafter = ModelDrafter(models.drafter, models.draft_ctx, p_min=0.3)
    decoder = SpeculativeDecoder(models.target, models.ctx, drafter=drafter,
                                 controller=DepthController(k_max=8, fixed=3))
    counts, drafted, deep = sample_answers(decoder, prompt, N_FILTERED, FILTERED, seeded=seeded)
    assert drafted > N_FILTERED
    assert deep > N_FILTERED // 4  # drafts of depth 2 and 3 were verified
    stat, df, p = goodness_of_fit(counts, bins, N_FILTERED)
    assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
def test_ngram_drafter_is_lossless(models: Models, seeded: bool) -> None:
    prompt = models.target.tokenize(REPETITIVE, add_special=True)
    bins = exact_bins(models, prompt, N_SAMPLES)
    counts, drafted, _ = sample_answers(ngram_decoder(models), prompt, N_SAMPLES, seeded=seeded)
    assert drafted >= N_SAMPLES  # the first pass of every answer carried an n-gram draft
    stat, df, p = goodness_of_fit(counts, bins, N_SAMPLES)
    assert p > ALPHA, f"chi2 {stat:.1f}, df {df}, p {p:.3g}"


@pytest.mark.parametrize(("text", "make"), [(PROSE, model_decoder), (REPETITIVE, ngram_decoder)],
                         ids=["model", "ngram"])
def test_broken_acceptance_rule_is_detected(models: Models, text: str, make) -> None:  # type: ignore[no-untyped-def]
    prompt = models.target.tokenize(text, add_special=True)
    bins = exact_bins(models, prompt, N_BROKEN)
    counts, drafted, _ = sample_answers(make(models, AcceptEverything), prompt, N_BROKEN)
    assert drafted > 0
    stat, df, p = goodness_of_fit(counts, bins, N_BROKEN)
    assert p < ALPHA, f"the broken rule went unnoticed: chi2 {stat:.1f}, df {df}, p {p:.3g}"


# --- the pieces of the rule ---------------------------------------------------------------------


def test_residual_is_the_normalised_positive_part() -> None:
    p = sampling.Dist(np.array([3, 1, 2], dtype=np.int64), np.array([0.5, 0.3, 0.2]))
    q = sampling.Dist(np.array([1, 3, 7], dtype=np.int64), np.array([0.6, 0.3, 0.1]))
    r = sampling.residual(p, q)
    # max(0, p - q): token 3 -> 0.2, token 1 -> 0, token 2 -> 0.2; normalised to 0.5 each.
    assert dict(zip(r.ids.tolist(), r.probs.tolist(), strict=True)) == pytest.approx({3: 0.5, 2: 0.5})
    # Accept-or-residual reproduces p exactly: min(p, q) + P(reject) * residual.
    reject = sum(max(0.0, q.prob(t) - p.prob(t)) for t in (1, 3, 7))
    for t in (1, 2, 3):
        assert min(p.prob(t), q.prob(t)) + reject * r.prob(t) == pytest.approx(p.prob(t))


def test_distribution_filters() -> None:
    def as_map(d: sampling.Dist) -> dict[int, float]:  # a Dist's ids come in no particular order
        return dict(zip(d.ids.tolist(), d.probs.tolist(), strict=True))

    row = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=np.float32))
    full = as_map(sampling.distribution(row, SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)))
    assert [full[i] for i in range(5)] == pytest.approx([0.5, 0.25, 0.125, 0.0625, 0.0625])
    top2 = as_map(sampling.distribution(row, SamplingSettings(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)))
    assert sorted(top2) == [0, 1]
    assert [top2[0], top2[1]] == pytest.approx([2 / 3, 1 / 3])
    nucleus = sampling.distribution(row, SamplingSettings(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0))
    assert sorted(nucleus.ids.tolist()) == [0, 1]
    minp = sampling.distribution(row, SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2))
    assert sorted(minp.ids.tolist()) == [0, 1, 2]
    wide = np.random.default_rng(0).normal(size=262_144).astype(np.float32)
    big = sampling.distribution(wide, SamplingSettings(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0))
    order = np.argsort(-wide.astype(np.float64), kind="stable")
    p_all = np.exp(wide.astype(np.float64) - wide.max())
    p_all /= p_all.sum()
    expected_n = int(np.searchsorted(np.cumsum(p_all[order]), 0.9, side="left")) + 1
    assert sorted(big.ids.tolist()) == sorted(order[:expected_n].tolist())  # the nucleus, found without a full sort
    greedy = sampling.distribution(row, SamplingSettings(temperature=0.0))
    assert greedy.ids.tolist() == [0]
    assert greedy.probs.tolist() == [1.0]


# --- a fixed seed ---------------------------------------------------------------------------------


def test_a_fixed_seed_gives_one_answer_at_every_depth(models: Models) -> None:
    """The same seed: the same tokens from plain decoding, from a model drafter at three fixed depths, from
    the suffix drafter and from the adaptive depth (each pass drafts a different number of tokens)."""
    prompt = models.target.tokenize(REPETITIVE, add_special=True)
    drafter = ModelDrafter(models.drafter, models.draft_ctx, p_min=0.0)
    decoders = {
        "plain": SpeculativeDecoder(models.target, models.ctx),
        **{f"model k={k}": SpeculativeDecoder(models.target, models.ctx, drafter=drafter,
                                              controller=DepthController(k_max=8, fixed=k)) for k in (1, 3, 6)},
        "suffix": ngram_decoder(models),
        "adaptive": SpeculativeDecoder(models.target, models.ctx, drafter=drafter, ngram=SuffixDrafter(2),
                                       controller=DepthController(k_max=8)),
    }
    for seed in (3, 11):
        settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24, seed=seed)
        answers: dict[str, list[int]] = {}
        drafted = 0
        for name, decoder in decoders.items():
            decoder.reset_cache()
            out: list[int] = []
            for event in decoder.generate(prompt, settings):
                if isinstance(event, Token):
                    out += event.token_ids
                elif isinstance(event, PassStats):
                    drafted += event.drafted
            answers[name] = out
        assert drafted > 0
        assert len(answers["plain"]) > 1
        assert all(answer == answers["plain"] for answer in answers.values()), answers


def test_the_seeded_draws_sample_the_distribution() -> None:
    """The Gumbel-max draw from the hashed noise, over many positions, against the distribution itself."""
    dist = sampling.Dist(np.array([5, 17, 200, 3000, 40000], dtype=np.int64),
                         np.array([0.5, 0.25, 0.15, 0.07, 0.03]))
    n = 20_000
    for seed in (0, 1):
        draws = sampling.SeededDraws(seed)
        counts = Counter(draws.token(dist, pos) for pos in range(n))
        observed = [counts[int(t)] for t in dist.ids]
        expected = [n * p for p in dist.probs]
        stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
        assert chi2_sf(stat, len(observed) - 1) > ALPHA, (observed, expected)
    a, b = sampling.SeededDraws(0), sampling.SeededDraws(1)  # the seed is in the noise
    assert [a.token(dist, pos) for pos in range(64)] != [b.token(dist, pos) for pos in range(64)]
