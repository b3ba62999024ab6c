"""`specdeck bench`: the one way SpecDeck's speed is measured.

Each prompt runs with speculation and, with --baseline, without it, alternating in one process so that a
noisy machine drifts both the same way. Speedups are ratios of those side-by-side runs. --raw adds a bare
llama_decode loop, to show what the engine's own Python costs on top of llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.params import DraftSettings, LoadSettings, SamplingSettings
from app.engine.prompts import read_prompts
from app.errors import AppError
from app.events import Finished, MessageStats, PassStats, Token
from app.library.pair_stats import drafter_key
from app.library.pair_stats import record as record_acceptance

JSON_VERSION = 1


@dataclass
class RunResult:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    seconds: float = 0.0  # wall time including prefill
    decode_seconds: float = 0.0
    ttft: float = 0.0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: tuple[float, ...] = ()
    k_history: tuple[int, ...] = ()
    overheads: list[float] = field(default_factory=list)
    reason: str = ""
    stats: MessageStats | None = None

    @property
    def decode_tps(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_seconds if self.decode_seconds > 0 and n > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens": len(self.tokens),
            "seconds": round(self.seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4),
            "tok_s": round(self.decode_tps, 2),
            "ttft_s": round(self.ttft, 4),
            "passes": self.passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "tokens_per_pass": round(len(self.tokens) / self.passes, 3) if self.passes else 0.0,
            "per_position_acceptance": [round(a, 4) for a in self.per_position],
            "k_history": list(self.k_history),
            "overhead_ms_median": round(statistics.median(self.overheads) * 1000, 3) if self.overheads else 0.0,
            "stop_reason": self.reason,
        }


def run_once(session: Any, prompt: Sequence[int], sampling: SamplingSettings, plain: bool) -> RunResult:
    """One answer from a fresh cache (so runs are comparable), with or without speculation."""
    decoder = session.plain_decoder if plain else session.decoder
    decoder.reset_cache()
    result = RunResult()
    t0 = time.perf_counter()
    t_first = 0.0
    for event in session.generate(0, (), sampling, prompt=prompt, decoder=decoder):
        if isinstance(event, Token):
            if event.token_ids and not result.tokens:
                t_first = time.perf_counter()
            result.tokens += event.token_ids
            result.text += event.text
        elif isinstance(event, PassStats):
            result.overheads.append(event.overhead_seconds)
        elif isinstance(event, Finished):
            s = event.stats
            result.stats = s
            result.decode_seconds = s.decode_seconds
            result.passes = s.passes
            result.drafted = s.drafted
            result.accepted = s.accepted
            result.per_position = s.per_position_acceptance
            result.k_history = s.k_history
            result.reason = event.reason
    result.seconds = time.perf_counter() - t0
    result.ttft = t_first - t0 if t_first else 0.0
    return result


def raw_decode_loop(session: Any, prompt: Sequence[int], n_tokens: int) -> float:
    """A bare llama_decode + argmax loop on the same context: tokens per second of decode."""
    import llama_cpp as lc
    import numpy as np

    ctx = session.ctx
    session.decoder.reset_cache()
    ctx.prefill(list(prompt))
    n_vocab = ctx.n_vocab
    tok = int(np.argmax(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx._ptr, -1), shape=(n_vocab,))))
    t0 = time.perf_counter()
    done = 0
    for _ in range(n_tokens):
        if ctx.n_past + 1 > ctx.n_ctx:
            break
        batch = lc.llama_batch_get_one((lc.llama_token * 1)(tok), 1)
        if lc.llama_decode(ctx._ptr, batch) != 0:
            break
        ctx.n_past += 1
        tok = int(np.argmax(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx._ptr, -1), shape=(n_vocab,))))
        done += 1
    lc.llama_synchronize(ctx._ptr)
    seconds = time.perf_counter() - t0
    session.decoder.reset_cache()
    return done / seconds if seconds > 0 else 0.0


def _aggregate(runs: list[RunResult]) -> dict[str, Any]:
    tokens = sum(len(r.tokens) - 1 for r in runs if r.tokens)
    seconds = sum(r.decode_seconds for r in runs)
    drafted = sum(r.drafted for r in runs)
    accepted = sum(r.accepted for r in runs)
    passes = sum(r.passes for r in runs)
    overheads = [o for r in runs for o in r.overheads]
    return {
        "tokens": sum(len(r.tokens) for r in runs),
        "seconds": round(sum(r.seconds for r in runs), 4),
        "decode_seconds": round(seconds, 4),
        "tok_s": round(tokens / seconds, 2) if seconds else 0.0,
        "acceptance": round(accepted / drafted, 4) if drafted else 0.0,
        "tokens_per_pass": round(sum(len(r.tokens) for r in runs) / passes, 3) if passes else 0.0,
        "overhead_ms_median": round(statistics.median(overheads) * 1000, 3) if overheads else 0.0,
    }


def bench(args: argparse.Namespace, out: Any = sys.stdout) -> dict[str, Any]:
    from app.engine.session import EngineSession

    draft = DraftSettings(
        drafter_path=str(args.drafter) if args.drafter else None,
        ngram=args.ngram,
        adaptive=args.k is None,
        k=args.k if args.k is not None else 4,
        k_max=args.k_max if args.k is None else max(args.k, 1),
    )
    settings = LoadSettings(target_path=str(args.target), draft=draft, n_ctx=args.ctx, n_threads=args.threads)
    sampling = SamplingSettings(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens,
                                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p).validate()
    prompts = read_prompts(Path(args.prompts))
    session = EngineSession(settings)
    loaded = session.loaded_event()
    print(f"target {loaded.target.name} ({loaded.target.size_bytes / 1e6:.0f} MB), "
          f"drafter {loaded.drafter.name if loaded.drafter else 'none'}, n-gram {draft.ngram or 'off'}, "
          f"k {'adaptive ≤ ' + str(draft.k_max) if draft.adaptive else draft.k}, backend {loaded.backend}", file=out)
    rows: list[dict[str, Any]] = []
    spec_runs: list[RunResult] = []
    base_runs: list[RunResult] = []
    header = f"{'#':>2} {'tokens':>6} {'tok/s':>8} {'base':>8} {'speedup':>7} {'accept':>6} {'τ':>5} {'same':>5}"
    print(header, file=out)
    for index, messages in enumerate(prompts):
        prompt, _ = session.prompt_tokens(messages)
        base = run_once(session, prompt, sampling, plain=True) if args.baseline else None
        spec = run_once(session, prompt, sampling, plain=False)
        spec_runs.append(spec)
        if spec.stats is not None and (key := drafter_key(draft.drafter_path, draft.ngram)) is not None:
            record_acceptance(str(args.target), key, spec.stats)
        row: dict[str, Any] = {"index": index, "prompt_tokens": len(prompt), **spec.as_json()}
        if base is not None:
            base_runs.append(base)
            n = min(len(base.tokens), len(spec.tokens))
            agree = next((i for i in range(n) if base.tokens[i] != spec.tokens[i]), n)
            row["baseline"] = base.as_json()
            row["speedup"] = round(spec.decode_tps / base.decode_tps, 3) if base.decode_tps else 0.0
            row["identical"] = base.tokens == spec.tokens
            row["agree_prefix"] = agree
        rows.append(row)
        print(f"{index:>2} {len(spec.tokens):>6} {spec.decode_tps:>8.1f} "
              f"{(base.decode_tps if base else 0):>8.1f} {row.get('speedup', 0):>7.2f} "
              f"{row['acceptance']:>6.2f} {row['tokens_per_pass']:>5.2f} {row.get('identical', '-')!s:>5}",
              file=out)
    total: dict[str, Any] = _aggregate(spec_runs)
    if base_runs:
        base_total = _aggregate(base_runs)
        total["baseline"] = base_total
        total["speedup"] = round(total["tok_s"] / base_total["tok_s"], 3) if base_total["tok_s"] else 0.0
        total["identical"] = all(r.get("identical") for r in rows)
    report: dict[str, Any] = {
        "version": JSON_VERSION,
        "target": str(args.target),
        "drafter": str(args.drafter) if args.drafter else None,
        "ngram": draft.ngram,
        "adaptive": draft.adaptive,
        "k": None if draft.adaptive else draft.k,
        "k_max": draft.k_max,
        "temperature": sampling.temperature,
        "seed": sampling.seed,
        "max_tokens": sampling.max_tokens,
        "backend": loaded.backend,
        "verify_cost_ms": {
            str(w): round(t * 1000, 3) for w, t in sorted(session.decoder.controller.cost.widths.items())
        },
        "prompts": rows,
        "total": total,
        "ceiling": ceiling_for(session),
    }
    if args.raw:
        prompt, _ = session.prompt_tokens(prompts[0])
        raw_rates, eng_rates = [], []
        plain = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens)
        for _ in range(3):
            raw_rates.append(raw_decode_loop(session, prompt, args.max_tokens))
            eng_rates.append(run_once(session, prompt, plain, plain=True).decode_tps)
        raw, eng = statistics.median(raw_rates), statistics.median(eng_rates)
        report["raw"] = {"bare_loop_tok_s": round(raw, 2), "engine_plain_tok_s": round(eng, 2),
                         "ratio": round(eng / raw, 3) if raw else 0.0}
        print(f"plain decode through the engine: {eng:.1f} tok/s; bare llama_decode loop: {raw:.1f} tok/s; "
              f"ratio {eng / raw if raw else 0:.3f}", file=out)
    summary = (f"total: {total['tok_s']:.1f} tok/s, acceptance {total['acceptance']:.2f}, "
               f"τ {total['tokens_per_pass']:.2f}")
    if base_runs:
        summary += f", baseline {total['baseline']['tok_s']:.1f} tok/s, speedup {total['speedup']:.2f}x, " \
                   f"identical {total['identical']}"
    summary += f", Python overhead per pass {total['overhead_ms_median']:.3f} ms (median)"
    print(summary, file=out)
    session.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def ceiling_for(session: Any) -> dict[str, Any] | None:
    """The roofline ceiling for this target on this machine (None when it cannot be computed)."""
    try:
        from app.ceiling.report import ceiling_summary
    except ImportError:
        return None
    try:
        result: dict[str, Any] | None = ceiling_summary(session.settings.target_path, session.ctx.n_ctx)
        return result
    except AppError:
        return None
