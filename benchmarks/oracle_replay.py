#!/usr/bin/env python3
"""The oracle replay: recorded greedy answers replayed under this machine's verify-cost curve.

Records the target's greedy answer to each prompt once (plain decoding through the engine; cached under the
cache folder, keyed by model, prompts and max tokens), then replays every answer offline
(``app.measure.replay``) and reports, per prompt, tau (tokens per target pass) and the predicted speedup for:
SpecDeck's suffix drafter and depth policy; llama.cpp's ngram-simple and ngram-mod, reimplemented from its
source; and a longest-match oracle that drafts, with hindsight, the longest continuation of the true answer
found in the prompt, the answer so far or earlier answers, at the best width on the curve.

    .venv/bin/python benchmarks/oracle_replay.py --target MODEL.gguf --prompts resources/prompts/edit.jsonl \\
        [--prompts MORE.jsonl] [--bench BENCH.json] [--curve 1:19.1,2:36.1,4:59.2] [--max-tokens 256]

The curve: --curve, else the one in --bench's report (the same run the prediction is checked against),
else the one `specdeck bench` last recorded for the target here, else the recording's own timing (widths 1
to 65 after the first prompt, median of 3). Widths past a bench curve's widest (17) come from the
recording's, scaled by the one-token costs; a --curve is extended with its mean slope.
With --bench (a `specdeck bench --baseline --json` report on the same prompts, target and max tokens), the
predicted speedup of each prompt is printed beside the measured one and its range over the repeats, with
bench's per-pass Python overhead (its plain runs' median) charged to every pass of every engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.measure.replay import (  # noqa: E402
    CostCurve,
    Replayed,
    Trace,
    replay_oracle,
    replay_specdeck,
    total,
)
from app.params import K_MAX, NGRAM_KEY_LENGTH  # noqa: E402
from benchmarks.ngram_modes import replay_ngram_mod, replay_ngram_simple  # noqa: E402


def record(target: Path, prompt_files: list[Path], max_tokens: int, threads: int) -> dict[str, Any]:
    """{"traces": [{prompt, answer}], "curve_ms": {width: ms}}: plain greedy answers (cached)."""
    from app.measure.bench import read_prompts
    from app.paths import cache_dir

    texts = "".join(p.read_text() for p in prompt_files)
    key = hashlib.sha256(f"{target.resolve()}|{target.stat().st_size}|{texts}|{max_tokens}".encode()).hexdigest()
    cache = cache_dir() / "replay" / f"{target.stem}-{key[:16]}.json"
    if cache.exists():
        cached = json.loads(cache.read_text())
        if isinstance(cached, dict) and "traces" in cached:
            return cached
    from app.engine.session import EngineSession
    from app.events import Token
    from app.params import DraftSettings, LoadSettings, SamplingSettings

    # The drafter on, so the load times every width up to K_MAX + 1 (the curve when no other is given).
    session = EngineSession(LoadSettings(str(target), DraftSettings(ngram=NGRAM_KEY_LENGTH), n_threads=threads))
    traces = []
    try:
        curve_ms: dict[int, float] = {}
        for path in prompt_files:
            for messages in read_prompts(path):
                prompt, _ = session.prompt_tokens(messages)
                session.plain_decoder.reset_cache()
                answer: list[int] = []
                for event in session.generate(0, (), SamplingSettings(max_tokens=max_tokens), prompt=prompt,
                                              decoder=session.plain_decoder):
                    if isinstance(event, Token):
                        answer += event.token_ids
                traces.append({"file": path.name, "prompt": prompt, "answer": answer})
                if not curve_ms:
                    curve_ms = time_widths(session, prompt)
    finally:
        session.close()
    out = {"traces": traces, "curve_ms": curve_ms}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


CURVE_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 48, 65)  # up to ngram-mod's widest pass


def time_widths(session: Any, prompt: list[int], repeats: int = 3) -> dict[int, float]:
    """Milliseconds of a target pass by width after this prompt (median of ``repeats``, widths interleaved)."""
    import statistics
    import time

    ctx = session.ctx
    session.plain_decoder.reset_cache()
    ctx.prefill(prompt)
    base = ctx.n_past
    probe = (prompt * (1 + max(CURVE_WIDTHS) // max(len(prompt), 1)))[: max(CURVE_WIDTHS)]
    times: dict[int, list[float]] = {w: [] for w in CURVE_WIDTHS}
    ctx.decode(probe[:8], all_logits=True)  # warm-up
    ctx.truncate(base)
    for _ in range(repeats):
        for width in CURVE_WIDTHS:
            t0 = time.perf_counter()
            ctx.decode(probe[:width], all_logits=True)
            ctx.synchronize()
            times[width].append((time.perf_counter() - t0) * 1000)
            ctx.truncate(base)
    session.plain_decoder.reset_cache()
    return {w: statistics.median(v) for w, v in times.items()}


def parse_curve(text: str) -> dict[int, float]:
    curve = {}
    for part in text.split(","):
        width, ms = part.split(":")
        curve[int(width)] = float(ms)
    return curve


def choose_curve(args: argparse.Namespace, bench: dict[str, Any] | None, recorded: dict[str, Any]) -> tuple[
        dict[int, float], str]:
    if args.curve:
        return parse_curve(args.curve), "--curve"
    if bench is not None and bench.get("verify_cost_ms"):
        return {int(w): float(ms) for w, ms in bench["verify_cost_ms"].items()}, "the bench report"
    from app.storage.verify_cost import load_curve

    measured = load_curve(str(args.target))
    if measured is not None:
        return dict(measured.widths_ms), "the curve bench recorded for this target"
    return {int(w): float(ms) for w, ms in recorded["curve_ms"].items()}, "the recording's timing"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--prompts", required=True, type=Path, action="append", help="repeatable")
    parser.add_argument("--bench", type=Path, help="a `specdeck bench --baseline --json` report to check against")
    parser.add_argument("--curve", help="width:ms,... (see above for the default)")
    parser.add_argument("--ngram", type=int, default=NGRAM_KEY_LENGTH, help="SpecDeck's shortest suffix match")
    parser.add_argument("--k-max", type=int, default=K_MAX)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--overhead-ms", type=float, help="Python overhead charged to every pass (default: "
                        "the bench report's plain median, else 0)")
    parser.add_argument("--exact", action="store_true",
                        help="leave SpecDeck's measured drafting time out (repeatable figures, no machine load)")
    parser.add_argument("--history", action="store_true", help="SpecDeck and the oracle also draft from the "
                        "earlier prompts' answers, in order (the window's memory across chats; bench resets it)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    bench = json.loads(args.bench.read_text()) if args.bench else None
    recorded = record(args.target, args.prompts, args.max_tokens, args.threads)
    curve_ms, curve_from = choose_curve(args, bench, recorded)
    if curve_from not in ("the recording's timing", "--curve"):
        # Widths past the chosen curve's widest (llama.cpp drafts up to 64) from the recording, scaled.
        wide = CostCurve({int(w): float(ms) for w, ms in recorded["curve_ms"].items()})
        curve_ms = CostCurve(curve_ms).merged(wide).widths
    overhead_ms = args.overhead_ms
    if overhead_ms is None:
        overhead_ms = float(bench["total"]["baseline"].get("overhead_ms_median", 0.0)) if bench else 0.0
    curve = CostCurve({w: (ms + overhead_ms) / 1000 for w, ms in curve_ms.items()})
    traces = [Trace(t["prompt"], t["answer"]) for t in recorded["traces"]]
    names = [t["file"] for t in recorded["traces"]]
    engines: dict[str, list[Replayed]] = {
        "specdeck": replay_specdeck(traces, curve, min_match=args.ngram, k_max=args.k_max,
                                    count_draft_time=not args.exact, history=args.history),
        "ngram-simple": replay_ngram_simple(traces, curve),
        "ngram-mod": replay_ngram_mod(traces, curve),
        "oracle": replay_oracle(traces, curve, history=args.history),
    }
    print(f"curve ({curve_from}, + {overhead_ms:.3f} ms overhead per pass): "
          + ", ".join(f"{w}:{ms:.1f}" for w, ms in sorted(curve_ms.items()) if w in (1, 2, 4, 8, 16, 32, 65))
          + " ms")
    head = f"{'#':>2} {'prompts':<18} {'tokens':>6}"
    for name in engines:
        head += f" | {name + ' τ':>15} {'×':>6}"
    head += " | SpecDeck/oracle"
    if bench is not None:
        head += " | bench × (range)"
    print(head)
    rows = []
    for i, name in enumerate(names):
        line = f"{i:>2} {name:<18} {len(traces[i].answer):>6}"
        row: dict[str, Any] = {"index": i, "file": name, "tokens": len(traces[i].answer)}
        for engine, runs in engines.items():
            r = runs[i]
            line += f" | {r.tau:>15.2f} {r.speedup:>6.2f}"
            row[engine] = r.as_json()
        line += f" | {engines['specdeck'][i].speedup / engines['oracle'][i].speedup:>15.2f}"
        if bench is not None and i < len(bench["prompts"]):
            measured = bench["prompts"][i]
            if "speedup" in measured:
                line += (f" | {measured['speedup']:.2f} ({measured['speedup_min']:.2f}–"
                         f"{measured['speedup_max']:.2f})")
                row["bench"] = {k: measured[k] for k in ("speedup", "speedup_min", "speedup_max",
                                                         "tokens_per_pass", "tokens")}
        print(line)
        rows.append(row)
    totals = {engine: total(runs) for engine, runs in engines.items()}
    line = f"{'all':>2} {'':<18} {sum(len(t.answer) for t in traces):>6}"
    for r in totals.values():
        line += f" | {r.tau:>15.2f} {r.speedup:>6.2f}"
    line += f" | {totals['specdeck'].speedup / totals['oracle'].speedup:>15.2f}"
    if bench is not None and "speedup" in bench["total"]:
        b = bench["total"]
        line += f" | {b['speedup']:.2f} ({b['speedup_min']:.2f}–{b['speedup_max']:.2f})"
    print(line)
    if args.json:
        args.json.write_text(json.dumps({"target": str(args.target), "curve_ms": curve_ms, "curve_from": curve_from,
                                         "overhead_ms": overhead_ms, "prompts": rows,
                                         "total": {e: r.as_json() for e, r in totals.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
