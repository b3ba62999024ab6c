"""Decode speed through `specdeck serve` against the in-process `specdeck bench`, on the same prompts.

    .venv/bin/python benchmarks/serve_vs_bench.py --target MODEL.gguf [--ngram 3] [--prompts FILE.jsonl]
                                                  [--max-tokens 128] [--repeat 3]

Each repeat runs `specdeck bench` (speculative, in this process, as the command does) and a fresh server with
the same settings, in alternating order (bench first on odd repeats, the API first on even ones) so that a
drift of the machine's speed falls on both sides alike; then a fresh server with speculation off. Each prompt
once, greedy. Fresh servers, because a server's n-gram drafter remembers earlier answers (good for real
traffic, unfair against bench, which starts every run from a reset).
Decode tok/s is RunCounts' (decode-window tokens over decode-window seconds, summed over the prompts); the API
side reads it from each answer's `timings`, and also reports what the client saw end to end (all tokens over
the wall time of the request). Prints per-repeat figures and the median with its spread.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.measure.bench import BENCH_SAMPLING, BenchConfig, bench, read_prompts  # noqa: E402
from app.params import DraftSettings, LoadSettings  # noqa: E402
from app.serve.metrics import ServeMetrics  # noqa: E402
from app.serve.protocol import Limits  # noqa: E402
from app.serve.runner import EngineRunner  # noqa: E402
from app.serve.server import ServeOptions, Server  # noqa: E402


def bench_tps(args: argparse.Namespace) -> float:
    fixed = args.k is not None
    draft = DraftSettings(ngram=args.ngram, adaptive=not fixed, k=args.k if fixed else DraftSettings.k,
                          k_max=max(args.k, 1) if fixed else DraftSettings.k_max)
    config = BenchConfig(LoadSettings(target_path=str(args.target), draft=draft),
                         tuple(read_prompts(args.prompts)), replace(BENCH_SAMPLING, max_tokens=args.max_tokens))
    return bench(config, io.StringIO()).total.tok_s


def api_tps(args: argparse.Namespace, ngram: int, prompts: list[dict[str, object]]) -> tuple[float, float, float]:
    """(decode tok/s from the answers' timings, client tok/s end to end, acceptance)."""
    draft = DraftSettings(ngram=ngram, adaptive=args.k is None, k=args.k if args.k is not None else 4)
    settings = LoadSettings(target_path=str(args.target), n_ctx=4096, draft=draft)
    metrics = ServeMetrics()
    server = Server(EngineRunner(settings, metrics, history_path=None), metrics,
                    ServeOptions(port=0, limits=Limits(max_tokens=args.max_tokens)))
    server.start_in_thread()
    try:
        while httpx.get(server.base_url + "/health").status_code != 200:
            if server.runner.state == "error":
                raise SystemExit(server.runner.message)
            time.sleep(0.2)
        tokens = seconds = all_tokens = wall = drafted = accepted = 0.0
        for prompt in prompts:
            t0 = time.perf_counter()
            r = httpx.post(server.base_url + "/v1/chat/completions", timeout=600,
                           json={**prompt, "max_tokens": args.max_tokens, "temperature": 0}).json()
            wall += time.perf_counter() - t0
            timings = r["timings"]
            tokens += timings["predicted_n"]
            seconds += timings["predicted_ms"] / 1000
            all_tokens += r["usage"]["completion_tokens"]
            drafted += r["stats"]["total_draft_tokens_count"]
            accepted += r["stats"]["accepted_draft_tokens_count"]
        return tokens / seconds, all_tokens / wall, accepted / drafted if drafted else 0.0
    finally:
        server.stop()


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--prompts", type=Path, default=ROOT / "resources" / "prompts" / "edit.jsonl")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--k", type=int, help="fixed draft depth on both sides (default: adaptive)")
    args = parser.parse_args()
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    rows = []
    for r in range(args.repeat):
        if r % 2 == 0:
            bench = bench_tps(args)
            spec, spec_client, acc = api_tps(args, args.ngram, prompts)
        else:
            spec, spec_client, acc = api_tps(args, args.ngram, prompts)
            bench = bench_tps(args)
        plain, plain_client, _ = api_tps(args, 0, prompts)
        rows.append((bench, spec, spec_client, plain, plain_client, acc))
        print(f"repeat {r + 1}: bench {bench:.2f} tok/s | API speculative {spec:.2f} (client {spec_client:.2f}, "
              f"acceptance {acc:.2f}) | API plain {plain:.2f} (client {plain_client:.2f}) | "
              f"API/bench {spec / bench:.3f} | API speedup {spec / plain:.2f}", flush=True)
    print("API speculative / bench:", spread([row[1] / row[0] for row in rows]))
    print("API speculative / API plain:", spread([row[1] / row[3] for row in rows]))
    print("bench tok/s:", spread([row[0] for row in rows]))
    print("API speculative tok/s:", spread([row[1] for row in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
