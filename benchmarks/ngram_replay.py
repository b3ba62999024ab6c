#!/usr/bin/env python3
"""Replay greedy answers through the n-gram drafter and the depth policy, with a given pass-cost curve.

Greedy output does not depend on speculation, so once a target's answers are known, every pass of a
speculative run follows from them: what the drafter proposes, the depth the policy picks, how much is
accepted. This script records each answer once (plain greedy decoding through the engine) and then
replays them with the real ``NGramDrafter`` and ``DepthController``, charging each pass the cost the curve
gives its width. The result is a noise-free speedup for comparing drafter changes on a shared machine; it
does not replace `specdeck bench`, which measures the real thing. It also prints the bound the drafter's
proposals allow: each pass drafting exactly the tokens that will be accepted.

    .venv/bin/python benchmarks/ngram_replay.py --target MODEL.gguf --prompts resources/prompts/edit.jsonl \\
        [--curve 1:19.1,2:36.1,4:59.2,8:96.2,16:164] [--ngram 3] [--k-max 16] [--max-tokens 256]

Without --curve, the curve `specdeck bench` last measured for the target here is used. Answers are cached
under the cache folder, keyed by model, prompts and max tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.adaptive import DepthController  # noqa: E402
from app.engine.drafters import NGramDrafter  # noqa: E402
from app.events import FROM_NGRAM  # noqa: E402


def record(target: Path, prompts_path: Path, max_tokens: int, threads: int) -> list[dict[str, list[int]]]:
    """[{prompt, answer}] token ids, from plain greedy decoding (cached)."""
    from app.engine.bench import read_prompts
    from app.paths import cache_dir

    key = hashlib.sha256(f"{target.resolve()}|{target.stat().st_size}|{prompts_path.read_text()}|{max_tokens}"
                         .encode()).hexdigest()[:16]
    cache = cache_dir() / "replay" / f"{target.stem}-{key}.json"
    if cache.exists():
        return list(json.loads(cache.read_text()))
    from app.engine.params import DraftSettings, LoadSettings, SamplingSettings
    from app.engine.session import EngineSession
    from app.events import Token

    session = EngineSession(LoadSettings(str(target), DraftSettings(), n_threads=threads))
    out = []
    try:
        for messages in read_prompts(prompts_path):
            prompt, _ = session.prompt_tokens(messages)
            session.decoder.reset_cache()
            answer: list[int] = []
            for event in session.generate(0, (), SamplingSettings(max_tokens=max_tokens), prompt=prompt):
                if isinstance(event, Token):
                    answer += event.token_ids
            out.append({"prompt": prompt, "answer": answer})
    finally:
        session.close()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def parse_curve(text: str) -> dict[int, float]:
    curve = {}
    for part in text.split(","):
        width, ms = part.split(":")
        curve[int(width)] = float(ms) / 1000
    if 1 not in curve:
        raise SystemExit("the curve needs width 1")
    return curve


def cost(curve: dict[int, float], width: int) -> float:
    if width in curve:
        return curve[width]
    known = sorted(curve)
    lower = [w for w in known if w < width]
    upper = [w for w in known if w > width]
    if lower and upper:
        a, b = lower[-1], upper[0]
        return curve[a] + (curve[b] - curve[a]) * (width - a) / (b - a)
    a = lower[-1]
    slope = (curve[a] - curve[lower[-2]]) / (a - lower[-2]) if len(lower) > 1 else 0.0
    return curve[a] + max(slope, 0.0) * (width - a)


def new_controller(curve: dict[int, float], k_max: int, fixed: int | None) -> DepthController:
    controller = DepthController(k_max=k_max, fixed=fixed)
    for width in range(1, k_max + 2):  # as calibration does
        controller.cost.observe_verify(width, cost(curve, width))
    return controller


def replay(prompt: list[int], answer: list[int], curve: dict[int, float], controller: DepthController,
           drafter: NGramDrafter, *, draft_time: bool = True) -> dict[str, float]:
    """One answer replayed: simulated seconds (passes by the curve plus the drafter's real time, unless
    ``draft_time`` is off: that time is measured, so it carries this machine's load). The controller carries
    over from answer to answer, as in one loaded session; the drafter starts empty."""
    drafter.reset()
    tokens = list(prompt)
    drafter.observe(tokens)
    controller.start_answer()
    produced = passes = drafted = accepted_total = 0
    seconds = draft_seconds = 0.0
    while produced < len(answer):
        t0 = time.perf_counter()
        proposal = drafter.propose(tokens, controller.k_max)
        k = controller.choose(len(proposal), False, proposal.match_len)
        draft_seconds += time.perf_counter() - t0
        k = max(0, min(k, len(answer) - produced - 1))
        draft = proposal.tokens[:k]
        n_acc = 0
        while n_acc < len(draft) and draft[n_acc] == answer[produced + n_acc]:
            n_acc += 1
        emitted = answer[produced : produced + n_acc + 1]
        flags = [True] * n_acc + ([False] if n_acc < len(draft) else [])
        controller.score_proposal(proposal.tokens, proposal.match_len, emitted)
        controller.observe([FROM_NGRAM] * len(draft), flags, proposal.match_len, ngram_scored_elsewhere=True)
        controller.cost.observe_verify(len(draft) + 1, cost(curve, len(draft) + 1))
        seconds += cost(curve, len(draft) + 1)
        tokens += emitted
        produced += len(emitted)
        passes += 1
        drafted += len(draft)
        accepted_total += n_acc
    plain = len(answer) * cost(curve, 1)
    if not draft_time:
        draft_seconds = 0.0
    return {"tokens": len(answer), "passes": passes, "drafted": drafted, "accepted": accepted_total,
            "seconds": seconds + draft_seconds, "draft_ms_per_pass": 1000 * draft_seconds / max(passes, 1),
            "speedup": plain / (seconds + draft_seconds) if seconds else 1.0}


def oracle(prompt: list[int], answer: list[int], curve: dict[int, float], drafter: NGramDrafter,
           k_max: int) -> float:
    """The bound the drafter's proposals allow on this curve: each pass drafts exactly the tokens that will
    be accepted (none where that does not pay). Returns the simulated speedup."""
    drafter.reset()
    tokens, produced, seconds = list(prompt), 0, 0.0
    while produced < len(answer):
        proposal = drafter.propose(tokens, k_max).tokens
        n = 0
        while n < len(proposal) and produced + n < len(answer) - 1 and proposal[n] == answer[produced + n]:
            n += 1
        if n and cost(curve, n + 1) >= (n + 1) * cost(curve, 1):
            n = 0
        seconds += cost(curve, n + 1)
        tokens += answer[produced : produced + n + 1]
        produced += n + 1
    return len(answer) * cost(curve, 1) / seconds if seconds else 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--prompts", required=True, type=Path)
    parser.add_argument("--curve", help="width:ms,... (default: the curve bench measured for the target)")
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--k-max", type=int, default=16)
    parser.add_argument("--k", type=int, help="fixed depth instead of the adaptive policy")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--curve-only", action="store_true",
                        help="charge only the curve's pass costs, not the drafter's measured time (no noise)")
    parser.add_argument("--drafter-file", type=Path, help="take NGramDrafter from this file instead (A/B runs)")
    args = parser.parse_args()
    drafter_class = NGramDrafter
    if args.drafter_file:
        import importlib.util

        spec = importlib.util.spec_from_file_location("replay_drafter", args.drafter_file)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
        drafter_class = module.NGramDrafter
    if args.curve:
        curve = parse_curve(args.curve)
    else:
        from app.library.verify_cost import load_curve

        measured = load_curve(str(args.target))
        if measured is None:
            raise SystemExit("no curve measured for this target: run `specdeck bench` on it, or pass --curve")
        curve = {w: ms / 1000 for w, ms in measured.widths_ms.items()}
    controller = new_controller(curve, args.k_max, args.k)
    runs = [replay(r["prompt"], r["answer"], curve, controller, drafter_class(args.ngram),
                   draft_time=not args.curve_only)
            for r in record(args.target, args.prompts, args.max_tokens, args.threads)]
    for i, r in enumerate(runs):
        print(f"{i:>2} tokens {r['tokens']:>4} passes {r['passes']:>4} τ {r['tokens'] / r['passes']:.2f} "
              f"accept {r['accepted'] / max(r['drafted'], 1):.2f} draft {r['draft_ms_per_pass']:.3f} ms/pass "
              f"speedup {r['speedup']:.3f}")
    answers = record(args.target, args.prompts, args.max_tokens, args.threads)
    bound = [oracle(r["prompt"], r["answer"], curve, drafter_class(args.ngram), args.k_max) for r in answers]
    print("depth oracle (each pass drafts exactly what is accepted): "
          + ", ".join(f"{b:.3f}" for b in bound))
    tokens = sum(r["tokens"] for r in runs)
    total = tokens * cost(curve, 1) / sum(r["seconds"] for r in runs)
    print(f"all: speedup {total:.3f} (per prompt median {statistics.median(r['speedup'] for r in runs):.3f}), "
          f"τ {tokens / sum(r['passes'] for r in runs):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
