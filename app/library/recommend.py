"""Which drafter should I pick? Compatible drafters ranked by predicted speedup (Leviathan et al. 2023).

On a bandwidth-bound device a drafter step costs about its weight bytes over the target's, c. With a
per-token acceptance α and draft depth k, a verify pass yields (1 − α^(k+1)) / (1 − α) tokens on average
and costs k·c + 1 target-step times, so the speedup is the ratio; the best k maximises it. The acceptance
is the one measured for that pair in earlier runs when SpecDeck has it, otherwise a stated default.
The suffix drafter (text match) costs nothing to run and is always listed as the free option.

A CPU is not bandwidth-bound: a pass of k + 1 tokens can cost several one-token passes. Where this machine's
verify-cost curve for the target was measured (``app.library.verify_cost``, kept by bench and tune), the
prediction divides by that measured cost instead, and says so; the bandwidth-bound (GPU-style) figure is
kept beside it, labelled as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from app.ceiling.roofline import expected_speedup, expected_tokens_per_pass
from app.engine.params import K_MAX
from app.library.compat import VocabInfo, check_compatible
from app.library.gguf_reader import GGUFInfo
from app.library.verify_cost import VerifyCurve

DEFAULT_ACCEPTANCE = 0.6  # a typical same-family small/large pair at greedy
NGRAM_DEFAULT_ACCEPTANCE = 0.3  # depends on how much the answer repeats the prompt (code edits: more)
NGRAM_KEY = "ngram"  # the drafter half of a measured_acceptance key for the n-gram drafter
NGRAM_K_MAX = 8
_NO_MEASUREMENTS: Mapping[tuple[str, str], float] = MappingProxyType({})
BANDWIDTH_BOUND = "a bandwidth-bound device (GPU-style figure: no verify cost measured here for this target)"


def best_k(alpha: float, c: float, k_max: int = K_MAX) -> tuple[int, float]:
    """(k, speedup) for the depth 1..k_max with the highest predicted speedup."""
    best = (1, expected_speedup(alpha, 1, c))
    for k in range(2, k_max + 1):
        s = expected_speedup(alpha, k, c)
        if s > best[1]:
            best = (k, s)
    return best


def measured_speedup(alpha: float, k: int, c: float, curve: VerifyCurve) -> float:
    """Speedup with this machine's measured pass cost: tokens per pass ÷ (cost of a k + 1 pass + k·c)."""
    if k == 0:
        return 1.0
    return expected_tokens_per_pass(alpha, k) / (curve.relative(k + 1) + k * c)


def best_k_measured(alpha: float, c: float, curve: VerifyCurve, k_max: int = K_MAX) -> tuple[int, float]:
    """(k, speedup) for the depth 0..k_max with the highest speedup on the measured curve (0: do not draft)."""
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = measured_speedup(alpha, k, c, curve)
        if s > best[1]:
            best = (k, s)
    return best


@dataclass(frozen=True)
class Recommendation:
    drafter_path: str | None  # None for the n-gram drafter
    name: str
    kind: str  # "model" or "ngram"
    cost_ratio: float  # c: drafter bytes ÷ target bytes (0 for n-gram)
    acceptance: float  # α used
    acceptance_source: str  # "measured" or "default"
    best_k: int
    tokens_per_pass: float
    speedup: float
    note: str  # one sentence: why this prediction
    curve: str = BANDWIDTH_BOUND  # which pass-cost curve ``speedup`` used, in words
    bandwidth_speedup: float = 0.0  # the bandwidth-bound (GPU-style) figure, for reference


def _acceptance(measured: Mapping[tuple[str, str], float], key: tuple[str, str], default: float
                ) -> tuple[float, str]:
    value = measured.get(key)
    if value is not None and math.isfinite(value) and 0.0 <= value <= 1.0:
        return value, "measured"
    return default, "default"


