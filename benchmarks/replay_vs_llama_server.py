#!/usr/bin/env python3
"""The oracle replay's ngram-simple and ngram-mod against llama-server's own acceptance counts, on the same tokens.

For each mode, one llama-server (built by `packaging/build_llama_server`) answers every prompt in order,
greedy, from the prompt tokens SpecDeck renders, and reports its drafted and accepted tokens per answer
(`timings.draft_n`, `draft_n_accepted`) and the answer's tokens. The replay (`app/measure/replay.py`) then runs
its reimplementation of that mode over those very prompt and answer tokens, in the same order (ngram-mod's
table outlives a request in both), and the two counts are printed side by side, per prompt and in total.
Counts only: no timing is involved, so the machine's load does not matter.

    .venv/bin/python benchmarks/replay_vs_llama_server.py --target MODEL.gguf \\
        [--prompts resources/prompts/edit.jsonl ...] [--workloads] [--max-tokens 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from vs_llama_server import PROMPTS_DIR, WORKLOADS, Server, find_server, prompt_tokens  # noqa: E402

from app.measure.bench import read_prompts  # noqa: E402
from app.measure.replay import CostCurve, Trace  # noqa: E402
from benchmarks.ngram_modes import replay_ngram_mod, replay_ngram_simple  # noqa: E402

MODES = {"ngram-simple": replay_ngram_simple, "ngram-mod": replay_ngram_mod}
UNIT = CostCurve({1: 1.0})  # counts only: the cost of a pass plays no part


def answer(server: Server, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "seed": 1234, "cache_prompt": False,
            "return_tokens": True}
    reply = httpx.post(f"{server.url}/completion", json=body, timeout=1800).json()
    t = reply["timings"]
    return {"tokens": [int(x) for x in reply.get("tokens") or []], "drafted": int(t.get("draft_n", 0)),
            "accepted": int(t.get("draft_n_accepted", 0))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, action="append", help="repeatable (default: edit.jsonl)")
    parser.add_argument("--workloads", action="store_true", help="every bundled workload: " + ", ".join(WORKLOADS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    binary = find_server()
    if binary is None:
        print("llama-server is not built: run `python3 packaging/build_llama_server` first.", file=sys.stderr)
        return 1
    files = [PROMPTS_DIR / f"{w}.jsonl" for w in WORKLOADS] if args.workloads else (
        args.prompts or [PROMPTS_DIR / "edit.jsonl"])
    names = [f.name for f in files for _ in read_prompts(f)]
    prompts = prompt_tokens(args.target, [chat for f in files for chat in read_prompts(f)])
    report: dict[str, Any] = {"target": str(args.target), "prompts": names, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="specdeck-replay-check-") as logs:
        for mode, replay in MODES.items():
            with Server(binary, args.target, mode, None, args, Path(logs) / f"{mode}.log") as server:
                served = [answer(server, p, args.max_tokens) for p in prompts]
            runs = replay([Trace(p, s["tokens"]) for p, s in zip(prompts, served, strict=True)], UNIT)
            rows = [{"file": name, "tokens": len(s["tokens"]),
                     "server_drafted": s["drafted"], "server_accepted": s["accepted"],
                     "replay_drafted": r.drafted, "replay_accepted": r.accepted}
                    for name, s, r in zip(names, served, runs, strict=True)]
            report["modes"][mode] = rows
            print(f"\n{mode}: drafted / accepted tokens per answer, llama-server | replay on its tokens")
            print(f"{'#':>2} {'prompts':<18} {'tokens':>6} | {'server':>13} | {'replay':>13}")
            for i, row in enumerate(rows):
                print(f"{i:>2} {row['file']:<18} {row['tokens']:>6} | {row['server_drafted']:>6} "
                      f"{row['server_accepted']:>6} | {row['replay_drafted']:>6} {row['replay_accepted']:>6}")
            sums = {k: sum(r[k] for r in rows) for k in ("server_drafted", "server_accepted", "replay_drafted",
                                                         "replay_accepted")}
            print(f"{'all':<21} {sum(r['tokens'] for r in rows):>6} | {sums['server_drafted']:>6} "
                  f"{sums['server_accepted']:>6} | {sums['replay_drafted']:>6} {sums['replay_accepted']:>6}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
