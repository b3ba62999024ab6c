"""`specdeck tune`: find the fastest drafting settings for a pair on the user's own prompts.

Each candidate setting is measured by the bench itself (``app.measure.bench.bench``): speculative and plain
runs side by side, alternating, in one engine worker, so each speedup is a ratio of neighbouring runs on
this machine, with its spread over the repeats. The sweep starts from the window's defaults. At greedy
decoding, the plain answers of that first run are then replayed offline (``app.measure.replay``) under every
suffix-drafter setting (shortest match × adaptive k_max or fixed depth) on the verify cost that run measured,
in seconds, and the replay's winner is confirmed with one real bench run. Where a replay cannot stand in
(sampling, or no answer recorded) the sweep moves one dimension at a time from the best setting so far: the
suffix drafter's shortest match, k_max, fixed against adaptive depth. With a model drafter, the drafter choice
(none, n-gram, model, both) is measured last, for real. The winner is saved per (target, drafter) pair
(``app.storage.tuned``); the window offers it for that pair. Cancelling (Ctrl-C, or
``cancelled``) keeps every setting measured so far, and the best of them is still saved. The command and
the window's Tune describe a sweep with a ``TuneConfig``; each setting is one ``BenchConfig``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TextIO

from app.errors import AppError, SettingsError
from app.measure.bench import BENCH_SAMPLING, BenchConfig, bench
from app.measure.bench_report import BenchReport, JSONObject, Trace
from app.measure.prompts import Prompt
from app.params import K_MAX, NGRAM_KEY_LENGTH, DraftSettings, LoadSettings, SamplingSettings
from app.storage.tuned import TunedSettings, save_tuned

if TYPE_CHECKING:
    from app.engine.client import EngineClient

JSON_VERSION = 1
# The shared drafting defaults (app.params) with the n-gram drafter on: the first setting measured, so
# the winner is never a setting measured slower than what the user gets untuned.
DEFAULT_NGRAM = NGRAM_KEY_LENGTH
DEFAULT_K_MAX = K_MAX
KEY_LENGTHS = (2, 3, 4, 6)
K_MAXES = (4, 8, 16, 32)
FIXED_DEPTHS = (2, 4, 8)


@dataclass(frozen=True)
class Candidate:
    """One drafting setting: which drafters, the suffix drafter's shortest match, and the depth policy."""

    use_model: bool
    ngram: int  # 0: no n-gram drafter
    adaptive: bool = True
    k: int = 4  # the fixed depth when not adaptive
    k_max: int = DEFAULT_K_MAX

    @property
    def drafter(self) -> str:
        """none, n-gram, model or both."""
        if self.use_model:
            return "both" if self.ngram else "model"
        return "n-gram" if self.ngram else "none"

    @property
    def depth(self) -> str:
        if self.drafter == "none":
            return "-"
        return f"adaptive ≤ {self.k_max}" if self.adaptive else f"fixed {self.k}"

    def label(self) -> str:
        key = f", key {self.ngram}" if self.ngram else ""
        return f"{self.drafter}{key}, {self.depth}"

    def draft_settings(self, drafter_path: str | None) -> DraftSettings:
        return DraftSettings(drafter_path=drafter_path if self.use_model else None, ngram=self.ngram,
                             adaptive=self.adaptive, k=self.k, k_max=self.k_max if self.adaptive else self.k)

    def applied_to(self, draft: DraftSettings) -> DraftSettings:
        """``draft`` with this setting's drafters and depth policy; its other fields (the history the suffix
        drafter reads, p_min, the model drafter's start, MTP) kept as the load has them."""
        mine = self.draft_settings(draft.drafter_path)
        return replace(draft, drafter_path=mine.drafter_path, ngram=mine.ngram, adaptive=mine.adaptive, k=mine.k,
                       k_max=mine.k_max)

    def as_json(self) -> JSONObject:
        return {"drafter": self.drafter, "ngram": self.ngram, "adaptive": self.adaptive,
                "k": None if self.adaptive else self.k, "k_max": self.k_max if self.adaptive else self.k}


PLAIN = Candidate(use_model=False, ngram=0)


