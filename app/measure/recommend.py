"""Which drafter should I pick? Compatible drafters ranked by predicted speedup (Leviathan et al. 2023).

On a bandwidth-bound device a drafter step costs about its weight bytes over the target's, c. A verify pass
of depth k yields 1 + Σ_{i≤k} Π_{j≤i} a_j tokens on average, a_j being the chance that position j is accepted
given the earlier ones were, and costs k·c + 1 target-step times; the speedup is the ratio and the best k
maximises it. Both are the depth policy's own (``app.ceiling.speculation.expected_tokens``, which the policy
uses too, and ``app.engine.adaptive.best_depth``).
The rates are the pair's acceptance measured per position in earlier runs (``app.storage.pair_stats``):
acceptance is clustered, so the i.i.d. rule (1 − α^(k+1)) / (1 − α) from one α misjudges both the tokens and
the depth. Without a profile, the pair's measured α (or a stated default) is used at every position, i.i.d.
The suffix drafter (text match) costs nothing to run and is always listed as the free option. Trained heads
are ranked beside the drafter models: the target's own MTP heads with a step of one MTP block and the output
layer, an EAGLE-3 or DFlash file with its weight bytes (DFlash drafts a block in one pass, so that overstates its
cost), each with the step measured beside the target wherever a bench measured it.

A CPU is not bandwidth-bound: a pass of k + 1 tokens can cost several one-token passes. Where this machine's
verify-cost curve for the target was measured (``app.storage.verify_cost``, kept by bench and tune), the
prediction divides by that measured cost instead, and says so; the bandwidth-bound (GPU-style) figure is
kept beside it, labelled as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from app.ceiling.mtp_heads import mtp_step_ratio
from app.ceiling.speculation import bandwidth_bound_pass, expected_tokens, expected_tokens_per_pass
from app.engine.adaptive import MODEL_PRIOR, best_depth, conditional
from app.library.compat import CompatResult, VocabInfo, check_compatible
from app.library.discovery import LibraryEntry, compatible_drafters, head_offers
from app.library.gguf_reader import GGUFInfo
from app.library.heads import HeadOffer
from app.params import K_MAX
from app.storage.pair_stats import MTP_KEY, NGRAM_KEY
from app.storage.verify_cost import VerifyCurve

DEFAULT_ACCEPTANCE = MODEL_PRIOR  # the depth policy's own start for a pair never measured
NGRAM_DEFAULT_ACCEPTANCE = 0.3  # depends on how much the answer repeats the prompt (code edits: more)
_NO_MEASUREMENTS: Mapping[tuple[str, str], float] = MappingProxyType({})
BANDWIDTH_BOUND = "a bandwidth-bound device (GPU-style figure: no verify cost measured here for this target)"


def acceptance_rates(alpha: float, profile: Sequence[float], k_max: int) -> tuple[list[float], int]:
    """(rate per position, deepest depth to consider): from a measured profile (cumulative per position, as
    the engine's stats give it) never deeper than it was measured, as the depth policy drafts; else i.i.d."""
    if profile:
        return conditional(profile[:k_max]), min(k_max, len(profile))
    return [alpha] * k_max, k_max


def predict(rates: Sequence[float], limit: int, c: float, curve: VerifyCurve | None = None,
            drafted: Sequence[float] = ()) -> tuple[int, float, float]:
    """(best k, tokens per pass, speedup over plain decoding) with a drafter step costing c target passes, on
    this machine's measured pass costs when ``curve`` is given, else on a bandwidth-bound device; ``drafted``:
    the share of passes with a draft of at least i + 1 tokens to offer (default: every pass)."""
    verify = curve.relative if curve is not None else bandwidth_bound_pass
    k, rate = best_depth(rates, limit, verify, draft_step=c, drafted=drafted)
    return k, expected_tokens(rates, k), rate * verify(1)


def best_k(alpha: float, c: float, k_max: int = K_MAX) -> tuple[int, float]:
    """(k, speedup) on a bandwidth-bound device for an i.i.d. acceptance α (0: do not draft)."""
    k, _tau, s = predict([alpha] * k_max, k_max, c)
    return k, s


@dataclass(frozen=True)
class Recommendation:
    drafter_path: str | None  # None for the n-gram drafter and the target's own MTP heads
    name: str
    kind: str  # "model", "mtp" (the target's own heads), "head" (an EAGLE-3 or DFlash file) or "ngram"
    cost_ratio: float  # c: drafter bytes ÷ target bytes (0 for n-gram)
    acceptance: float  # α used
    acceptance_source: str  # "measured per position", "measured" (α only), "measured: drafted nothing", "default"
    best_k: int
    tokens_per_pass: float
    speedup: float
    note: str  # one sentence: why this prediction
    curve: str = BANDWIDTH_BOUND  # which pass-cost curve ``speedup`` used, in words
    bandwidth_speedup: float = 0.0  # the bandwidth-bound (GPU-style) figure, for reference
    per_position: tuple[float, ...] = ()  # the measured acceptance per position the prediction used, if any


def _acceptance(measured: Mapping[tuple[str, str], float], profiles: Mapping[tuple[str, str], Sequence[float]],
                key: tuple[str, str], default: float) -> tuple[float, str, tuple[float, ...]]:
    """(α, where it comes from, the per-position profile or ())."""
    profile = tuple(profiles.get(key, ()))
    if profile and all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in profile):
        return profile[0], "measured per position", profile
    value = measured.get(key)
    if value is not None and math.isfinite(value) and 0.0 <= value <= 1.0:
        return value, "measured", ()
    return default, "default", ()


