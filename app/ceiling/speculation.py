"""The arithmetic of speculative decoding (Leviathan et al. 2023): tokens a pass emits from the acceptance per
draft position, and the speedup over plain decoding. Shared by the depth policy (``app.engine.adaptive``), the
drafter ranking (``app.measure.recommend``) and the dashboard's speculative ceiling (``app.ceiling.metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """Tokens a pass of depth k emits on average: 1 + Σ_{i≤k} Π_{j≤i} rates[j], with rates[j] the chance that
    position j is accepted given every earlier one was (equal rates give Leviathan's (1 − α^(k+1))/(1 − α))."""
    total, run = 1.0, 1.0
    for a in rates[:k]:
        run *= a
        total += run
    return total


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens a pass emits with k drafts each accepted with probability alpha (i.i.d.):
    ``expected_tokens`` with every position's rate equal, (1 − α^(k+1)) / (1 − α). A measured
    acceptance per position is clustered, not i.i.d.; where one is known, use ``expected_tokens`` on it."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must lie in [0, 1]")
    if k < 0:
        raise ValueError("k must be >= 0")
    return expected_tokens([alpha] * k, k)


def bandwidth_bound_pass(width: int) -> float:
    """A pass's cost in one-token passes where reading the weights dominates: any width costs one."""
    return 1.0


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan's walltime improvement: c is a drafter step's cost relative to a target pass."""
    if c < 0:
        raise ValueError("c must be >= 0")
    seconds = pass_seconds(k, bandwidth_bound_pass, draft_seconds=k * c)
    return expected_tokens_per_pass(alpha, k) / seconds * bandwidth_bound_pass(1)


def verify_seconds(verify: Callable[[int], float], k: int, drafted: Sequence[float] = ()) -> float:
    """The mean cost of a pass of depth k when only the share ``drafted[i]`` of passes has a draft of at least
    i + 1 tokens to offer (a text match runs out; the rest verify fewer): every pass by default."""
    if not drafted:
        return verify(k + 1)
    seconds = verify(1)
    for width in range(1, k + 1):
        share = drafted[width - 1] if width - 1 < len(drafted) else 0.0
        seconds += share * (verify(width + 1) - verify(width))
    return seconds


def pass_seconds(k: int, verify: Callable[[int], float], *, draft_seconds: float = 0.0,
                 rollback: float = 0.0, drafted: Sequence[float] = ()) -> float:
    """The cost model of a pass of depth k: a target pass k + 1 tokens wide (``verify(width)``; narrower where
    only the share ``drafted`` of passes has that much to offer, see ``verify_seconds``), the drafting, and,
    when it drafts, a rollback. The depth policy, the drafter ranking and the roofline all price with it."""
    if k <= 0:
        return verify(1)
    return verify_seconds(verify, k, drafted) + draft_seconds + rollback