@dataclass
class Measured:
    """What the bench measured for one candidate (plain decoding is the reference, 1.0 by definition)."""

    candidate: Candidate
    speedup: float
    speedup_min: float
    speedup_max: float
    speedups: list[float]
    tok_s: float
    baseline_tok_s: float
    acceptance: float
    identical: bool | None
    seconds: float
    verify_cost_ms: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, candidate: Candidate, report: BenchReport, seconds: float) -> Measured:
        """The figures of ``report``, a bench run with a baseline (as the report rounds them)."""
        versus, base = report.speedup, report.baseline
        if versus is None or base is None:
            raise ValueError("a setting is measured against plain decoding: bench it with a baseline")
        return cls(candidate, versus.median, versus.low, versus.high, versus.speedups, report.total.tok_s,
                   base.tok_s, report.total.acceptance, versus.identical, seconds, dict(report.verify_cost_ms))

    @classmethod
    def plain(cls, baseline_tok_s: float) -> Measured:
        return cls(PLAIN, 1.0, 1.0, 1.0, [1.0], baseline_tok_s, baseline_tok_s, 0.0, None, 0.0)

    def as_json(self) -> JSONObject:
        return {"settings": self.candidate.as_json(), "label": self.candidate.label(),
                "speedup": self.speedup, "speedup_min": self.speedup_min, "speedup_max": self.speedup_max,
                "speedups": self.speedups, "tok_s": self.tok_s, "baseline_tok_s": self.baseline_tok_s,
                "acceptance": self.acceptance, "identical": self.identical, "seconds": round(self.seconds, 2)}


@dataclass(frozen=True)
class Predicted:
    """One suffix-drafter setting replayed offline over the first run's plain answers."""

    candidate: Candidate
    speedup: float
    tau: float

    def as_json(self) -> JSONObject:
        return {"settings": self.candidate.as_json(), "label": self.candidate.label(),
                "predicted_speedup": round(self.speedup, 4), "tau": round(self.tau, 3)}


@dataclass
class Progress:
    """Reported after each measured candidate."""

    done: int
    planned: int  # measured + still planned (later stages depend on earlier winners, so this may shrink)
    elapsed_s: float
    left_s: float  # estimate: mean seconds per candidate × candidates still planned, within the budget
    latest: Measured


@dataclass
class TuneReport:
    target: str
    drafter: str | None
    source: str
    prompts: int
    results: list[Measured] = field(default_factory=list)
    stopped: str = "done"  # done, budget, cancelled
    saved_to: str | None = None
    replayed: list[Predicted] = field(default_factory=list)  # best first; empty when no replay ran
    replay_seconds: float = 0.0
    traces: list[Trace] = field(default_factory=list, repr=False)  # the first run's answers
    load: LoadSettings | None = None  # the load every setting was measured on (its drafting settings aside)

    @property
    def ranked(self) -> list[Measured]:
        measured = [m for m in self.results if m.candidate != PLAIN]
        reference = [Measured.plain(_median([m.baseline_tok_s for m in measured]))] if measured else []
        return sorted([*measured, *reference], key=lambda m: (-m.speedup, -m.speedup_min, m.candidate.label()))

    @property
    def best(self) -> Measured | None:
        """The fastest setting by median; but the default (measured first) stays the winner unless even the
        challenger's slowest repeat beats the default's median, so a noisy machine does not crown noise."""
        ranked = self.ranked
        if not ranked:
            return None
        top, default = ranked[0], (self.results[0] if self.results else None)
        if (default is not None and top is not default and len(top.speedups) > 1 and len(default.speedups) > 1
                and default.speedup >= 1.0 and top.speedup_min <= default.speedup):
            return default
        return top

    def tuned(self) -> TunedSettings | None:
        best = self.best
        if best is None:
            return None
        return TunedSettings(best.candidate.draft_settings(self.drafter), best.speedup, best.speedup_min,
                             best.speedup_max, self.prompts, self.source, time.time())

    def as_json(self) -> JSONObject:
        best = self.best
        return {"version": JSON_VERSION, "target": self.target, "drafter": self.drafter, "source": self.source,
                "prompts": self.prompts, "stopped": self.stopped, "saved_to": self.saved_to,
                "results": [m.as_json() for m in self.ranked], "best": best.as_json() if best else None,
                "replayed": [p.as_json() for p in self.replayed], "replay_seconds": round(self.replay_seconds, 2)}