def _source_words(source: str) -> str:
    return {"measured per position": "measured per position for this pair",
            "measured": "measured for this pair, i.i.d. per position"}.get(source, "default, not yet measured")


def recommend_drafters(
    target: GGUFInfo,
    candidates: Sequence[GGUFInfo],
    measured_acceptance: Mapping[tuple[str, str], float] = _NO_MEASUREMENTS,
    *,
    default_acceptance: float = DEFAULT_ACCEPTANCE,
    k_max: int = K_MAX,
    verify_curves: Mapping[str, VerifyCurve] | None = None,
    profiles: Mapping[tuple[str, str], Sequence[float]] | None = None,
    pass_profiles: Mapping[tuple[str, str], tuple[Sequence[float], Sequence[float]]] | None = None,
    step_costs: Mapping[tuple[str, str], float] | None = None,
    idle: Mapping[tuple[str, str], int] | None = None,
    heads: Sequence[tuple[HeadOffer, int]] = (),
) -> list[Recommendation]:
    """Compatible model drafters and the trained heads that fit (``heads``: each offer with its file's weight
    bytes) ranked by predicted speedup (best first), then the n-gram drafter.
    Candidates that fail llama.cpp's vocabulary rule, are the target itself or are not models are left
    out (the library's compatibility matrix says why). Keys of measured_acceptance and ``profiles`` are
    (target path, drafter path), with NGRAM_KEY as the drafter path for the n-gram drafter.
    ``verify_curves`` ({model path: measured curve}) and ``profiles`` ({pair: acceptance per position})
    default to what was measured on this machine; so does ``idle`` ({pair: answers in which the drafter drafted
    nothing}), which makes a drafter never measured drafting predict plain decoding, not its default. The
    target's own MTP heads are keyed MTP_KEY, kind "mtp"; an EAGLE-3 or DFlash file is kind "head"."""
    if verify_curves is None:
        from app.storage.verify_cost import load_curves

        verify_curves = load_curves()
    if profiles is None:
        from app.storage.pair_stats import load_profiles

        profiles = load_profiles()
    if pass_profiles is None:
        from app.storage.pair_stats import load_pass_profiles

        pass_profiles = load_pass_profiles()
    if step_costs is None:
        from app.storage.pair_stats import load_step_costs

        step_costs = load_step_costs()
    if idle is None:
        from app.storage.pair_stats import load_idle

        idle = load_idle()
    curve = verify_curves.get(target.path)

    def trained(path: str | None, key: str, name: str, kind: str, c_bytes: float) -> Recommendation:
        """The prediction for one trained drafter (a model or a head), ``c_bytes`` its step's c from weight bytes;
        ``key`` its half of the measurements' keys."""
        c = c_bytes
        alpha, source, profile = _acceptance(measured_acceptance, profiles, (target.path, key), default_acceptance)
        rates, limit = acceptance_rates(alpha, profile, k_max)
        k, tau, s = predict(rates, limit, c)
        gpu_style = s
        c_source = "weight bytes, bandwidth-bound"
        if curve is not None:
            own = verify_curves.get(path) if kind == "model" and path else None  # its own one-token pass
            step = step_costs.get((target.path, key))
            if step is not None:  # timed inside the loop, beside this target: what a step really costs here
                c, c_source = step, "measured drafter steps"
            elif own is not None:
                c, c_source = own.widths_ms[1] / curve.widths_ms[1], "measured one-token passes"
            else:
                c_source = "weight bytes"
            k, tau, s = predict(rates, limit, c, curve)
        idle_answers = idle.get((target.path, key), 0)
        if source == "default" and idle_answers:
            # Loaded and asked, it drafted nothing: the depth policy found its drafts not worth their cost here.
            alpha, source, k, tau, s = 0.0, "measured: drafted nothing", 0, 1.0, 1.0
            note = (f"drafted nothing in {idle_answers} answer{'s' if idle_answers > 1 else ''} here: the depth "
                    "policy found that its drafts do not pay on this machine")
        elif curve is not None and k == 0:
            note = (f"a drafter step costs c = {c:.2f} target passes and a pass of 2 costs "
                    f"{curve.relative(2):.2f} of one here: at α = {alpha:.2f} no depth beats plain decoding")
        elif c >= 1.0:
            note = f"the drafter is not smaller than the target (c = {c:.2f}): slower than plain decoding"
        elif s <= 1.0:
            note = f"too large for its acceptance (c = {c:.2f}, α = {alpha:.2f}): no depth beats plain decode"
        else:
            note = f"c = {c:.3f} ({c_source}), α = {alpha:.2f} ({_source_words(source)})"
        return Recommendation(path, name, kind, c, alpha, source, k, tau, s, note,
                              curve.describe() if curve else BANDWIDTH_BOUND, gpu_style, profile)

    target_vocab = VocabInfo.from_gguf(target)
    models: list[Recommendation] = []
    for cand in candidates:
        if cand.kind != "model" or cand.missing_shards or _same_file(cand.path, target.path):
            continue
        if cand.tensor_bytes <= 0 or target.tensor_bytes <= 0:
            continue
        if not check_compatible(target_vocab, VocabInfo.from_gguf(cand)).ok:
            continue
        models.append(trained(cand.path, cand.path, cand.name, "model", cand.tensor_bytes / target.tensor_bytes))
    for offer, head_bytes in heads:
        if not offer.fits or target.tensor_bytes <= 0:
            continue
        if offer.path is None:  # the target's own MTP heads: one block and the output layer a step
            if math.isfinite(step_ratio := mtp_step_ratio(target)):
                models.append(trained(None, MTP_KEY, offer.label, "mtp", step_ratio))
        elif head_bytes > 0:
            models.append(trained(offer.path, offer.path, offer.label, "head", head_bytes / target.tensor_bytes))
    models.sort(key=lambda r: (-r.speedup, r.cost_ratio, r.drafter_path or ""))

    alpha, source, profile = _acceptance(measured_acceptance, profiles, (target.path, NGRAM_KEY),
                                         NGRAM_DEFAULT_ACCEPTANCE)
    rates, limit = acceptance_rates(alpha, profile, k_max)  # the policy's cap, as the engine drafts
    drafted: Sequence[float] = ()
    per_pass = pass_profiles.get((target.path, NGRAM_KEY))
    if per_pass is not None and per_pass[0]:
        # Measured over every pass, drafted or not: how often the text offers a draft, and how often it is right.
        drafted, matched = per_pass
        rates, limit, source = conditional(matched[:k_max]), min(k_max, len(drafted)), "measured per pass"
    k, tau, speedup = predict(rates, limit, 0.0, drafted=drafted)
    gpu_style = speedup
    note = "free: no second model, no extra memory; gains depend on how much the answer repeats the prompt"
    if curve is not None:
        k, tau, speedup = predict(rates, limit, 0.0, curve, drafted)
        if k == 0:
            note = (f"a pass of 2 tokens costs {curve.relative(2):.2f} of one here: at α = {alpha:.2f} drafting "
                    "does not pay on average (long copies still do; the adaptive depth finds them)")
    ngram = Recommendation(
        None, "suffix drafter (text match)", "ngram", 0.0, alpha, source, k, tau,
        speedup, note, curve.describe() if curve else BANDWIDTH_BOUND, gpu_style, profile,
    )
    return [*models, ngram]


