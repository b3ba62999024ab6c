"""`specdeck bench`: the one way SpecDeck's speed is measured.

Every decode runs in the engine worker process, as in the app, so a model that aborts llama.cpp ends the
bench with one sentence instead of taking it down. Each answer is timed inside the worker (one ``BenchRun``
request, one ``BenchResult`` reply, nothing through the pipe in between), so the pipe costs nothing in the
timed window. With --baseline each prompt's speculative and plain runs alternate, in alternating order, in
one worker, so that a noisy machine drifts both the same way; speedups are ratios of those side-by-side
runs, and --repeat N gives their median and spread. --raw adds a bare llama_decode loop, to show what the
engine's own Python costs on top of llama.cpp. Every rate comes from ``app.events.RunCounts``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import numpy as np

from app.engine.prompts import read_prompts as read_prompts  # re-exported: tune and benchmarks/ import it here
from app.errors import AppError, SettingsError
from app.events import (
    BenchResult,
    BenchRun,
    EngineCrashed,
    EngineError,
    Finished,
    Loaded,
    MessageStats,
    PassStats,
    RawDecode,
    RawDecoded,
    RunCounts,
    SourceCounts,
    Token,
    source_counts,
)
from app.params import K_MAX, RECURRENT_ROLLBACKS, DraftSettings, LoadSettings, SamplingSettings
from app.safe_text import terminal_safe

JSON_VERSION = 1
WATCHDOG_SECONDS = 1800.0  # a BenchRun answers once, at its end: a slow model may be silent for minutes


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """`specdeck bench`'s options, also parsed by `tune` and the window's sweep (one set of defaults)."""
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model (GGUF with the target's vocabulary)")
    parser.add_argument("--ngram", type=int, default=0, metavar="N", help="suffix drafter's shortest match (0 = off)")
    parser.add_argument("--mtp", action="store_true",
                        help="draft with the target's own MTP heads (Qwen3.5/3.6 GGUFs that ship them)")
    depth = parser.add_mutually_exclusive_group()
    depth.add_argument("--k", type=int, help="fixed draft depth (0 = plain decoding)")
    depth.add_argument("--adaptive", action="store_true", help="choose the depth each pass (default)")
    parser.add_argument("--k-max", type=int, default=K_MAX, help="largest depth the adaptive policy may choose")
    parser.add_argument("--model-start", type=float, metavar="A",
                        help="start the model drafter's acceptance estimate at A (the window, chat and serve start "
                        "from the pair's measured figure; bench from the policy's prior unless this is given)")
    parser.add_argument("--prompts", required=True, type=Path, help='JSONL, one {"messages": [...]} per line')
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=40)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--min-p", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--ctx", type=int, default=4096, help="context size")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = physical cores)")
    parser.add_argument("--recurrent-rollback", choices=RECURRENT_ROLLBACKS, default="auto",
                        help="how a recurrent or hybrid target takes back rejected drafts: llama.cpp's state "
                        "snapshots where it has them (auto), or always a checkpoint")
    parser.add_argument("--baseline", action="store_true", help="also run each prompt without speculation")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each prompt N times (speculative and plain alternating, in alternating order); "
                        "speedups are reported as median, min and max")
    parser.add_argument("--raw", action="store_true", help="also time a bare llama_decode loop")
    parser.add_argument("--json", type=Path, help="write the full report here")


class EngineCrashedError(AppError):
    """The worker died while the bench drove it; the message is the one sentence to show."""


# --- in the worker ---------------------------------------------------------------------------------


def bench_run(session: Any, request: BenchRun) -> BenchResult:
    """One answer from an empty cache (so runs are comparable), with or without speculation."""
    decoder = session.plain_decoder if request.plain else session.decoder
    decoder.reset_cache()
    prompt, warning = session.prompt_tokens(request.messages)
    token_ids: list[int] = []
    text: list[str] = []
    overheads: list[float] = []
    passes: list[PassStats] = []
    stats: MessageStats | None = None
    reason = ""
    t0 = time.perf_counter()
    t_first = 0.0
    for event in session.generate(request.request_id, (), request.sampling, prompt=prompt, decoder=decoder):
        if isinstance(event, Token):
            if event.token_ids and not token_ids:
                t_first = time.perf_counter()
            token_ids += event.token_ids
            text.append(event.text)
        elif isinstance(event, PassStats):
            overheads.append(event.overhead_seconds)
            passes.append(event)
        elif isinstance(event, Finished):
            stats, reason = event.stats, event.reason
    seconds = time.perf_counter() - t0
    assert stats is not None  # session.generate always ends with Finished
    cost = session.decoder.controller.cost.widths
    return BenchResult(
        request_id=request.request_id, prompt_tokens=len(prompt), token_ids=tuple(token_ids), text="".join(text),
        reason=reason, stats=stats, seconds=seconds, ttft_seconds=t_first - t0 if t_first else 0.0,
        overhead_seconds=tuple(overheads), verify_cost=tuple(sorted(cost.items())), warning=warning,
        draft_step_seconds=session.decoder.controller.cost.draft_step, sources=source_counts(passes),
        prompt_ids=tuple(prompt),
    )


def raw_decode(session: Any, request: RawDecode) -> RawDecoded:
    """Prefill ``request.messages`` as a chat prompt, or ``request.text`` (or the BOS token), then ``n_tokens``
    bare greedy one-token decodes."""
    model, ctx = session.target, session.ctx
    session.decoder.reset_cache()
    if request.messages:
        prompt, _warning = session.prompt_tokens(list(request.messages))
    elif request.text:
        prompt = model.tokenize(request.text, add_special=True, parse_special=True)
    else:
        prompt = [model.bos if model.bos >= 0 else 0]
    try:
        first = int(np.argmax(ctx.prefill(prompt)[-1]))
        done, seconds = ctx.greedy_loop(first, request.n_tokens)
    finally:
        session.decoder.reset_cache()
    return RawDecoded(request.request_id, len(prompt), done, seconds)


# --- in the bench process --------------------------------------------------------------------------


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

    def as_json(self) -> dict[str, Any]:
        c, s = self.counts, self.stats
        return {
            "tokens": c.tokens,
            "seconds": round(self.seconds, 4),
            "decode_seconds": round(c.decode_seconds, 4),
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
            "overhead_ms_median": _median_ms(self.overheads),
            "sources": _sources_json([self]),
            "stop_reason": self.reason,
        }


def _median_ms(values: Sequence[float]) -> float:
    return round(statistics.median(values) * 1000, 3) if values else 0.0


def _totals(runs: Sequence[RunResult]) -> dict[str, Any]:
    counts = sum((r.counts for r in runs), RunCounts())
    return {
        "tokens": counts.tokens,
        "seconds": round(sum(r.seconds for r in runs), 4),
        "decode_seconds": round(counts.decode_seconds, 4),
        "decode_tokens": counts.decode_tokens,
        "tok_s": round(counts.decode_tps, 2),
        "acceptance": round(counts.acceptance, 4),
        "tokens_per_pass": round(counts.tokens_per_pass, 3),
        "overhead_ms_median": _median_ms([o for r in runs for o in r.overheads]),
        "sources": _sources_json(runs),
    }


def _sources_json(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Each draft source's drafted, accepted and per-position acceptance over ``runs``."""
    totals: dict[str, SourceCounts] = {}
    for run in runs:
        for counts in run.sources:
            totals[counts.source] = totals[counts.source] + counts if counts.source in totals else counts
    return {source: counts.as_json() for source, counts in totals.items()}


