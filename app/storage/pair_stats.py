"""Measured acceptance per (target, drafter) pair, kept across runs so the drafter ranking can use it.

Stored as JSON in the data folder, written atomically. α is Leviathan's: the rate at which the first draft
position is accepted. ``per_position`` is the measured acceptance per draft position (the share of drafts
reaching position i whose first i + 1 tokens were all accepted, as the engine's stats give it): acceptance is
clustered (a copy keeps being accepted, a chance match stops), so the ranking predicts from these rather
than from α alone. A pair's profile is recorded only when one drafter made every draft (a model drafter without
the n-gram drafter, or the n-gram drafter alone), so the figure belongs to that drafter; where both drafted,
the trained drafter's own tokens still give its α (``record_trained_share``). ``idle`` counts the answers in
which a trained drafter drafted nothing at all.

The suffix drafter's pairs also keep ``per_pass``: over every pass, drafted or not, the share with a proposal of
at least i + 1 tokens (``drafted``) and the share whose first i + 1 proposed tokens the target then emitted
(``matched``). The depth policy drafts only where a proposal looks likely to pay, so ``per_position`` comes
mostly from copies; ``per_pass`` is what predicts tokens and cost per pass.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from app.errors import StorageError
from app.events import MessageStats
from app.paths import data_dir
from app.storage.atomic import atomic_write_json, read_json_object

FILE_NAME = "acceptance.json"
NGRAM_KEY = "ngram"  # the drafter half of a measured_acceptance key for the n-gram drafter
MTP_KEY = "mtp"  # ... and for the target's own MTP heads
MIN_DRAFTED = 8  # fewer drafted tokens say too little to keep
# An answer this long in which a trained drafter drafted nothing: the depth policy judged its drafts not worth
# their cost here, which the ranking must hear (its default acceptance would go on predicting a speedup).
IDLE_PASSES = 32
WEIGHT_CAP = 2000.0  # drafted tokens the running mean remembers at most: newer runs keep counting
MAX_POSITIONS = 64  # the widest draft kept per position (the engine drafts at most DEPTH_CAP)


def default_path() -> Path:
    return data_dir() / FILE_NAME


def _key(target: str, drafter: str) -> str:
    return f"{target}\n{drafter}"


def _profile(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(v, float | int) and not isinstance(v, bool) and 0 <= v <= 1 for v in value):
        return None
    return [float(v) for v in value[:MAX_POSITIONS]]


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The pairs' entries; an entry may hold only a measured drafter step (``c``) when nothing was drafted."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in read_json_object(path).items():
        if not (isinstance(key, str) and isinstance(value, dict)):
            continue
        entry: dict[str, Any] = {}
        alpha, weight = value.get("alpha"), value.get("weight")
        if isinstance(alpha, float | int) and isinstance(weight, float | int) and 0 <= alpha <= 1 and weight > 0:
            entry = {"alpha": float(alpha), "weight": float(weight)}
            profile = _profile(value.get("per_position"))
            if profile is not None:
                entry["per_position"] = profile
            per_pass = _per_pass(value.get("per_pass"))
            if per_pass is not None:
                entry["per_pass"] = per_pass
        c = value.get("c")
        if isinstance(c, float | int) and not isinstance(c, bool) and math.isfinite(c) and 0 < c < 100:
            entry["c"] = float(c)
        idle = value.get("idle")
        if isinstance(idle, int) and not isinstance(idle, bool) and idle > 0:
            entry["idle"] = idle
        if entry:
            out[key] = entry
    return out


def _per_pass(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    drafted, matched, weight = _profile(value.get("drafted")), _profile(value.get("matched")), value.get("weight")
    if drafted is None or matched is None or not isinstance(weight, float | int) or isinstance(weight, bool):
        return None
    if not weight > 0 or len(matched) > len(drafted) or any(m > d for m, d in zip(matched, drafted, strict=False)):
        return None
    return {"drafted": drafted, "matched": matched, "weight": float(weight)}


def _by_pair(path: Path | None, name: str) -> dict[tuple[str, str], Any]:
    """{(target path, drafter path or NGRAM_KEY): the entry's ``name``} for the pairs that have it."""
    out: dict[tuple[str, str], Any] = {}
    for key, value in _read(path or default_path()).items():
        if name in value:
            target, _, drafter = key.partition("\n")
            out[(target, drafter)] = value[name]
    return out


def _fold_alpha(old: dict[str, Any], alpha: float, weight: float) -> tuple[float, float, float]:
    """An answer's α of ``weight`` drafted tokens folded into the pair's running mean: (α, weight, the answer's
    share of the mean)."""
    share = weight / (old["weight"] + weight)
    return old["alpha"] + (alpha - old["alpha"]) * share, min(old["weight"] + weight, WEIGHT_CAP), share


def load_measured(path: Path | None = None) -> dict[tuple[str, str], float]:
    """{(target path, drafter path or NGRAM_KEY): measured α}; empty when nothing was measured yet."""
    return _by_pair(path, "alpha")


def load_profiles(path: Path | None = None) -> dict[tuple[str, str], tuple[float, ...]]:
    """{(target path, drafter path or NGRAM_KEY): measured acceptance per position} for the pairs that have one."""
    return {pair: tuple(profile) for pair, profile in _by_pair(path, "per_position").items()}


def load_pass_profiles(path: Path | None = None) -> dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]]:
    """{(target path, NGRAM_KEY): (share of passes with a proposal of ≥ i + 1 tokens, share whose first i + 1
    were right)} for the pairs measured over every pass."""
    return {pair: (tuple(per_pass["drafted"]), tuple(per_pass["matched"]))
            for pair, per_pass in _by_pair(path, "per_pass").items()}


