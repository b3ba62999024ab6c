"""Choosing the draft depth k each pass from measured acceptance and measured cost.

Expected tokens from a draft of depth k: E(k) = 1 + Σ_{i≤k} Π_{j≤i} a_j, with a_j the chance that
position j is accepted given that every earlier one was. For a suffix draft, a_j is the tree's own estimate
(the ratio of its counts at that step) times a correction measured per (match length, position): how
often such drafts were right against how often the tree said they would be. Expected time:
t_verify(k + 1) plus the drafter's steps. k maximises E(k) / time. t_verify(n) is measured per width (flat
on a GPU, rising on a small CPU), relative to the one-token cost of the same moment, so a busy machine
scales every width at once and a pass timed while it was busy is not held against drafting later.

While the policy does not draft it probes now and then, at the depth the measured acceptance suggests, and
probes again at once after a probe whose every draft was accepted: a copy drafts within a few passes of
its start even where the costs learned so far say drafting does not pay.

Over 500 lines: the acceptance estimates, the cost model and the policy that weighs them are one decision,
and each is tuned against the others (a change to one moves the depth the others' tests pin).
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.ceiling.speculation import expected_tokens, pass_seconds

DECAY = 0.92  # weight of the old estimate per observation: recent text matters most, but one miss in a
# copy must not talk the policy out of it (0.85 lost 3 % on a short answer in the replay)
PRIOR_WEIGHT = 2.0  # the prior counts as this many observations: the first few outcomes move a rate fast
EXPLORE_DEPTH = 2  # how far past the deepest measured position the policy may draft
PROBE_EVERY = 12  # fewest passes between probes, so a return of good drafts is noticed
PROBE_BUDGET = 0.03  # most of the decoding time that probes may take (an expensive drafter probes rarely)
PROBE_K = 2  # the shallowest probe; deeper where the measured acceptance says a deeper draft holds
PROBE_WHOLE = 0.5  # a probe goes as deep as its drafts are at least this likely to be accepted whole
PROBE_MAX_INTERVAL = 64  # most passes between probes, whatever a wide pass was last measured to cost
NGRAM_PRIORS = (0.2, 0.4, 0.7, 0.9)  # per match-length bucket: < 3, < 6, < 16 and longer
SHORT_MATCH_BUCKETS = 2  # the buckets whose evidence is relaxed at each new answer (matches under 6 tokens)
MODEL_PRIOR = 0.6  # a model drafter's acceptance before this pair has been measured
BETTER = 1.0001  # how much more tokens per second a deeper draft must promise to be chosen (ties stay shallow)

log = logging.getLogger(__name__)


@dataclass
class PositionAcceptance:
    """Decayed acceptance per draft position for one drafter (or one suffix match-length bucket).

    ``rates`` holds, per position, the measured acceptance over the acceptance the drafter predicted (a
    ratio of decayed sums, so a drafter that gives no prediction, 1 each time, gets a plain decayed rate);
    ``rate(position, predicted)`` is the predicted chance corrected by it. ``below`` is the bucket of shorter
    matches: a longer match is at least as reliable, so where this bucket has no outcome yet at a position,
    it starts from the shorter matches' correction when that is higher than its own prior (a copy in
    progress passes through every bucket on its way to long matches).
    """

    k_max: int
    prior: float
    below: PositionAcceptance | None = None
    rates: list[float] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    predicted: list[float] = field(default_factory=list)  # decayed sum of the predictions (weight 1 at first)

    def __post_init__(self) -> None:
        self.rates = [self.prior] * self.k_max
        self.seen = [0] * self.k_max
        self.predicted = [1.0] * self.k_max

    def correction(self, position: int) -> float:
        own = self.rates[position]
        if self.seen[position] == 0 and self.below is not None:
            return max(own, self.below.correction(position))
        return own

    def rate(self, position: int, predicted: float = 1.0) -> float:
        return min(1.0, predicted * self.correction(position))

    def measured(self, position: int) -> bool:
        return self.seen[position] > 0 or (self.below is not None and self.below.measured(position))

    def update_at(self, position: int, ok: bool, predicted: float = 1.0) -> None:
        """One outcome at ``position``, drafted with ``predicted`` chance of acceptance: a running mean with
        the prior while there are few, then decayed.

        A plain decayed average would let the prior outweigh the first outcomes for a long time (at
        DECAY 0.92, moving from a prior of 0.85 to 0.95 takes over ten straight hits).
        """
        if position < self.k_max:
            if self.seen[position] == 0:
                self.rates[position] = self.correction(position)
            weight = max(1 - DECAY, 1.0 / (self.seen[position] + 1 + PRIOR_WEIGHT))
            before = self.predicted[position]
            hits = self.rates[position] * before
            self.predicted[position] = before + weight * (predicted - before)
            hits += weight * ((1.0 if ok else 0.0) - hits)
            self.rates[position] = hits / self.predicted[position] if self.predicted[position] > 0 else 1.0
            self.seen[position] += 1

    def update(self, accepted: Sequence[bool], predicted: Sequence[float] = ()) -> None:
        """``accepted`` holds one flag per drafted position up to and including the first rejection;
        ``predicted`` the drafter's chance for each (conditional on the earlier ones), where it gives one."""
        for i, ok in enumerate(accepted[: self.k_max]):
            self.update_at(i, ok, predicted[i] if i < len(predicted) else 1.0)
            if not ok:
                break

    def relax(self) -> None:
        """Move halfway back to the prior, with at most one outcome's weight: what a kind of draft did in one
        answer says less about the next one (a JSON answer's short matches continue; prose's do not)."""
        for i in range(self.k_max):
            self.rates[i] = (self.rates[i] + self.prior) / 2
            self.seen[i] = min(self.seen[i], 1)

    def measured_depth(self) -> int:
        """How many leading positions have at least one outcome (here or in a shorter-match bucket)."""
        depth = 0
        while depth < self.k_max and self.measured(depth):
            depth += 1
        return depth