@dataclass(frozen=True)
class TuneConfig:
    """One sweep: the pair and its load settings (each setting measured replaces the drafters and depth policy
    and keeps the rest of the load), the prompts and where they came from, the bench's sampling and repeats, and
    the sweep's limits."""

    settings: LoadSettings
    prompts: tuple[Prompt, ...]
    source: str  # where the prompts came from: a file's path, or "history"
    sampling: SamplingSettings = BENCH_SAMPLING
    repeat: int = 2  # side-by-side runs per prompt and setting (the spread needs at least 2)
    budget_s: float | None = None  # stop starting new settings once the next would most likely end past it
    replay: bool = True  # at greedy decoding, choose the suffix-drafter setting by replaying the first answers
    plan: tuple[Candidate, ...] | None = None  # measure exactly these settings instead of the staged sweep

    @property
    def target(self) -> str:
        return self.settings.target_path

    @property
    def drafter(self) -> str | None:
        return self.settings.draft.drafter_path

    def bench_config(self, candidate: Candidate, *, keep_traces: bool = False) -> BenchConfig:
        """The bench that measures ``candidate`` side by side with plain decoding, on the load as given (every
        field but the drafting setting measured)."""
        settings = replace(self.settings, draft=candidate.applied_to(self.settings.draft))
        return BenchConfig(settings, self.prompts, self.sampling, baseline=True, repeat=self.repeat,
                           keep_traces=keep_traces)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return 0.0
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def stages(has_model: bool) -> list[Callable[[Candidate], list[Candidate]]]:
    """Each stage builds its candidates from the best setting so far."""

    def key_lengths(best: Candidate) -> list[Candidate]:
        return [replace(best, ngram=n) for n in KEY_LENGTHS]

    def depth_caps(best: Candidate) -> list[Candidate]:
        return [replace(best, adaptive=True, k_max=m) for m in K_MAXES]

    def fixed_depths(best: Candidate) -> list[Candidate]:
        return [replace(best, adaptive=False, k=k, k_max=k) for k in FIXED_DEPTHS]

    def drafter_choice(best: Candidate) -> list[Candidate]:
        ngram = best.ngram or DEFAULT_NGRAM
        return [replace(best, use_model=True, ngram=0), replace(best, use_model=True, ngram=ngram),
                replace(best, use_model=False, ngram=ngram)]

    return [key_lengths, depth_caps, fixed_depths, drafter_choice] if has_model else [
        key_lengths, depth_caps, fixed_depths]


def replay_grid(base: Candidate) -> list[Candidate]:
    """Every suffix-drafter setting the staged sweep could reach, with ``base``'s drafter choice."""
    grid = [base]
    for n in sorted({*KEY_LENGTHS, base.ngram or DEFAULT_NGRAM}):
        grid += [replace(base, ngram=n, adaptive=True, k_max=m) for m in K_MAXES]
        grid += [replace(base, ngram=n, adaptive=False, k=k, k_max=k) for k in FIXED_DEPTHS]
    return list(dict.fromkeys(grid))


def replay_candidates(traces: Sequence[Trace], curve_ms: dict[str, float],
                      candidates: Sequence[Candidate]) -> list[Predicted]:
    """Each candidate's predicted speedup, replaying the recorded greedy answers under the suffix drafter and
    the depth policy on the measured verify cost (exact: the drafter's own time left out); best first, the
    earlier candidate first among equals. Empty when there is nothing to replay."""
    from app.measure.replay import CostCurve, Trace, replay_specdeck, total

    widths = {int(w): float(ms) / 1000 for w, ms in curve_ms.items()}
    runs = [Trace(list(t["prompt"]), list(t["answer"])) for t in traces if t.get("prompt") and t.get("answer")]
    if 1 not in widths or not runs:
        return []
    curve = CostCurve(widths)
    out = []
    for cand in candidates:
        if not cand.ngram:
            continue
        replayed = total(replay_specdeck(runs, curve, min_match=cand.ngram, k_max=cand.k_max,
                                         fixed=None if cand.adaptive else cand.k, count_draft_time=False))
        out.append(Predicted(cand, replayed.speedup, replayed.tau))
    order = {c: i for i, c in enumerate(candidates)}
    return sorted(out, key=lambda p: (-round(p.speedup, 6), order[p.candidate]))