def _ratio(spec: Sequence[RunResult], base: Sequence[RunResult]) -> float:
    s = sum((r.counts for r in spec), RunCounts()).decode_tps
    b = sum((r.counts for r in base), RunCounts()).decode_tps
    return s / b if b else 0.0


def _drafter_cost(step: float, verify: dict[int, float]) -> dict[str, float]:
    """The model drafter's step in ms and c, a step over a one-token target pass (the mission's cost ratio)."""
    if step <= 0 or verify.get(1, 0.0) <= 0:
        return {}
    return {"drafter_step_ms": round(step * 1000, 3), "c": round(step / verify[1], 3)}


def _spread(values: Sequence[float]) -> dict[str, Any]:
    """The median speedup and its spread over repeats."""
    return {"speedup": round(statistics.median(values), 3), "speedup_min": round(min(values), 3),
            "speedup_max": round(max(values), 3)}


E = TypeVar("E")


def crash_sentence(event: EngineCrashed) -> str:
    """One sentence for a worker that died: signal or status, phase, llama.cpp's last words, advice."""
    how = f"was killed by {event.signal_name}" if event.signal_name else f"exited with status {event.exit_code}"
    phase = {"load": "while loading the model", "generate": "while decoding"}.get(event.during, "while idle")
    said = [line.strip() for line in event.last_log_lines if line.strip()][-2:]
    last = f" (llama.cpp's last lines: {' / '.join(said)})" if said else ""
    advice = ("the model file may be damaged or of a kind this llama.cpp build cannot run: check it with "
              "`specdeck doctor --decode-check`, or try another model")
    return f"llama.cpp {how} {phase}{last}; {advice}."


