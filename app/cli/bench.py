"""`specdeck bench`: its options parsed into a ``BenchConfig``, and the report written; the measuring lives in
app.measure.bench."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from app.cli.exit_codes import EXIT_ENGINE_CRASHED, EXIT_ERROR
from app.cli.load_options import add_load_arguments, load_settings
from app.errors import AppError
from app.measure.bench import BENCH_SAMPLING, BenchConfig, EngineCrashedError, bench, read_prompts
from app.params import DraftSettings
from app.safe_text import terminal_safe
from app.storage.atomic import check_destination

# Every option's default is the setting's own (one home): the drafting and bench settings' defaults here, the
# load settings' in app.cli.load_options.
DRAFT = DraftSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model (GGUF with the target's vocabulary)")
    parser.add_argument("--ngram", type=int, default=DRAFT.ngram, metavar="N",
                        help="suffix drafter's shortest match (0 = off)")
    parser.add_argument("--mtp", action="store_true",
                        help="draft with the target's own MTP heads (Qwen3.5/3.6 GGUFs that ship them)")
    depth = parser.add_mutually_exclusive_group()
    depth.add_argument("--k", type=int, help="fixed draft depth (0 = plain decoding)")
    depth.add_argument("--adaptive", action="store_true", help="choose the depth each pass (default)")
    parser.add_argument("--k-max", type=int, default=DRAFT.k_max,
                        help="largest depth the adaptive policy may choose")
    parser.add_argument("--model-start", type=float, metavar="A",
                        help="start the model drafter's acceptance estimate at A (the window, chat and serve start "
                        "from the pair's measured figure; bench from the policy's prior unless this is given)")
    parser.add_argument("--prompts", required=True, type=Path, help='JSONL, one {"messages": [...]} per line')
    parser.add_argument("--max-tokens", type=int, default=BENCH_SAMPLING.max_tokens)
    parser.add_argument("--temperature", type=float, default=BENCH_SAMPLING.temperature)
    parser.add_argument("--top-k", type=int, default=BENCH_SAMPLING.top_k)
    parser.add_argument("--top-p", type=float, default=BENCH_SAMPLING.top_p)
    parser.add_argument("--min-p", type=float, default=BENCH_SAMPLING.min_p)
    parser.add_argument("--seed", type=int, default=BENCH_SAMPLING.seed)
    parser.add_argument("--baseline", action="store_true", help="also run each prompt without speculation")
    parser.add_argument("--repeat", type=int, default=BenchConfig.repeat, metavar="N",
                        help="run each prompt N times (speculative and plain alternating, in alternating order); "
                        "speedups are reported as median, min and max")
    parser.add_argument("--raw", action="store_true", help="also time a bare llama_decode loop")
    parser.add_argument("--json", type=Path, help="write the full report here")
    add_load_arguments(parser)


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The options as a bench, checked before the prompts file is read; raises SettingsError."""
    fixed = args.k is not None
    draft = replace(DRAFT, drafter_path=str(args.drafter) if args.drafter else None, ngram=args.ngram,
                    mtp=args.mtp, adaptive=not fixed, k=args.k if fixed else DRAFT.k,
                    k_max=max(args.k, 1) if fixed else args.k_max, model_start=args.model_start)
    settings = load_settings(args, str(args.target), draft)
    sampling = replace(BENCH_SAMPLING, temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens,
                       top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    config = BenchConfig(settings, (), sampling, baseline=args.baseline, repeat=args.repeat, raw=args.raw)
    return replace(config.validate(), prompts=tuple(read_prompts(args.prompts)))


def run(args: argparse.Namespace) -> int:
    try:
        if args.json:
            check_destination(args.json, "the report")  # before the run, not after it
        report = bench(bench_config(args), sys.stdout)
        if args.json:
            Path(args.json).write_text(json.dumps(report.as_json(), indent=2))
    except EngineCrashedError as exc:
        print(f"specdeck bench: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ENGINE_CRASHED
    except AppError as exc:
        print(f"specdeck bench: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        where = terminal_safe(exc.filename or args.json or "a file", one_line=True)
        print(f"specdeck bench: cannot write {where}: {exc.strerror or exc}.", file=sys.stderr)
        return EXIT_ERROR
    return 0
