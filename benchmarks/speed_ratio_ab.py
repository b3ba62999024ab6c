"""Does the chat footer's "N× the plain rate" agree with an A/B: the same answer again with drafting off?

    .venv/bin/python benchmarks/speed_ratio_ab.py [--target MODEL.gguf] [--repeat 5] [--hogs 0|2]
                                                  [--prompts code,paragraph,chat] [--max-tokens 200]

Issue 38, item 2. In one engine worker (``EngineClient``, as the window uses), each prompt is answered greedily
with speculation and then plain, in alternating order, back to back (each from an empty cache, as bench does).
The footer's figure is the speculative answer's own ``MessageStats.speedup_estimate`` (its decode rate over the
one-token rate of the engine's live cost model at the end of that answer); the A/B figure divides the
speculative answer's decode rate by the plain answer's. Per prompt it prints both per repeat, their medians
and ranges, and the footer's error against the A/B; ``--hogs 2`` runs the same beside a busy loop on each core
(benchmarks/copy_under_load.py's). ``uptime`` before and after. The exit status is 1 when a prompt's median
error is over TOLERANCE.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from copy_under_load import FUNCTION, hogs, uptime  # noqa: E402

from app.engine.client import EngineClient  # noqa: E402
from app.events import BenchResult, EngineCrashed, EngineError, Loaded  # noqa: E402
from app.params import NGRAM_KEY_LENGTH, DraftSettings, LoadSettings, SamplingSettings  # noqa: E402

TOLERANCE = 0.15
TIMEOUT = 900.0
PROMPTS: dict[str, list[dict[str, str]]] = {
    "code": [{"role": "user", "content": "Rename the variable total to grand_total in this function and output "
              "the whole function in one code block, nothing else.\n\n```python\n" + FUNCTION + "\n```"}],
    "paragraph": [
        {"role": "user", "content": "Write about 150 words about lighthouses and their keepers."},
        {"role": "assistant", "content": "Lighthouses have guided sailors for centuries. Their keepers lived "
         "in small stone houses beside the tower, trimming wicks, polishing lenses and winding the clockwork that "
         "turned the light through the night. Storms could cut them off for weeks, and supply boats brought "
         "flour, oil and letters when the sea allowed. Many kept logs of every ship that passed and every change "
         "of weather. Today most lights are automatic, and the keepers' houses are museums or holiday homes."},
        {"role": "user", "content": "Say that again, exactly the same."}],
    "chat": [{"role": "user", "content": "Give three tips for keeping houseplants alive in winter."}],
}


def answer(client: EngineClient, messages: list[dict[str, str]], sampling: SamplingSettings,
           plain: bool) -> BenchResult:
    client.bench_run(messages, sampling, plain)
    for event in client.events(timeout=TIMEOUT):
        if isinstance(event, BenchResult):
            return event
        if isinstance(event, EngineError | EngineCrashed):
            raise RuntimeError(f"the answer failed: {event}")
    raise RuntimeError("the worker ended without an answer")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="default: the SmolLM2 demo model")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside the engine (one per core: 2)")
    parser.add_argument("--prompts", default=",".join(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    if args.target is None:
        from app.library.demo_install import install_demo_models

        args.target = str(install_demo_models()[0])
    sampling = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens)
    print(f"before: {uptime()}", flush=True)
    failed = 0
    client = EngineClient(log_dir=None, watchdog_seconds=TIMEOUT)
    try:
        with hogs(args.hogs) if args.hogs else contextlib.nullcontext():
            client.load(LoadSettings(target_path=args.target, draft=DraftSettings(ngram=NGRAM_KEY_LENGTH)).validate())
            for event in client.events(timeout=TIMEOUT):
                if isinstance(event, EngineError | EngineCrashed):
                    raise RuntimeError(f"the load failed: {event}")
                if isinstance(event, Loaded):
                    break
            for name in args.prompts.split(","):
                footer, ab, errors = [], [], []
                for repeat in range(args.repeat):
                    order = (False, True) if repeat % 2 == 0 else (True, False)
                    runs = {plain: answer(client, PROMPTS[name], sampling, plain) for plain in order}
                    spec, base = runs[False], runs[True]
                    if spec.stats.speedup_estimate <= 0:
                        print(f"{name} {repeat + 1}: no footer ratio (nothing accepted)", flush=True)
                        continue
                    measured = spec.stats.counts.decode_tps / base.stats.counts.decode_tps
                    footer.append(spec.stats.speedup_estimate)
                    ab.append(measured)
                    errors.append(spec.stats.speedup_estimate / measured - 1)
                    print(f"{name} {repeat + 1}: footer {spec.stats.speedup_estimate:.2f}×, A/B {measured:.2f}× "
                          f"(speculative {spec.stats.counts.decode_tps:.1f}, plain {base.stats.counts.decode_tps:.1f} "
                          f"tok/s; the footer's plain rate {spec.stats.plain_tps:.1f})", flush=True)
                if errors:
                    worst = statistics.median(abs(e) for e in errors)
                    failed += worst > TOLERANCE
                    print(f"{name}: footer {spread(footer)}×, A/B {spread(ab)}×, footer error median "
                          f"{statistics.median(errors):+.0%} (|error| median {worst:.0%}; "
                          f"{'within' if worst <= TOLERANCE else 'OVER'} {TOLERANCE:.0%})", flush=True)
    finally:
        client.close()
    print(f"after: {uptime()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
