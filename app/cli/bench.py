"""`specdeck bench`: arguments and printing; the measuring lives in app.engine.bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.engine.bench import EngineCrashedError, bench
from app.errors import AppError
from app.library.verify_cost import record_report as record_verify_cost
from app.safe_text import terminal_safe
from app.storage.atomic import check_destination

EXIT_ERROR = 1  # bad input or a refused model: the message says what to change
EXIT_ENGINE_CRASHED = 3  # llama.cpp died in the worker: the message names the signal and the phase


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model (GGUF with the target's vocabulary)")
    parser.add_argument("--ngram", type=int, default=0, metavar="N", help="n-gram drafter key length (0 = off)")
    depth = parser.add_mutually_exclusive_group()
    depth.add_argument("--k", type=int, help="fixed draft depth (0 = plain decoding)")
    depth.add_argument("--adaptive", action="store_true", help="choose the depth each pass (default)")
    parser.add_argument("--k-max", type=int, default=16, help="largest depth the adaptive policy may choose")
    parser.add_argument("--prompts", required=True, type=Path, help='JSONL, one {"messages": [...]} per line')
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=40)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--min-p", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--ctx", type=int, default=4096, help="context size")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = physical cores)")
    parser.add_argument("--baseline", action="store_true", help="also run each prompt without speculation")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each prompt N times (speculative and plain alternating, in alternating order); "
                        "speedups are reported as median, min and max")
    parser.add_argument("--raw", action="store_true", help="also time a bare llama_decode loop")
    parser.add_argument("--json", type=Path, help="write the full report here")


def run(args: argparse.Namespace) -> int:
    try:
        if args.json:
            check_destination(args.json, "the report")  # before the run, not after it
        report = bench(args, sys.stdout)
        record_verify_cost(report)  # the drafter ranking predicts with this machine's pass costs
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
    except EngineCrashedError as exc:
        print(f"specdeck bench: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ENGINE_CRASHED
    except AppError as exc:
        print(f"specdeck bench: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"specdeck bench: cannot write {args.json}: {exc.strerror}.", file=sys.stderr)
        return EXIT_ERROR
    return 0