def _same_file(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


@dataclass(frozen=True)
class DrafterReport:
    recommendations: list[Recommendation]  # compatible drafters and fitting heads ranked, then the n-gram drafter
    refused: list[tuple[LibraryEntry, CompatResult]]  # models that cannot draft for the target, and why
    heads: list[HeadOffer] = field(default_factory=list)  # own MTP heads, EAGLE-3 and DFlash files, fitting or not


def drafters_for(
    target: GGUFInfo,
    entries: Sequence[LibraryEntry],
    measured_acceptance: Mapping[tuple[str, str], float] | None = None,
    *,
    confirm: bool = True,
) -> DrafterReport:
    """Rank the library's models as drafters for `target` (which need not be in the library); with `confirm`,
    what the fingerprints leave open is decided on the real token texts (``compatible_drafters``)."""
    ok, refused = compatible_drafters(target, entries, confirm=confirm)
    offers = head_offers(target, entries)
    sizes = {e.info.path: e.info.tensor_bytes for e in entries if e.info is not None}
    recs = recommend_drafters(target, ok, measured_acceptance or {},
                              heads=[(o, sizes.get(o.path, 0) if o.path else 0) for o in offers])
    return DrafterReport(recs, refused, offers)


__all__ = [
    "BANDWIDTH_BOUND", "DEFAULT_ACCEPTANCE", "K_MAX", "NGRAM_DEFAULT_ACCEPTANCE", "NGRAM_KEY", "DrafterReport",
    "Recommendation", "acceptance_rates", "best_k", "drafters_for", "expected_tokens_per_pass", "predict",
    "recommend_drafters",
]