def measured_start(target: str, drafter: str | None) -> float | None:
    """The model drafter's measured acceptance for this pair, to start the depth policy from (None: none)."""
    return load_measured().get((target, drafter)) if drafter else None


def trained_key(drafter_path: str | None, mtp: bool) -> str | None:
    """The trained drafter's half of a key: a drafter file's path, MTP_KEY for the target's own MTP heads."""
    return MTP_KEY if mtp else drafter_path


def drafter_key(trained: str | None, ngram: int) -> str | None:
    """Which drafter a run's figures belong to (``trained``: ``trained_key``'s), or None when two drafters shared
    the drafts."""
    if trained and ngram == 0:
        return trained
    if not trained and ngram > 0:
        return NGRAM_KEY
    return None


def _write(path: Path, table: dict[str, dict[str, Any]]) -> bool:
    try:
        atomic_write_json(path, table)
    except StorageError:  # a full disk only means the figure is not kept: the ranking falls back to its default
        return False
    return True


def _idle_answer(target: str, drafter: str, stats: MessageStats, path: Path) -> bool:
    """Count an answer of IDLE_PASSES or more in which the trained drafter drafted nothing (True if counted)."""
    if drafter == NGRAM_KEY or stats.model_drafted != 0 or stats.passes < IDLE_PASSES:
        return False
    table = _read(path)
    entry = table.get(_key(target, drafter), {})
    entry["idle"] = entry.get("idle", 0) + 1
    table[_key(target, drafter)] = entry
    return _write(path, table)


def record_trained_share(target: str, drafter: str, stats: MessageStats, path: Path | None = None) -> float | None:
    """An answer where the suffix drafter and a trained drafter both drafted: the trained drafter's own tokens
    (accepted over drafted: a lower bound on α, since later positions are accepted less often) folded into the
    pair's α, without a per-position profile; or an idle answer counted. Returns the pair's α (None if not kept)."""
    path = path or default_path()
    if stats.model_drafted < MIN_DRAFTED:
        _idle_answer(target, drafter, stats, path)
        return None
    table = _read(path)
    entry = table.get(_key(target, drafter), {})
    alpha, weight = stats.model_accepted / stats.model_drafted, float(stats.model_drafted)
    if "alpha" in entry:
        alpha, weight, _share = _fold_alpha(entry, alpha, weight)
    entry.update(alpha=alpha, weight=weight)
    table[_key(target, drafter)] = entry
    return alpha if _write(path, table) else None


def load_idle(path: Path | None = None) -> dict[tuple[str, str], int]:
    """{(target path, drafter path): answers in which that trained drafter drafted nothing}."""
    return _by_pair(path, "idle")