def planned_count(has_model: bool, replayed: bool = False) -> int:
    """How many candidates the sweep measures when the default stays the best (an estimate otherwise); with
    ``replayed``, the most it measures (the default, the replay's winner, then the drafter choice)."""
    if replayed:
        return 2 + (3 if has_model else 0)
    default = Candidate(use_model=has_model, ngram=DEFAULT_NGRAM)
    seen = {default}
    for stage in stages(has_model):
        seen.update(stage(default))
    return len(seen)


def history_prompts(count: int) -> list[Prompt]:
    """The last ``count`` chats, each cut after its last user message (the answer is what gets timed)."""
    from app.storage.history import HistoryStore

    if count < 1:
        raise SettingsError(f"The number of chats to tune on must be at least 1, not {count}.")
    prompts: list[list[dict[str, str]]] = []
    with HistoryStore() as store:
        for chat in store.list_chats():
            if len(prompts) == count:
                break
            messages = [{"role": "system", "content": chat.system_prompt}] if chat.system_prompt else []
            messages += [{"role": m.role, "content": m.text} for m in store.messages(chat.id)
                         if m.role in ("user", "assistant") and m.text]
            last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
            if last_user is not None:
                prompts.append(messages[: last_user + 1])
    if not prompts:
        raise SettingsError("The history holds no chat with a user message to tune on.")
    return prompts


def tune(config: TuneConfig, *, on_progress: Callable[[Progress], None] | None = None,
         cancelled: Callable[[], bool] | None = None, client: EngineClient | None = None,
         bench_out: TextIO | None = None) -> TuneReport:
    """Measure candidates with ``bench`` until the sweep ends, the budget would be passed or the user cancels;
    return what was measured, ranked.

    ``config.plan`` measures exactly those candidates instead of the staged sweep. ``config.replay`` (greedy
    only) picks the suffix-drafter setting by replaying the first run's answers and measures only its winner.
    A cancel that ends the engine worker mid-setting (the window's Cancel) keeps what was measured before it."""
    from app.engine.client import EngineClient
    from app.measure.bench import WATCHDOG_SECONDS

    drafter, plan = config.drafter, config.plan
    report = TuneReport(config.target, drafter, config.source, len(config.prompts), load=config.settings)
    told: set[str] = set()  # warnings the benches gave (a refused template): once for the whole sweep
    own_client = client is None
    engine = client or EngineClient(watchdog_seconds=WATCHDOG_SECONDS)
    t0 = time.monotonic()
    try:
        has_model = drafter is not None
        replay = config.replay and plan is None and config.sampling.temperature == 0.0
        limit = len(set(plan)) if plan is not None else planned_count(has_model, replay)
        default = Candidate(use_model=has_model, ngram=DEFAULT_NGRAM)
        seen: set[Candidate] = set()

        def replayed(best: Candidate) -> list[Candidate]:
            """The replay's winner; where no replay can run, the staged sweep takes its place."""
            nonlocal limit
            t_replay = time.monotonic()
            first = report.results[0] if report.results else None
            report.replayed = replay_candidates(report.traces, first.verify_cost_ms if first else {},
                                                replay_grid(best))
            report.replay_seconds = time.monotonic() - t_replay
            if not report.replayed:
                sweep[index + 1 : index + 1] = stages(has_model)[:3]
                limit = planned_count(has_model)
                return []
            return [report.replayed[0].candidate]

        def planned(_best: Candidate) -> list[Candidate]:
            return list(plan or ())

        def defaults(_best: Candidate) -> list[Candidate]:
            return [default]

        sweep: list[Callable[[Candidate], list[Candidate]]] = (
            [planned] if plan is not None
            else [defaults, replayed, *stages(has_model)[3:]] if replay
            else [defaults, *stages(has_model)])
        index = -1
        while index + 1 < len(sweep):
            index += 1
            stage = sweep[index]
            measured = [m for m in report.results if m.candidate != PLAIN]
            best = max(measured, key=lambda m: m.speedup).candidate if measured else default
            try:
                candidates = stage(best)
            except KeyboardInterrupt:  # Ctrl-C during the replay
                report.stopped = "cancelled"
                return report
            for cand in candidates:
                if cand in seen:
                    continue
                seen.add(cand)
                stop = _measure_one(report, config.bench_config(cand, keep_traces=replay and not report.results),
                                    cand, engine, bench_out, cancelled, config.budget_s, t0, told)
                if stop:
                    report.stopped = stop
                    return report
                if on_progress is not None:
                    elapsed = time.monotonic() - t0
                    n = len(report.results)
                    left = elapsed / n * max(limit - n, 0)
                    if config.budget_s is not None:
                        left = min(left, max(config.budget_s - elapsed, 0.0))
                    try:
                        on_progress(Progress(n, limit, elapsed, left, report.results[-1]))
                    except KeyboardInterrupt:
                        report.stopped = "cancelled"
                        return report
    finally:
        if own_client:
            engine.close()
    return report


