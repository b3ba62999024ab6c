"""What a schema-constrained answer costs: decode tok/s with a JSON schema against free text, plain and speculative.

    .venv/bin/python benchmarks/grammar_cost.py [--target MODEL.gguf] [--repeat 5] [--max-tokens 96]
                                                [--temperature 0]

One session (the target, its suffix drafter), answers to one extraction prompt (greedy by default: the grammar
asks about the token each row gives; sampled: every row is masked over the whole vocabulary). Each repeat runs the
four conditions back to back, in a rotating order, so a busy machine slows them alike. Prints, per condition,
the median decode tok/s with its range, and per repeat the constrained over the free rate (plain and
speculative), median and range. The schema is small and bounded (app.engine.schema_limits): each verify row
is masked by the grammar, so its cost grows with the vocabulary (SmolLM2: 49,152 tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from app.engine.session import EngineSession
from app.events import Finished
from app.params import DraftSettings, LoadSettings, SamplingSettings

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
    },
    "required": ["name", "age", "city", "languages"],
    "additionalProperties": False,
}
PROMPT = ("Extract the person as JSON with name, age, city and languages.\n"
          "Record: Maria Lopez is 34 years old, lives in Valencia and speaks Spanish, Catalan and English. "
          "Earlier record, as JSON: {\"name\": \"Maria Lopez\", \"age\": 34, \"city\": \"Valencia\", "
          "\"languages\": [\"Spanish\", \"Catalan\", \"English\"]}\nAgain, as JSON:")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    from app.library.demo_install import install_demo_models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, help="a GGUF model (default: the SmolLM2 demo model)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    target = args.target or next(p for p in install_demo_models() if "smollm2" in p.name.lower())
    session = EngineSession(LoadSettings(target_path=str(target), n_ctx=1024, n_gpu_layers=0,
                                         draft=DraftSettings(ngram=2)))
    messages = [{"role": "user", "content": PROMPT}]
    conditions = {
        (speculative, constrained): SamplingSettings(max_tokens=args.max_tokens, temperature=args.temperature,
                                                     seed=7,
                                                     response_format=json.dumps(SCHEMA) if constrained else "")
        for speculative in (False, True) for constrained in (False, True)
    }
    rates: dict[tuple[bool, bool], list[float]] = {key: [] for key in conditions}
    order = list(conditions)
    for repeat in range(args.repeat):
        for key in order[repeat % 4:] + order[: repeat % 4]:
            speculative, _ = key
            decoder = session.decoder if speculative else session.plain_decoder
            decoder.reset_cache()
            end = [e for e in session.generate(repeat, messages, conditions[key], decoder=decoder)
                   if isinstance(e, Finished)][-1]
            rates[key].append(end.stats.decode_tps)
    session.close()
    how = f"temperature {args.temperature:g}, seed 7" if args.temperature else "greedy"
    print(f"{target.name}: {args.repeat} repeats, {args.max_tokens} tokens, {how}; decode tok/s, median (range)")
    for (speculative, constrained), values in rates.items():
        print(f"  {'speculative' if speculative else 'plain':11s} {'schema' if constrained else 'free':6s} "
              f"{spread(values)}")
    for speculative in (False, True):
        ratios = [c / f for c, f in zip(rates[(speculative, True)], rates[(speculative, False)], strict=True)]
        print(f"  schema / free, {'speculative' if speculative else 'plain'}: {spread([r * 100 for r in ratios])} %")


if __name__ == "__main__":
    main()
