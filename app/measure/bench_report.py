"""What a bench measured, as numbers and as the report `specdeck bench --json` writes: one answer
(``RunResult``), runs summed (``Totals``), speculative over plain side by side (``Speedup``) and the whole
report (``BenchReport``). Every rate comes from ``app.events.RunCounts``; figures are rounded here, as written.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from app.events import BenchResult, MessageStats, RunCounts, SourceCounts

JSON_VERSION = 1
SECONDS_DIGITS = 6  # microseconds: a tiny model's window is a few milliseconds, and 4 digits moved its rate by 1 %

# The report as `--json` writes it: JSON values all the way down.
JSONValue: TypeAlias = "str | int | float | bool | Sequence[JSONValue] | Mapping[str, JSONValue] | None"
JSONObject: TypeAlias = "dict[str, JSONValue]"


@dataclass
class RunResult:
    """One answer as the bench saw it."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    seconds: float = 0.0  # wall time in the worker, prefill included
    ttft: float = 0.0
    overheads: list[float] = field(default_factory=list)
    reason: str = ""
    stats: MessageStats | None = None
    prompt_tokens: int = 0
    sources: tuple[SourceCounts, ...] = ()
    prompt_ids: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, result: BenchResult) -> RunResult:
        return cls(list(result.token_ids), result.text, result.seconds, result.ttft_seconds,
                   list(result.overhead_seconds), result.reason, result.stats, result.prompt_tokens,
                   result.sources, list(result.prompt_ids))

    @property
    def counts(self) -> RunCounts:
        return self.stats.counts if self.stats is not None else RunCounts()

    @property
    def decode_tps(self) -> float:
        return self.counts.decode_tps

    def as_json(self) -> JSONObject:
        c, s = self.counts, self.stats
        return {
            "tokens": c.tokens,
            "seconds": round(self.seconds, 4),
            "decode_seconds": round(c.decode_seconds, SECONDS_DIGITS),
            "decode_tokens": c.decode_tokens,
            "tok_s": round(c.decode_tps, 2),
            "ttft_s": round(self.ttft, 4),
            "passes": c.passes,
            "drafted": c.drafted,
            "accepted": c.accepted,
            "acceptance": round(c.acceptance, 4),
            "tokens_per_pass": round(c.tokens_per_pass, 3),
            "per_position_acceptance": [round(a, 4) for a in s.per_position_acceptance] if s else [],
            "k_history": list(s.k_history) if s else [],
            "overhead_ms_median": median_ms(self.overheads),
            "sources": sources_json([self]),
            "stop_reason": self.reason,
        }


def median_ms(values: Sequence[float]) -> float:
    return round(statistics.median(values) * 1000, 3) if values else 0.0


@dataclass(frozen=True)
class Totals:
    """Runs summed: their counts, wall time and Python overhead; figures rounded as the report writes them."""

    runs: tuple[RunResult, ...]

    @property
    def counts(self) -> RunCounts:
        return sum((r.counts for r in self.runs), RunCounts())

    @property
    def tok_s(self) -> float:
        return round(self.counts.decode_tps, 2)

    @property
    def acceptance(self) -> float:
        return round(self.counts.acceptance, 4)

    @property
    def tokens_per_pass(self) -> float:
        return round(self.counts.tokens_per_pass, 3)

    @property
    def overhead_ms_median(self) -> float:
        return median_ms([o for r in self.runs for o in r.overheads])

    def as_json(self) -> JSONObject:
        counts = self.counts
        return {
            "tokens": counts.tokens,
            "seconds": round(sum(r.seconds for r in self.runs), 4),
            "decode_seconds": round(counts.decode_seconds, SECONDS_DIGITS),
            "decode_tokens": counts.decode_tokens,
            "tok_s": self.tok_s,
            "acceptance": self.acceptance,
            "tokens_per_pass": self.tokens_per_pass,
            "overhead_ms_median": self.overhead_ms_median,
            "sources": sources_json(self.runs),
        }


@dataclass(frozen=True)
class Speedup:
    """Speculative over plain decoding, side by side: one ratio per repeat, their median and spread."""

    ratios: tuple[float, ...]
    identical: bool  # every speculative answer was the plain answer, token for token

    @property
    def speedups(self) -> list[float]:
        return [round(v, 3) for v in self.ratios]

    @property
    def median(self) -> float:
        return speedup_spread(self.ratios)["speedup"]

    @property
    def low(self) -> float:
        return speedup_spread(self.ratios)["speedup_min"]

    @property
    def high(self) -> float:
        return speedup_spread(self.ratios)["speedup_max"]


Trace = dict[str, list[int]]  # one prompt's tokens ("prompt") and its answer ("answer")