@dataclass
class _Shadow:
    """An n-gram proposal, compared token by token with what the target emits from there on."""

    rates: PositionAcceptance
    tokens: list[int]
    predicted: list[float]
    scored: int = 0

    def score(self, emitted: Sequence[int]) -> bool:
        """Score the next emitted tokens; True once the outcome is known (first miss or proposal's end)."""
        for tok in emitted:
            ok = self.tokens[self.scored] == tok
            self.rates.update_at(self.scored, ok, self.predicted[self.scored])
            self.scored += 1
            if not ok or self.scored == len(self.tokens):
                return True
        return False


class CostModel:
    """Seconds per target pass of each width and per drafter step, from recent measurements.

    A pass of width w is kept as its ratio to the one-token cost of the same moment; the one-token cost
    now is the median of the latest estimates from passes of any width (a wide pass of known ratio r that
    took t seconds says one token costs t / r). So a machine that gets busier, or quieter, scales every
    width at once, whichever widths the policy is using, and a wide pass timed while another program held
    the CPU is not held against drafting once it is gone (issue 27: a cost learned under load kept the
    depth at 0 for hundreds of passes). Medians, not means: on a shared machine one pass in a few is
    slowed by other work. Ratios older than MAX_AGE passes are forgotten, so a width the policy stopped
    using is measured again rather than trusted forever.

    A ratio above the width is not a measurement of the width: a batched pass of w tokens does no more work
    than w one-token passes, so that pass was held up by other programs (on a busy 2-core CPU, one pass in a
    few reads 5 to 90 times a one-token pass). Those samples are dropped, not capped: capped at the width, a
    few of them made every width cost w one-token passes, so no draft could pay, and the policy stayed at
    k = 0 through verbatim copies. Their time still updates the one-token cost, so a machine that is slower
    for good is followed. A ratio below 1 counts as 1: where a pass costs about the same at any width (a GPU, a
    tiny model) half the honest samples fall there, so they are kept (dropped, the width would go unmeasured),
    but a pass is never cheaper than one token, and a ratio under 1 would inflate the one-token cost that the
    next passes are divided by (after a preempted one-token pass, every wider pass looked cheaper still).
    """

    WINDOW = 15  # ratios kept per width
    SETTLED = 3  # ratios after which a width's cost is trusted to price probes (one sample on a busy CPU is noise)
    ONE_WINDOW = 5  # one-token estimates: short, so a change of load is followed within three passes
    MAX_AGE = 1000  # passes

    def __init__(self) -> None:
        self._one: deque[float] = deque(maxlen=self.ONE_WINDOW)
        self._ratios: dict[int, deque[tuple[float, int]]] = {}  # (seconds / one-token cost then, pass)
        self._passes = 0
        self._draft: deque[float] = deque(maxlen=self.WINDOW)
        self._catch_up: deque[float] = deque(maxlen=self.WINDOW)
        self._rollback: deque[float] = deque(maxlen=self.WINDOW)
        self._table: dict[int, float] | None = None
        self.dropped = 0  # ratio samples above the width, not kept

    @property
    def widths(self) -> dict[int, float]:
        if self._table is None:
            self._table = self._fit()
        return self._table

    @property
    def draft_step(self) -> float:
        return statistics.median(self._draft) if self._draft else 0.0

    @property
    def one(self) -> float | None:
        """The one-token cost now (None before any pass was measured)."""
        return statistics.median(self._one) if self._one else None

    def samples(self, width: int) -> int:
        """How many recent ratios the cost of ``width`` rests on (0: interpolated)."""
        return len(self._ratios.get(width, ()))

    def ratio(self, width: int) -> float | None:
        """The median recent cost of a ``width``-token pass over the one-token cost of its time."""
        samples = self._ratios.get(width)
        if not samples:
            return None
        while samples and samples[0][1] <= self._passes - self.MAX_AGE:
            samples.popleft()
        return statistics.median(r for r, _ in samples) if samples else None

    def observe_verify(self, width: int, seconds: float) -> None:
        self._passes += 1
        self._table = None
        if width <= 1:
            self._one.append(seconds)
            return
        known = self.ratio(width)
        one = self.one
        if one is not None and one > 0:
            if seconds / one <= width:
                ratio = max(1.0, seconds / one)
                self._ratios.setdefault(width, deque(maxlen=self.WINDOW)).append((ratio, self._passes))
            else:
                self.dropped += 1
        if known:
            self._one.append(seconds / known)

    def describe(self) -> str:
        """Each measured width's ratio and its number of samples, for the plan's debug line: "3:2.41/7 9:4.9/3"."""
        out = []
        for width in sorted(self._ratios):
            ratio = self.ratio(width)
            if ratio is not None:
                out.append(f"{width}:{ratio:.2f}/{len(self._ratios[width])}")
        return " ".join(out)

    def observe_draft(self, steps: int, seconds: float) -> None:
        if steps > 0:
            self._draft.append(seconds / steps)

    @property
    def catch_up_per_token(self) -> float:
        """Seconds per token for the model drafter to read tokens it missed (measured on each prompt)."""
        return statistics.median(self._catch_up) if self._catch_up else 0.0

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self._catch_up.append(seconds / tokens)

    @property
    def rollback(self) -> float:
        """Mean seconds a drafting pass adds to take back rejected tokens (0 where a KV cache just drops them;
        a recurrent state's checkpoint copy and the re-decode of the accepted tokens elsewhere)."""
        return statistics.fmean(self._rollback) if self._rollback else 0.0

    def observe_rollback(self, seconds: float) -> None:
        self._rollback.append(seconds)

    def _fit(self) -> dict[int, float]:
        """The one-token cost now times each width's ratio (at most the width, as every sample is).

        Not forced to rise with width: quantized CPU kernels work in row groups (llama.cpp's repacked
        Q4_K handles 4 at a time), so a pass of 8 tokens can cost less than one of 7.
        """
        one = self.one
        if one is None:
            return {}
        table = {1: one}
        for width in sorted(self._ratios):
            ratio = self.ratio(width)
            if ratio is not None:
                table[width] = one * ratio
        return table

    def verify(self, width: int) -> float:
        """Measured time of a pass of ``width`` tokens, interpolated between measured widths."""
        widths = self.widths
        if width in widths:
            return widths[width]
        known = sorted(widths)
        if not known:
            return 1.0
        lower = [w for w in known if w < width]
        upper = [w for w in known if w > width]
        if lower and upper:
            a, b = lower[-1], upper[0]
            ta, tb = widths[a], widths[b]
            return ta + (tb - ta) * (width - a) / (b - a)
        if lower:  # extrapolate with the slope of the two widest measured
            a = lower[-1]
            slope = (widths[a] - widths[lower[-2]]) / (a - lower[-2]) if len(lower) > 1 else 0.0
            return widths[a] + max(slope, 0.0) * (width - a)
        return widths[upper[0]]


