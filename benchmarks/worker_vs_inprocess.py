"""Bench's figures through the engine worker against the same runs in this process, side by side.

    .venv/bin/python benchmarks/worker_vs_inprocess.py --target MODEL.gguf [--ngram 3]
                                                       [--prompts FILE.jsonl] [--max-tokens 256] [--repeat 3]

`specdeck bench` runs llama.cpp in the worker process (a crash there cannot take bench down). This script loads
the same model twice, once in a worker and once here, and runs each prompt on both, alternating which goes first.
It prints, per side, the decode tok/s as bench reports it (decode-window tokens over decode-window seconds) with
its median and spread over the repeats, and for the worker the pipe's cost: the request's round trip as this
process saw it minus the seconds the worker timed, per answer and per pass.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.bench_run import bench_run  # noqa: E402
from app.engine.client import EngineClient  # noqa: E402
from app.engine.session import EngineSession  # noqa: E402
from app.events import BenchResult, BenchRun, Loaded  # noqa: E402
from app.measure.bench import WATCHDOG_SECONDS, read_prompts  # noqa: E402
from app.measure.bench_report import RunResult  # noqa: E402
from app.params import DraftSettings, LoadSettings, SamplingSettings  # noqa: E402


def await_event(client: EngineClient, kind: type) -> object:
    for event in client.events(timeout=WATCHDOG_SECONDS):
        if isinstance(event, kind):
            return event
    raise SystemExit(f"the worker ended without a {kind.__name__}")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4g} ({min(values):.4g}–{max(values):.4g})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--prompts", default=str(ROOT / "resources" / "prompts" / "edit.jsonl"))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    settings = LoadSettings(target_path=args.target, n_ctx=4096, draft=DraftSettings(ngram=args.ngram)).validate()
    sampling = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens).validate()
    prompts = read_prompts(Path(args.prompts))
    local = EngineSession(settings)
    client = EngineClient(watchdog_seconds=WATCHDOG_SECONDS)
    client.load(settings)
    await_event(client, Loaded)

    tps: dict[str, list[float]] = {"worker": [], "in-process": []}
    pipe_ms_per_answer: list[float] = []
    pipe_us_per_pass: list[float] = []
    try:
        for r in range(args.repeat):
            side_tps: dict[str, tuple[int, float]] = {"worker": (0, 0.0), "in-process": (0, 0.0)}
            for index, messages in enumerate(prompts):
                order = ("worker", "in-process") if (index + r) % 2 == 0 else ("in-process", "worker")
                for side in order:
                    if side == "worker":
                        t0 = time.perf_counter()
                        client.bench_run(messages, sampling, plain=False)
                        event = await_event(client, BenchResult)
                        round_trip = time.perf_counter() - t0
                        assert isinstance(event, BenchResult)
                        result = RunResult.of(event)
                        pipe = round_trip - event.seconds
                        pipe_ms_per_answer.append(pipe * 1e3)
                        pipe_us_per_pass.append(pipe * 1e6 / max(result.counts.passes, 1))
                    else:
                        result = RunResult.of(bench_run(local, BenchRun(0, tuple(messages), sampling, False)))
                    tokens, seconds = side_tps[side]
                    c = result.counts
                    side_tps[side] = (tokens + c.decode_tokens, seconds + c.decode_seconds)
            for side, (tokens, seconds) in side_tps.items():
                tps[side].append(tokens / seconds if seconds else 0.0)
            print(f"repeat {r + 1}: worker {tps['worker'][-1]:.1f} tok/s, "
                  f"in-process {tps['in-process'][-1]:.1f} tok/s", flush=True)
    finally:
        client.close()
        local.close()
    ratios = [w / p for w, p in zip(tps["worker"], tps["in-process"], strict=True) if p]
    print(f"decode tok/s, worker:      {spread(tps['worker'])}")
    print(f"decode tok/s, in-process:  {spread(tps['in-process'])}")
    print(f"worker / in-process:       {spread(ratios)}")
    print(f"pipe per answer (ms):      {spread(pipe_ms_per_answer)}  (outside bench's timed window)")
    print(f"pipe per pass (µs):        {spread(pipe_us_per_pass)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