@dataclass(frozen=True)
class PromptResult:
    """One prompt's runs: its speculative answers and, with a baseline, the plain answers beside them, one per
    repeat, and which of the two ran first in each repeat."""

    index: int
    specs: tuple[RunResult, ...]
    bases: tuple[RunResult, ...]  # empty without a baseline
    firsts: tuple[str, ...]  # "plain" or "speculative", per repeat

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(rate_ratio([s], [b]) for s, b in zip(self.specs, self.bases, strict=True))

    @property
    def identical(self) -> bool:
        """Every speculative answer was the plain answer beside it, token for token."""
        return all(b.tokens == s.tokens for s, b in zip(self.specs, self.bases, strict=True))

    def as_json(self) -> JSONObject:
        """The first repeat's run fields; "runs" has every repeat, "speedup" their median."""
        spec = self.specs[0]
        row: JSONObject = {"index": self.index, "prompt_tokens": spec.prompt_tokens, **spec.as_json()}
        runs: list[JSONObject] = [{"tok_s": round(s.decode_tps, 2), "first": first}
                                  for s, first in zip(self.specs, self.firsts, strict=True)]
        row["runs"] = runs
        if self.bases:
            base = self.bases[0]
            n = min(len(base.tokens), len(spec.tokens))
            row["baseline"] = base.as_json()
            for run_json, b, ratio in zip(runs, self.bases, self.ratios, strict=True):
                run_json.update(baseline_tok_s=round(b.decode_tps, 2), speedup=round(ratio, 3))
            row.update(speedup_spread(self.ratios))
            row["identical"] = self.identical
            row["agree_prefix"] = next((i for i in range(n) if base.tokens[i] != spec.tokens[i]), n)
        return row


@dataclass(frozen=True)
class DrafterStep:
    """The model drafter's step, timed in the worker, and c: a step over a one-token target pass."""

    seconds: float
    c: float

    @classmethod
    def of(cls, step: float, verify: Mapping[int, float]) -> DrafterStep | None:
        one = verify.get(1, 0.0)
        return cls(step, step / one) if step > 0 and one > 0 else None

    def as_json(self) -> JSONObject:
        return {"drafter_step_ms": round(self.seconds * 1000, 3), "c": round(self.c, 3)}


@dataclass(frozen=True)
class RunSetup:
    """What was measured, as the report names it: the pair, its drafting and sampling settings, the backend."""

    target: str
    drafter: str | None
    ngram: int
    mtp: bool
    adaptive: bool
    k: int
    k_max: int
    temperature: float
    seed: int
    max_tokens: int
    repeat: int
    backend: str
    rpc_servers: tuple[str, ...]
    network_seconds: float  # per pass: the RPC servers' round trips measured at load

    def as_json(self) -> JSONObject:
        return {"version": JSON_VERSION, "target": self.target, "drafter": self.drafter, "ngram": self.ngram,
                "mtp": self.mtp, "adaptive": self.adaptive, "k": None if self.adaptive else self.k,
                "k_max": self.k_max, "temperature": self.temperature, "seed": self.seed,
                "max_tokens": self.max_tokens, "repeat": self.repeat, "backend": self.backend,
                "rpc_servers": list(self.rpc_servers), "network_ms_per_pass": round(self.network_seconds * 1000, 3)}


@dataclass(frozen=True)
class BenchReport:
    """What one bench measured, typed throughout; ``as_json`` writes it as `--json` does, in one place."""

    setup: RunSetup
    prompts: tuple[PromptResult, ...]
    total: Totals  # the speculative runs (plain decoding's, with speculation off)
    baseline: Totals | None  # the plain runs beside them, with a baseline
    speedup: Speedup | None  # with a baseline
    verify_cost: tuple[tuple[int, float], ...]  # (width, seconds): what the cost model held after the last run
    drafter_step: DrafterStep | None  # where a model drafter drafted
    ceiling: JSONObject | None  # the roofline for this target here (None when it cannot be computed)
    raw: JSONObject | None = None  # with raw: the bare llama_decode loop beside the engine
    traces: tuple[Trace, ...] = ()  # with keep_traces: each prompt's tokens and answer (plain decoding's, if run)

    @property
    def verify_cost_ms(self) -> dict[str, float]:
        """By verify width, in milliseconds, as the report writes and the verify-cost store keeps them."""
        return {str(w): round(t * 1000, 3) for w, t in self.verify_cost}

    def as_json(self) -> JSONObject:
        total = self.total.as_json()
        if self.baseline is not None and self.speedup is not None:
            total["baseline"] = self.baseline.as_json()
            total["speedups"] = self.speedup.speedups
            total.update(speedup_spread(self.speedup.ratios))
            total["identical"] = self.speedup.identical
        document: JSONObject = {**self.setup.as_json(), "verify_cost_ms": self.verify_cost_ms,
                                **(self.drafter_step.as_json() if self.drafter_step else {}),
                                "prompts": [p.as_json() for p in self.prompts], "total": total,
                                "ceiling": self.ceiling}
        if self.raw is not None:
            document["raw"] = self.raw
        return document


def sources_json(runs: Sequence[RunResult]) -> JSONObject:
    """Each draft source's drafted, accepted and per-position acceptance over ``runs``."""
    totals: dict[str, SourceCounts] = {}
    for run in runs:
        for counts in run.sources:
            totals[counts.source] = totals[counts.source] + counts if counts.source in totals else counts
    return {source: counts.as_json() for source, counts in totals.items()}


def rate_ratio(spec: Sequence[RunResult], base: Sequence[RunResult]) -> float:
    s = sum((r.counts for r in spec), RunCounts()).decode_tps
    b = sum((r.counts for r in base), RunCounts()).decode_tps
    return s / b if b else 0.0


def speedup_spread(values: Sequence[float]) -> dict[str, float]:
    """The median speedup and its spread over repeats."""
    return {"speedup": round(statistics.median(values), 3), "speedup_min": round(min(values), 3),
            "speedup_max": round(max(values), 3)}