def conditional(probs: Sequence[float]) -> list[float]:
    """Per-position chances given the earlier positions, from cumulative ones (a suffix draft's ``probs``)."""
    out, before = [], 1.0
    for p in probs:
        out.append(min(1.0, p / before) if before > 0 else 0.0)
        before = p
    return out


def best_depth(rates: Sequence[float], limit: int, verify: Callable[[int], float], *, free: int = 0,
               draft_step: float = 0.0, rollback: float = 0.0, drafted: Sequence[float] = ()) -> tuple[int, float]:
    """(k, expected tokens per unit of time) for the depth 0..limit that emits the most tokens per unit of time.

    ``verify(width)`` is the cost of a target pass of that width; positions past the first ``free`` cost
    ``draft_step`` each (a model drafter's step), and a pass that drafts pays ``rollback``. The drafter
    ranking's rule; the depth policy's split search (``DepthController``) and the roofline's speedup weigh a
    depth with the same ``expected_tokens`` and ``pass_seconds``: only the rates and the costs differ.
    ``drafted`` as in ``verify_seconds``.
    """
    best_k, best = 0, 1.0 / pass_seconds(0, verify)
    for k in range(1, limit + 1):
        seconds = pass_seconds(k, verify, draft_seconds=max(0, k - free) * draft_step, rollback=rollback,
                               drafted=drafted)
        rate = expected_tokens(rates, k) / seconds
        if rate > best * BETTER:
            best_k, best = k, rate
    return best_k, best