def _await(client: Any, kind: type[E]) -> E:
    """The reply of type ``kind`` to the request just sent; an engine error or crash raises."""
    for event in client.events(timeout=WATCHDOG_SECONDS):
        if isinstance(event, EngineCrashed):
            raise EngineCrashedError(crash_sentence(event))
        if isinstance(event, EngineError):
            raise AppError(event.message)
        if isinstance(event, kind):
            return event
    raise AppError("The engine ended the request without an answer.")  # pragma: no cover - events() raises


def alternating_order(prompt_index: int, repeat: int) -> tuple[bool, bool]:
    """Which run goes first, as (plain?, plain?): the order flips every repeat and every prompt."""
    return (False, True) if (prompt_index + repeat) % 2 == 0 else (True, False)


def ceiling(target: str, n_ctx: int) -> dict[str, Any] | None:
    """The roofline ceiling for this target on this machine (None when it cannot be computed)."""
    from app.engine.doctor_report import ceiling_summary

    try:
        return ceiling_summary(target, n_ctx)
    except AppError:
        return None


def bench(args: Any, out: TextIO, *, client: Any = None, told: set[str] | None = None) -> dict[str, Any]:
    """Run the benchmark that ``args`` (the CLI's namespace) describes; print a table; return the report.

    ``told`` holds the warnings already printed (a caller running several benches, like tune, passes one set
    so each warning is printed once across them)."""
    from app.engine.client import EngineClient

    draft = DraftSettings(
        drafter_path=str(args.drafter) if args.drafter else None,
        ngram=args.ngram,
        mtp=getattr(args, "mtp", False),
        adaptive=args.k is None,
        k=args.k if args.k is not None else 4,
        k_max=args.k_max if args.k is None else max(args.k, 1),
        model_start=getattr(args, "model_start", None),
    )
    settings = LoadSettings(target_path=str(args.target), draft=draft, n_ctx=args.ctx, n_threads=args.threads,
                            recurrent_rollback=getattr(args, "recurrent_rollback", "auto")).validate()
    sampling = SamplingSettings(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens,
                                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p).validate()
    repeats = getattr(args, "repeat", 1)
    if repeats < 1:
        raise SettingsError(f"--repeat must be at least 1, not {repeats}.")
    prompts = read_prompts(Path(args.prompts))
    own_client = client is None
    client = client or EngineClient(watchdog_seconds=WATCHDOG_SECONDS)
    try:
        client.load(settings)
        loaded = _await(client, Loaded)
        note = settings.context_note(loaded.n_ctx)
        if note:
            print(f"specdeck bench: {note}", file=sys.stderr)
        return _measure(client, args, draft, sampling, prompts, repeats, loaded, out,
                        set() if told is None else told)
    finally:
        if own_client:
            client.close()