def _measure_one(report: TuneReport, bench_config: BenchConfig, cand: Candidate, client: EngineClient,
                 bench_out: TextIO | None, cancelled: Callable[[], bool] | None, budget_s: float | None,
                 t0: float, told: set[str]) -> str | None:
    """Measure ``cand`` (as ``bench_config``) into ``report``; returns why the sweep stops instead (cancelled,
    budget), or None."""
    if cancelled is not None and cancelled():
        return "cancelled"
    done, elapsed = len(report.results), time.monotonic() - t0
    if budget_s is not None and done and elapsed + elapsed / done > budget_s:
        return "budget"  # the next candidate would most likely end past the budget
    t_cand = time.monotonic()
    try:
        result = bench(bench_config, bench_out or io.StringIO(), client=client, told=told)
    except KeyboardInterrupt:
        client.kill()  # mid-answer: its reply would arrive for a request nobody reads any more
        return "cancelled"
    except AppError:  # EngineCrashedError included: the window's Cancel ends the worker mid-setting
        if cancelled is not None and cancelled():
            client.kill()
            return "cancelled"
        raise
    if bench_config.keep_traces:
        report.traces = list(result.traces)
    report.results.append(Measured.of(cand, result, time.monotonic() - t_cand))
    return None


def save_winner(report: TuneReport) -> TunedSettings | None:
    """Save the best measured setting for the pair; None when nothing was measured. Raises StorageError."""
    tuned = report.tuned()
    if tuned is None:
        return None
    report.saved_to = str(save_tuned(report.target, report.drafter, tuned))
    return tuned


def table(report: TuneReport) -> str:
    """The ranked results as text: speedup with its spread, tok/s and acceptance per setting."""
    lines = [f"{'#':>2}  {'drafter':<7} {'key':>3}  {'depth':<13} {'speedup':>7}  {'spread':<11} "
             f"{'tok/s':>7} {'plain':>7} {'accept':>6}"]
    for n, m in enumerate(report.ranked, 1):
        c = m.candidate
        spread = f"{m.speedup_min:.2f}–{m.speedup_max:.2f}" if c != PLAIN else "reference"
        lines.append(f"{n:>2}  {c.drafter:<7} {c.ngram or '-':>3}  {c.depth:<13} {m.speedup:>6.2f}×  "
                     f"{spread:<11} {m.tok_s:>7.1f} {m.baseline_tok_s:>7.1f} "
                     f"{m.acceptance if c != PLAIN else 0:>6.2f}")
    if report.replayed:
        top = report.replayed[0]
        lines.append(f"replayed offline: {len(report.replayed)} suffix-drafter settings in "
                     f"{report.replay_seconds:.1f} s; best {top.candidate.label()}, predicted {top.speedup:.2f}× "
                     f"(τ {top.tau:.2f}), measured above")
    return "\n".join(lines)