def record(target: str, drafter: str, stats: MessageStats, path: Path | None = None) -> float | None:
    """Fold one answer's acceptance into the pair's running mean; returns the pair's α (None if not kept).

    The per-pass shares are kept from an answer that drafted little too (prose is where the policy drafts
    least, and leaving it out would flatter the prediction). A full disk only means the figure is not kept:
    the ranking falls back to its stated default. A trained drafter that drafted nothing in a long answer is
    counted as idle.
    """
    ppa = stats.per_position_acceptance
    drafts = stats.drafted >= MIN_DRAFTED and bool(ppa) and math.isfinite(ppa[0])
    passes = stats.proposal_passes >= MIN_DRAFTED and bool(stats.proposal_lengths)
    path = path or default_path()
    if not drafts and not passes:
        _idle_answer(target, drafter, stats, path)
        return None
    table = _read(path)
    kept = table.get(_key(target, drafter))
    old = kept if kept is not None and "alpha" in kept else None  # a measured step alone says nothing of α
    if drafts:
        alpha, weight = ppa[0], float(stats.drafted)
        finite = [math.isfinite(a) for a in ppa]
        profile = _profile(list(ppa[: finite.index(False) if False in finite else None])) or []
        if old is not None:
            alpha, weight, share = _fold_alpha(old, alpha, weight)
            before = old.get("per_position", [])
            # Positions measured on both sides move by this answer's share; the rest keep whichever side has them.
            profile = [b + (a - b) * share for a, b in zip(profile, before, strict=False)] + (
                profile[len(before):] or before[len(profile):])
    elif old is not None:
        alpha, weight, profile = old["alpha"], old["weight"], old.get("per_position", [])
    else:  # nothing drafted yet: α is the share of proposals whose first token was right
        alpha = stats.proposal_matches[0] / stats.proposal_lengths[0] if stats.proposal_matches else 0.0
        weight, profile = 1.0, []
    entry: dict[str, Any] = {"alpha": alpha, "weight": weight, "per_position": profile[:MAX_POSITIONS]}
    for kept_field in ("c", "idle"):
        if kept is not None and kept_field in kept:
            entry[kept_field] = kept[kept_field]
    per_pass = _fold_passes(old.get("per_pass") if old is not None else None, stats) if passes else (
        old.get("per_pass") if old is not None else None)
    if per_pass is not None:
        entry["per_pass"] = per_pass
    table[_key(target, drafter)] = entry
    return alpha if _write(path, table) else None


def _fold_passes(old: dict[str, Any] | None, stats: MessageStats) -> dict[str, Any] | None:
    """The pair's per-pass shares with this answer's passes folded in (its passes' share of the weight)."""
    passes = stats.proposal_passes
    if passes <= 0:
        return old
    drafted = [n / passes for n in stats.proposal_lengths[:MAX_POSITIONS]]
    matched = [n / passes for n in stats.proposal_matches[:MAX_POSITIONS]]
    if old is None:
        return {"drafted": drafted, "matched": matched, "weight": float(passes)}
    share = passes / (old["weight"] + passes)

    def fold(new: list[float], before: list[float]) -> list[float]:
        # A position missing on one side had no proposal that long there: its share is 0, not unknown.
        n = max(len(new), len(before))
        new, before = new + [0.0] * (n - len(new)), before + [0.0] * (n - len(before))
        return [b + (a - b) * share for a, b in zip(new, before, strict=True)]

    return {"drafted": fold(drafted, old["drafted"]), "matched": fold(matched, old["matched"]),
            "weight": min(old["weight"] + passes, WEIGHT_CAP)}


def record_step_cost(target: str, drafter: str, c: float, path: Path | None = None) -> None:
    """Keep a model drafter's measured step cost, c (a drafter step over a one-token target pass), for the pair.

    On a CPU two small models compete for the same cores, so a step costs far more than the drafter's weight
    bytes say (0.69 against 0.36 for SmolLM2's Q4_1 drafting for its F16); the ranking uses this figure. It is
    kept even when the policy drafted nothing: that is the case where the step's cost matters most."""
    if not math.isfinite(c) or c <= 0:
        return
    path = path or default_path()
    table = _read(path)
    entry = table.get(_key(target, drafter), {})
    entry["c"] = c
    table[_key(target, drafter)] = entry
    _write(path, table)


def load_step_costs(path: Path | None = None) -> dict[tuple[str, str], float]:
    """{(target path, drafter path): measured c} for the pairs whose drafter step was timed."""
    return _by_pair(path, "c")