@dataclass(frozen=True)
class DraftPlan:
    """One pass's draft: ``k`` tokens in all, the first ``ngram`` of them from the suffix drafter, the rest
    from the trained drafter."""

    k: int
    ngram: int

    @property
    def trained(self) -> int:
        return self.k - self.ngram


@dataclass
class DepthController:
    """Adaptive k in [0, k_max]; with ``fixed`` set, always that k (capped by what is proposed)."""

    k_max: int
    fixed: int | None = None
    ngram: PositionAcceptance = field(init=False)
    model: PositionAcceptance = field(init=False)
    cost: CostModel = field(default_factory=CostModel)
    _idle: int = 0
    _probed: int = 0  # the depth of this pass's probe (0: it is not one)
    _probed_over: int = 0  # the depth the plan had chosen instead of this pass's probe
    _probed_settled: bool = False  # whether the probe's width had a settled cost before it
    history: list[int] = field(default_factory=list)
    _shadows: list[_Shadow] = field(default_factory=list)
    block_drafter: bool = False  # the trained drafter drafts a whole block in one step (DFlash, DSpark)

    def __post_init__(self) -> None:
        # N-gram acceptance is tracked per match length: a long exact match is a copy in progress.
        self.ngram_buckets: list[PositionAcceptance] = []
        # Priors by match length, from the edit-prompt replays: a short match rarely continues, a long one
        # is a copy (the wider spread drafts a copy deeper sooner and a chance match less).
        for prior in NGRAM_PRIORS:
            below = self.ngram_buckets[-1] if self.ngram_buckets else None
            self.ngram_buckets.append(PositionAcceptance(self.k_max, prior=prior, below=below))
        self.ngram = self.ngram_buckets[0]
        self.model = PositionAcceptance(self.k_max, prior=MODEL_PRIOR)

    def start_model_from(self, measured: float) -> None:
        """Start the model drafter's rates from this pair's acceptance measured in earlier runs.

        Without it a good drafter may never be tried: at the default prior the first drafts do not pay, and on
        a CPU, where the drafter reading the tokens it missed costs a sizeable part of a pass, it is not probed
        either (``model_probe_pays``), so its acceptance would stay unmeasured.
        """
        self.model = PositionAcceptance(self.k_max, prior=min(max(measured, 0.0), 1.0))

    def start_answer(self) -> None:
        """Forget the proposals still being scored (they belong to the previous answer's text), and half of
        what short matches taught: in the replays of the bundled workloads, a prose answer after a JSON one
        drafted 7 deep on one-token matches; relaxing them raised the worst prompt from 0.92x to 0.98x."""
        self._shadows = []
        for bucket in self.ngram_buckets[:SHORT_MATCH_BUCKETS]:
            bucket.relax()

    def score_proposal(self, proposal: Sequence[int], match_len: int, emitted: Sequence[int],
                       probs: Sequence[float] = ()) -> None:
        """Greedy decoding: score this pass's suffix proposal, drafted or not, against what the target emits
        from here on, and the earlier proposals still open against ``emitted``.

        Every proposal is scored, so each position's rate gets about one outcome per emitted token: a copy
        is recognised within a few tokens, not after several whole proposals.
        """
        if proposal:
            predicted = _padded(conditional(probs), len(proposal))
            self._shadows.append(_Shadow(self.ngram_buckets[self.bucket(match_len)], list(proposal), predicted))
        self._shadows = [sh for sh in self._shadows if not sh.score(emitted)]

    @staticmethod
    def bucket(match_len: int) -> int:
        return 0 if match_len < 3 else 1 if match_len < 6 else 2 if match_len < 16 else 3

    def choose(self, ngram_available: int, has_model: bool, match_len: int = 0, *, probe: bool = True,
               probs: Sequence[float] = ()) -> int:
        """The depth of ``plan`` (how many draft tokens in all)."""
        return self.plan(ngram_available, has_model, match_len, probe=probe, probs=probs).k

    def plan(self, ngram_available: int, has_model: bool, match_len: int = 0, *, probe: bool = True,
             probs: Sequence[float] = ()) -> DraftPlan:
        """Best draft for this pass: how many of the suffix tokens on offer (free, with the tree's cumulative
        ``probs``) go first, and how many trained-drafter steps (model, MTP heads, EAGLE-3) follow them.

        Every split is weighed with each source's measured acceptance per position and the measured costs
        (a pass of that width, each trained step, a rollback), so a short, uncertain suffix match does not
        pre-empt a better trained draft (0 suffix tokens), a long certain one replaces it (0 trained steps),
        and one that runs out is extended by the trained drafter. ``probe`` allows an occasional deeper draft
        where the plan drafts shallower than the measured acceptance suggests (``probe_depth``), within
        PROBE_BUDGET of the time: it notices when drafts start to hit again, and keeps the cost of the widths
        a copy would use measured.
        """
        self.ngram = self.ngram_buckets[self.bucket(match_len)]
        if self.fixed is not None:
            k = min(self.fixed, self.k_max) if has_model else min(self.fixed, ngram_available)
            self.history.append(k)
            return self._best_split(k, k, ngram_available, has_model, probs) if k else DraftPlan(0, 0)
        # Never deeper than the evidence: positions no outcome has reached are drafted a few at a time.
        ngram_limit = min(ngram_available, self.k_max, self.ngram.measured_depth() + EXPLORE_DEPTH)
        model_limit = min(self.k_max, self.model.measured_depth() + EXPLORE_DEPTH) if has_model else 0
        limit = min(self.k_max, ngram_limit + model_limit)
        best = self._best_split(0, limit, ngram_available, has_model, probs, ngram_limit, model_limit)
        self._probed = interval = 0
        predicted = _padded(conditional(probs), ngram_limit)
        ngram_rates = [self.ngram.rate(i, predicted[i]) for i in range(ngram_limit)]
        model_rates = [self.model.rate(i) for i in range(model_limit)]
        # A model drafter that could not pay even if it were always right is not probed: its probe also
        # catches its cache up on every token since the last one, at prefill cost per token.
        free = ngram_limit if has_model and not self.model_probe_pays() else limit
        depth = probe_depth((ngram_rates + model_rates)[: min(limit, free)]) if probe else 0
        if depth > best.k:  # the plan drafts shallower than the acceptance suggests
            self._idle += 1
            candidate = DraftPlan(depth, min(depth, ngram_limit))
            interval = self._probe_interval(candidate, best, ngram_rates, model_rates)
            if self._idle >= interval:
                self._idle = 0
                self._probed, self._probed_over = depth, best.k
                self._probed_settled = self.cost.samples(depth + 1) >= CostModel.SETTLED
                best = candidate
        elif best.k == 0:
            self._idle += 1  # a pass with nothing to probe still counts towards the next probe
        else:
            self._idle = 0
        self.history.append(best.k)
        if log.isEnabledFor(logging.DEBUG):  # why this depth: the next report can say what the policy saw
            log.debug("plan k=%d (suffix %d)%s: offered %d, match %d (bucket %d), limits suffix %d model %d, "
                      "suffix rates %s, model rates %s, verify ms %s (one-token %.1f ms; ratios %s; %d dropped), "
                      "draft step %.2f ms, rollback %.2f ms, idle %d of %d",
                      best.k, best.ngram, " probe" if self._probed else "", ngram_available, match_len,
                      self.bucket(match_len), ngram_limit, model_limit,
                      [round(r, 2) for r in ngram_rates], [round(r, 2) for r in model_rates],
                      [round(self.cost.verify(w) * 1e3, 1) for w in range(1, limit + 2)],
                      (self.cost.one or 0.0) * 1e3, self.cost.describe(), self.cost.dropped,
                      self.cost.draft_step * 1e3, self.cost.rollback * 1e3, self._idle, interval)
        return best

    def _best_split(self, k_low: int, k_high: int, ngram_available: int, has_model: bool,
                    probs: Sequence[float], ngram_limit: int | None = None,
                    model_limit: int | None = None) -> DraftPlan:
        """The (depth, suffix tokens) in k_low..k_high with the most expected tokens per second; k = 0 (plain)
        competes only when k_low is 0 or less."""
        ngram_limit = min(ngram_available, k_high) if ngram_limit is None else ngram_limit
        model_limit = (k_high if has_model else 0) if model_limit is None else model_limit
        predicted = _padded(conditional(probs), ngram_available)
        ngram_rates = [self.ngram.rate(i, predicted[i]) for i in range(ngram_limit)]
        model_rates = [self.model.rate(i) for i in range(model_limit)]
        best, best_rate = DraftPlan(0, 0), (1.0 / pass_seconds(0, self.cost.verify) if k_low <= 0 else 0.0)
        for k in range(max(k_low, 1), k_high + 1):
            for n in range(min(k, ngram_limit), max(0, k - model_limit) - 1, -1):  # suffix first: it is free
                rates = ngram_rates[:n] + model_rates[: k - n]
                seconds = pass_seconds(k, self.cost.verify, draft_seconds=self.trained_seconds(k - n),
                                       rollback=self.cost.rollback)
                rate = expected_tokens(rates, k) / seconds
                if rate > best_rate * BETTER:
                    best, best_rate = DraftPlan(k, n), rate
        return best

    def model_probe_pays(self) -> bool:
        """Whether probing with the model drafter at k = 0 fits PROBE_BUDGET and could lead anywhere.

        While the policy does not draft, the drafter's cache falls behind by a token per pass, and a
        probe first catches it up: that costs catch_up_per_token for every pass since the last probe,
        however rarely it probes. Where reading a token costs the drafter a sizeable part of a target pass
        (a CPU: 5 ms against 16 ms here), no probing interval keeps that within the budget.
        """
        affordable = self.cost.catch_up_per_token < PROBE_BUDGET * self.cost.verify(1)
        return affordable and self.model_can_pay()

    def model_can_pay(self) -> bool:
        """Whether some depth of model drafts beats plain decoding if every draft were accepted."""
        verify, rollback = self.cost.verify, self.cost.rollback
        plain = pass_seconds(0, verify)
        return any((k + 1) / pass_seconds(k, verify, draft_seconds=self.trained_seconds(k), rollback=rollback)
                   > BETTER / plain for k in range(1, self.k_max + 1))

    def trained_seconds(self, tokens: int) -> float:
        """What drafting ``tokens`` with the trained drafter costs: a step each, or one block for any number."""
        if tokens <= 0:
            return 0.0
        return self.cost.draft_step * (1 if self.block_drafter else tokens)

    def _probe_interval(self, probe: DraftPlan, plan: DraftPlan, ngram_rates: Sequence[float],
                        model_rates: Sequence[float]) -> int:
        """Passes between probes, so that probing loses at most PROBE_BUDGET of the time: what the probe
        costs beyond the time ``plan`` would take to emit the probe's expected tokens (a probe into a copy
        loses nothing; one into prose, at k = 0, about a pass of its width less one). A width whose cost rests
        on fewer than SETTLED passes is probed at the shortest interval: on a busy CPU one timing can read
        several times the width's cost, and nothing else would measure it again."""
        if self.cost.samples(probe.k + 1) < CostModel.SETTLED:
            return PROBE_EVERY
        tokens, seconds = self._expected(probe, ngram_rates, model_rates)
        plan_tokens, plan_seconds = self._expected(plan, ngram_rates, model_rates)
        extra = seconds - tokens * plan_seconds / plan_tokens
        return min(PROBE_MAX_INTERVAL, max(PROBE_EVERY, int(extra / (PROBE_BUDGET * plan_seconds)) + 1))

    def _expected(self, plan: DraftPlan, ngram_rates: Sequence[float],
                  model_rates: Sequence[float]) -> tuple[float, float]:
        """(expected tokens, seconds) of a pass drafting ``plan``: its suffix tokens first, then trained ones."""
        rates = [*ngram_rates[: plan.ngram], *model_rates[: plan.trained]]
        seconds = pass_seconds(plan.k, self.cost.verify, draft_seconds=self.trained_seconds(plan.trained),
                               rollback=self.cost.rollback)
        return expected_tokens(rates, plan.k), seconds

    def observe(self, sources: Sequence[str], accepted: Sequence[bool], match_len: int = 0,
                *, ngram_scored_elsewhere: bool = False, probs: Sequence[float] = ()) -> None:
        from app.events import FROM_NGRAM

        self.ngram = self.ngram_buckets[self.bucket(match_len)]
        ng = [ok for s, ok in zip(sources, accepted, strict=False) if s == FROM_NGRAM]
        md = [ok for s, ok in zip(sources, accepted, strict=False) if s != FROM_NGRAM]
        if ng and not ngram_scored_elsewhere:
            self.ngram.update(ng, conditional(probs))
        if md and (not ng or all(ng)):
            self.model.update(md)
        if self._probed and (not self._probed_over or not self._probed_settled) and accepted and all(accepted):
            # Every probed draft was right, where the plan said not to draft or at a width whose cost rests on
            # too few passes: probe again next pass rather than wait out the interval, so a copy drafts while
            # the costs learned so far still say it would not pay. Such a pass emits as many tokens as it is
            # wide, and no batched pass costs more than that many one-token passes.
            self._idle = PROBE_MAX_INTERVAL


def probe_depth(rates: Sequence[float]) -> int:
    """How deep to probe: as deep as the drafts are at least PROBE_WHOLE likely to be accepted whole, and at
    least PROBE_K (both within ``rates``, one per position that may be drafted)."""
    k, whole = 0, 1.0
    for rate in rates:
        whole *= rate
        if whole < PROBE_WHOLE:
            break
        k += 1
    return min(max(k, PROBE_K), len(rates))


def _padded(values: list[float], n: int) -> list[float]:
    """``values`` cut or padded with 1 (no prediction) to ``n`` entries."""
    return values[:n] + [1.0] * max(0, n - len(values))