def _measure(client: Any, args: Any, draft: DraftSettings, sampling: SamplingSettings,
             prompts: list[list[dict[str, str]]], repeats: int, loaded: Loaded, out: TextIO,
             told: set[str]) -> dict[str, Any]:
    from app.storage.pair_stats import drafter_key
    from app.storage.pair_stats import record as record_acceptance

    verify_cost: list[tuple[int, float]] = []
    draft_step = [0.0]  # the latest run's model-drafter step, kept through runs without one

    def run(messages: list[dict[str, str]], plain: bool) -> RunResult:
        client.bench_run(messages, sampling, plain)
        result = _await(client, BenchResult)
        if result.warning and result.warning not in told:  # a refused template: say so, once
            told.add(result.warning)
            print(f"specdeck bench: {terminal_safe(result.warning, one_line=True)}", file=sys.stderr)
        verify_cost[:] = result.verify_cost  # what the cost model holds after the latest run
        draft_step[0] = result.draft_step_seconds or draft_step[0]
        return RunResult.of(result)

    target_name = terminal_safe(loaded.target.name, one_line=True)  # GGUF metadata is untrusted
    drafter_name = ("the target's MTP heads" if draft.mtp
                    else terminal_safe(loaded.drafter.name, one_line=True) if loaded.drafter else "none")
    print(f"target {target_name} ({loaded.target.size_bytes / 1e6:.0f} MB), "
          f"drafter {drafter_name}, n-gram {draft.ngram or 'off'}, "
          f"k {'adaptive ≤ ' + str(draft.k_max) if draft.adaptive else draft.k}, backend {loaded.backend}"
          + (f", {repeats} repeats" if repeats > 1 else ""), file=out)
    print(f"{'#':>2} {'tokens':>6} {'tok/s':>8} {'base':>8} {'speedup':>7} {'spread':>11} {'accept':>6} "
          f"{'τ':>5} {'same':>5}", file=out)
    rows: list[dict[str, Any]] = []
    spec_by_repeat: list[list[RunResult]] = [[] for _ in range(repeats)]
    base_by_repeat: list[list[RunResult]] = [[] for _ in range(repeats)]
    key = drafter_key(draft.drafter_path, draft.ngram)
    traces: list[dict[str, list[int]]] = []  # each prompt's tokens and its answer (plain decoding's, if run)
    for index, messages in enumerate(prompts):
        specs: list[RunResult] = []
        bases: list[RunResult] = []
        firsts: list[str] = []
        for r in range(repeats):
            order = alternating_order(index, r) if args.baseline else (False,)
            firsts.append("plain" if order[0] else "speculative")
            for plain in order:
                result = run(messages, plain)
                (bases if plain else specs).append(result)
        spec = specs[0]
        answered = bases[0] if bases else spec
        traces.append({"prompt": answered.prompt_ids, "answer": answered.tokens})
        for r in range(repeats):
            spec_by_repeat[r].append(specs[r])
            if bases:
                base_by_repeat[r].append(bases[r])
        for s in specs:
            if s.stats is not None and key is not None:
                record_acceptance(str(args.target), key, s.stats)
        # The run fields are the first repeat's; "runs" has every repeat, "speedup" their median.
        row: dict[str, Any] = {"index": index, "prompt_tokens": spec.prompt_tokens, **spec.as_json()}
        row["runs"] = [{"tok_s": round(s.decode_tps, 2), "first": first} for s, first in zip(specs, firsts,
                                                                                             strict=True)]
        spread = ""
        if bases:
            base = bases[0]
            n = min(len(base.tokens), len(spec.tokens))
            row["baseline"] = base.as_json()
            ratios = [_ratio([s], [b]) for s, b in zip(specs, bases, strict=True)]
            for run_json, b, ratio in zip(row["runs"], bases, ratios, strict=True):
                run_json.update(baseline_tok_s=round(b.decode_tps, 2), speedup=round(ratio, 3))
            row.update(_spread(ratios))
            row["identical"] = all(b.tokens == s.tokens for s, b in zip(specs, bases, strict=True))
            row["agree_prefix"] = next((i for i in range(n) if base.tokens[i] != spec.tokens[i]), n)
            if repeats > 1:
                spread = f"{row['speedup_min']:.2f}–{row['speedup_max']:.2f}"
        rows.append(row)
        print(f"{index:>2} {len(spec.tokens):>6} {statistics.median(s.decode_tps for s in specs):>8.1f} "
              f"{statistics.median(b.decode_tps for b in bases) if bases else 0:>8.1f} "
              f"{row.get('speedup', 0):>7.2f} {spread:>11} "
              f"{row['acceptance']:>6.2f} {row['tokens_per_pass']:>5.2f} {row.get('identical', '-')!s:>5}",
              file=out)
    all_spec = [s for runs in spec_by_repeat for s in runs]
    total: dict[str, Any] = _totals(all_spec)
    if args.baseline:
        total["baseline"] = _totals([b for runs in base_by_repeat for b in runs])
        per_repeat = [_ratio(s, b) for s, b in zip(spec_by_repeat, base_by_repeat, strict=True)]
        total["speedups"] = [round(v, 3) for v in per_repeat]
        total.update(_spread(per_repeat))
        total["identical"] = all(r.get("identical") for r in rows)
    report: dict[str, Any] = {
        "version": JSON_VERSION,
        "target": str(args.target),
        "drafter": str(args.drafter) if args.drafter else None,
        "ngram": draft.ngram,
        "mtp": draft.mtp,
        "adaptive": draft.adaptive,
        "k": None if draft.adaptive else draft.k,
        "k_max": draft.k_max,
        "temperature": sampling.temperature,
        "seed": sampling.seed,
        "max_tokens": sampling.max_tokens,
        "repeat": repeats,
        "backend": loaded.backend,
        "verify_cost_ms": {str(w): round(t * 1000, 3) for w, t in verify_cost},
        **_drafter_cost(draft_step[0], dict(verify_cost)),
        "prompts": rows,
        "total": total,
        "ceiling": ceiling(str(args.target), loaded.n_ctx),
    }
    if getattr(args, "keep_traces", False):  # tune replays them; the bench's own JSON stays as it was
        report["traces"] = traces
    if args.raw:
        report["raw"] = _raw(client, prompts[0], args.max_tokens, out)
    summary = (f"total: {total['tok_s']:.1f} tok/s, acceptance {total['acceptance']:.2f}, "
               f"τ {total['tokens_per_pass']:.2f}")
    if args.baseline:
        summary += f", baseline {total['baseline']['tok_s']:.1f} tok/s, speedup {total['speedup']:.2f}x"
        if repeats > 1:
            summary += f" (median of {repeats}; {total['speedup_min']:.2f}–{total['speedup_max']:.2f})"
        summary += f", identical {total['identical']}"
    summary += f", Python overhead per pass {total['overhead_ms_median']:.3f} ms (median)"
    if "c" in report:
        summary += f", drafter step {report['drafter_step_ms']:.2f} ms (c {report['c']:.2f})"
    print(summary, file=out)
    return report


def _raw(client: Any, messages: list[dict[str, str]], max_tokens: int, out: TextIO) -> dict[str, Any]:
    """The bare llama_decode loop against plain decoding through the engine, alternating, three times; both
    after the same prompt (at a shorter context a pass is cheaper: 142 against 111 tok/s on SmolLM2 here)."""
    plain = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
    raw_rates, eng_rates = [], []
    for _ in range(3):
        client.raw_decode(max_tokens, messages=messages)
        raw_rates.append(_await(client, RawDecoded).tokens_per_second)
        client.bench_run(messages, plain, True)
        eng_rates.append(RunResult.of(_await(client, BenchResult)).decode_tps)
    raw, eng = statistics.median(raw_rates), statistics.median(eng_rates)
    print(f"plain decode through the engine: {eng:.1f} tok/s; bare llama_decode loop: {raw:.1f} tok/s; "
          f"ratio {eng / raw if raw else 0:.3f}", file=out)
    return {"bare_loop_tok_s": round(raw, 2), "engine_plain_tok_s": round(eng, 2),
            "ratio": round(eng / raw, 3) if raw else 0.0}
