"""Replaying recorded greedy answers: what each drafter and depth rule would gain, with no model in the loop.

Greedy output does not depend on speculation, so once the target's answer to a prompt is known, every pass
of a speculative run follows from it: what a drafter proposes, how deep it drafts, how much is accepted.
Charging each pass the cost that the verify-cost curve measured on this machine gives its width turns a
replay into a predicted speedup, with no noise from other programs. Replayed here, on the same traces:

- SpecDeck: the suffix drafter and the adaptive depth policy (``app.engine.suffix_tree``, ``adaptive``);
- any other drafter given as a function of the text so far (``replay_trace``): benchmarks/ngram_modes.py
  replays llama.cpp's n-gram modes that way;
- a longest-match oracle: each pass drafts, with hindsight, the longest continuation of the true answer found
  anywhere in the prompt, the answer so far or the earlier answers, at the width the cost curve makes best.

Each replay returns per-prompt tokens, passes (tau = tokens per pass) and simulated seconds; the speedup is
against plain decoding on the same curve (tokens × the one-token cost).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.engine.adaptive import DepthController
from app.engine.suffix_tree import SuffixDrafter
from app.events import FROM_NGRAM
from app.params import K_MAX

ORACLE_CAP = 64  # the widest pass the oracle considers


@dataclass(frozen=True)
class Trace:
    prompt: list[int]
    answer: list[int]


@dataclass
class Replayed:
    """One answer replayed under one drafting rule."""

    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # simulated: passes by the curve (plus the drafter's own time where it is counted)
    plain_seconds: float = 0.0

    @property
    def tau(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.seconds if self.seconds else 1.0

    def add_pass(self, curve: CostCurve, drafted: int, accepted: int, emitted: int) -> None:
        self.passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.tokens += emitted
        self.seconds += curve.seconds(drafted + 1)
        self.plain_seconds += emitted * curve.seconds(1)

    def as_json(self) -> dict[str, float]:
        return {"tokens": self.tokens, "passes": self.passes, "tau": round(self.tau, 3),
                "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": round(self.accepted / self.drafted, 3) if self.drafted else 0.0,
                "seconds": round(self.seconds, 4), "speedup": round(self.speedup, 3)}


def total(runs: Sequence[Replayed]) -> Replayed:
    out = Replayed()
    for r in runs:
        out.tokens += r.tokens
        out.passes += r.passes
        out.drafted += r.drafted
        out.accepted += r.accepted
        out.seconds += r.seconds
        out.plain_seconds += r.plain_seconds
    return out


class CostCurve:
    """Seconds of a target pass by width, from measured widths: interpolated between them, and past the
    widest with the mean slope from width 1 to the widest (two noisy neighbours can make a local slope
    flat or negative, which would price very wide drafts, llama.cpp's 48-64, at nothing)."""

    def __init__(self, widths: dict[int, float]) -> None:
        if 1 not in widths:
            raise ValueError("a verify-cost curve needs width 1")
        self.widths = dict(sorted(widths.items()))

    def seconds(self, width: int) -> float:
        curve = self.widths
        if width in curve:
            return curve[width]
        lower = [w for w in curve if w < width]
        upper = [w for w in curve if w > width]
        if lower and upper:
            a, b = lower[-1], upper[0]
            return curve[a] + (curve[b] - curve[a]) * (width - a) / (b - a)
        a = lower[-1]
        slope = (curve[a] - curve[1]) / (a - 1) if a > 1 else 0.0
        return curve[a] + max(slope, 0.0) * (width - a)

    def merged(self, wider: CostCurve) -> CostCurve:
        """This curve, with the widths only ``wider`` measured added, scaled by the two one-token costs."""
        scale = self.widths[1] / wider.widths[1]
        widths = {w: t * scale for w, t in wider.widths.items() if w > max(self.widths)}
        return CostCurve({**self.widths, **widths})


def _accepted(draft: Sequence[int], answer: Sequence[int], at: int) -> int:
    n = 0
    while n < len(draft) and at + n < len(answer) and draft[n] == answer[at + n]:
        n += 1
    return n


def replay_trace(trace: Trace, curve: CostCurve, draft_for: Callable[[list[int], int], list[int]],
         on_accept: Callable[[int, int], None] | None = None) -> Replayed:
    """Drafts from ``draft_for(context, remaining)``, each verified whole in one pass."""
    out = Replayed()
    tokens, at, answer = list(trace.prompt), 0, trace.answer
    while at < len(answer):
        draft = draft_for(tokens, len(answer) - at)[: max(0, len(answer) - at - 1)]
        n = _accepted(draft, answer, at)
        emitted = answer[at : at + n + 1]
        out.add_pass(curve, len(draft), n, len(emitted))
        if on_accept is not None:
            on_accept(len(draft), n)
        tokens += emitted
        at += len(emitted)
    return out


# --- SpecDeck ------------------------------------------------------------------------------------------

def new_controller(curve: CostCurve, k_max: int = K_MAX, fixed: int | None = None) -> DepthController:
    """A depth policy whose cost model starts from the curve, as the load's calibration starts it."""
    controller = DepthController(k_max=k_max, fixed=fixed)
    for width in range(1, k_max + 2):
        controller.cost.observe_verify(width, curve.seconds(width))
    return controller


def replay_specdeck(traces: Sequence[Trace], curve: CostCurve, *, min_match: int = 1, k_max: int = K_MAX,
                    count_draft_time: bool = True, history: bool = False, fixed: int | None = None
                    ) -> list[Replayed]:
    """The suffix drafter and the adaptive depth, as ``specdeck bench`` runs them: one policy carried from
    answer to answer (one loaded session), the drafter empty at each prompt (bench resets it), unless
    ``history``: then each answer is remembered for the next prompt, as in the window. The drafter's and
    policy's own time is measured here and counted unless ``count_draft_time`` is off (it carries this
    machine's load; off, the replay is exact and repeatable). ``fixed``: always that depth, as ``--k``."""
    controller = new_controller(curve, k_max, fixed)
    drafter = SuffixDrafter(min_match)
    runs = []
    for trace in traces:
        if not history:
            drafter.reset()
        out = Replayed()
        tokens, at, answer = list(trace.prompt), 0, trace.answer
        controller.start_answer()
        while at < len(answer):
            t0 = time.perf_counter()
            proposal = drafter.propose(tokens, controller.k_max)
            k = controller.choose(len(proposal), False, proposal.match_len, probs=proposal.probs)
            spent = time.perf_counter() - t0
            k = max(0, min(k, len(answer) - at - 1))
            n = _accepted(proposal.tokens[:k], answer, at)
            emitted = answer[at : at + n + 1]
            t1 = time.perf_counter()
            controller.score_proposal(proposal.tokens, proposal.match_len, emitted, proposal.probs)
            flags = [True] * n + ([False] if n < k else [])
            controller.observe([FROM_NGRAM] * k, flags, proposal.match_len, ngram_scored_elsewhere=True,
                               probs=proposal.probs)
            controller.cost.observe_verify(k + 1, curve.seconds(k + 1))
            spent += time.perf_counter() - t1
            out.add_pass(curve, k, n, len(emitted))
            if count_draft_time:
                out.seconds += spent
            tokens += emitted
            at += len(emitted)
        if history:
            drafter.observe([])  # the answer goes to the earlier-answers tree, as a new chat would move it
        runs.append(out)
    return runs


# --- the longest-match oracle ------------------------------------------------------------------------------

def longest_source_match(source: Sequence[int], target: Sequence[int], cap: int) -> int:
    """The length of the longest prefix of ``target`` (at most ``cap``) that occurs anywhere in ``source``."""
    if not target or not source:
        return 0
    first = target[0]
    best = 0
    limit = min(cap, len(target))
    for i, tok in enumerate(source):
        if tok != first:
            continue
        n = 1
        while n < limit and i + n < len(source) and source[i + n] == target[n]:
            n += 1
        if n > best:
            best = n
            if best == limit:
                break
    return best


def best_width(curve: CostCurve, available: int) -> int:
    """The draft length (0..available, all of it accepted) with the most tokens per second on the curve."""
    return max(range(available + 1), key=lambda n: ((n + 1) / curve.seconds(n + 1), -n))


def replay_oracle(traces: Sequence[Trace], curve: CostCurve, *, history: bool = True,
                  cap: int = ORACLE_CAP) -> list[Replayed]:
    """Each pass drafts, with hindsight, the longest continuation of the true answer found in the prompt, the
    answer so far or (``history``) earlier answers, cut to the best width on the curve."""
    runs = []
    earlier: list[int] = []
    for trace in traces:
        out = Replayed()
        answer, at = trace.answer, 0
        while at < len(answer):
            source = [*earlier, -1, *trace.prompt, *answer[:at]]
            found = longest_source_match(source, answer[at : at + cap], cap)
            n = best_width(curve, min(found, len(answer) - at - 1))
            out.add_pass(curve, n, n, n + 1)
            at += n + 1
        if history:
            earlier += [-1, *answer]
        runs.append(out)
    return runs