def recommend_drafters(
    target: GGUFInfo,
    candidates: Sequence[GGUFInfo],
    measured_acceptance: Mapping[tuple[str, str], float] = _NO_MEASUREMENTS,
    *,
    default_acceptance: float = DEFAULT_ACCEPTANCE,
    k_max: int = K_MAX,
    verify_curves: Mapping[str, VerifyCurve] | None = None,
) -> list[Recommendation]:
    """Compatible model drafters ranked by predicted speedup (best first), then the n-gram drafter.
    Candidates that fail llama.cpp's vocabulary rule, are the target itself or are not models are left
    out (the library's compatibility matrix says why). Keys of measured_acceptance are
    (target path, drafter path), with NGRAM_KEY as the drafter path for the n-gram drafter.
    ``verify_curves`` ({model path: measured curve}) defaults to the curves measured on this machine."""
    if verify_curves is None:
        from app.library.verify_cost import load_curves

        verify_curves = load_curves()
    curve = verify_curves.get(target.path)
    target_vocab = VocabInfo.from_gguf(target)
    models: list[Recommendation] = []
    for cand in candidates:
        if cand.kind != "model" or cand.missing_shards or _same_file(cand.path, target.path):
            continue
        if cand.tensor_bytes <= 0 or target.tensor_bytes <= 0:
            continue
        if not check_compatible(target_vocab, VocabInfo.from_gguf(cand)).ok:
            continue
        c = cand.tensor_bytes / target.tensor_bytes
        alpha, source = _acceptance(measured_acceptance, (target.path, cand.path), default_acceptance)
        k, s = best_k(alpha, c, k_max)
        gpu_style = s
        c_source = "weight bytes, bandwidth-bound"
        if curve is not None:
            own = verify_curves.get(cand.path)  # a drafter step costs its own one-token pass, where measured
            if own is not None:
                c, c_source = own.widths_ms[1] / curve.widths_ms[1], "measured one-token passes"
            else:
                c_source = "weight bytes"
            k, s = best_k_measured(alpha, c, curve, k_max)
        if curve is not None and k == 0:
            note = (f"a drafter step costs c = {c:.2f} target passes and a pass of 2 costs "
                    f"{curve.relative(2):.2f} of one here: at α = {alpha:.2f} no depth beats plain decoding")
        elif c >= 1.0:
            note = f"the drafter is not smaller than the target (c = {c:.2f}): slower than plain decoding"
        elif s <= 1.0:
            note = f"too large for its acceptance (c = {c:.2f}, α = {alpha:.2f}): no depth beats plain decode"
        else:
            note = (f"c = {c:.3f} ({c_source}), α = {alpha:.2f} "
                    f"({'measured for this pair' if source == 'measured' else 'default, not yet measured'})")
        models.append(Recommendation(cand.path, cand.name, "model", c, alpha, source, k,
                                     expected_tokens_per_pass(alpha, k), s, note,
                                     curve.describe() if curve else BANDWIDTH_BOUND, gpu_style))
    models.sort(key=lambda r: (-r.speedup, r.cost_ratio, r.drafter_path or ""))

    alpha, source = _acceptance(measured_acceptance, (target.path, NGRAM_KEY), NGRAM_DEFAULT_ACCEPTANCE)
    k = min(k_max, NGRAM_K_MAX)
    gpu_style = expected_speedup(alpha, k, 0.0)
    speedup = gpu_style
    note = ("free: no second model, no extra memory; gains depend on how much the answer repeats the prompt or "
            "earlier text")
    if curve is not None:
        k, speedup = best_k_measured(alpha, 0.0, curve, k)
        if k == 0:
            note = (f"a pass of 2 tokens costs {curve.relative(2):.2f} of one here: at α = {alpha:.2f} drafting "
                    "does not pay on average (long copies still do; the adaptive depth finds them)")
    ngram = Recommendation(
        None, "suffix drafter (text match)", "ngram", 0.0, alpha, source, k, expected_tokens_per_pass(alpha, k),
        speedup, note, curve.describe() if curve else BANDWIDTH_BOUND, gpu_style,
    )
    return [*models, ngram]


def _same_file(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


__all__ = [
    "BANDWIDTH_BOUND", "DEFAULT_ACCEPTANCE", "K_MAX", "NGRAM_DEFAULT_ACCEPTANCE", "NGRAM_KEY", "Recommendation",
    "best_k", "best_k_measured", "expected_tokens_per_pass", "measured_speedup", "recommend_drafters",
]
