"""`specdeck tune`: arguments, prompts from a file or the history, progress and the ranked table."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from app.cli.exit_codes import EXIT_CANCELLED, EXIT_ENGINE_CRASHED, EXIT_ERROR
from app.cli.load_options import add_load_arguments, load_settings
from app.errors import AppError
from app.measure.bench import BENCH_SAMPLING, EngineCrashedError, read_prompts
from app.measure.tune import Progress, TuneConfig, TuneReport, history_prompts, save_winner, table, tune
from app.params import DraftSettings
from app.safe_text import terminal_safe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model to try alone and under the n-gram drafter")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", type=Path, help='JSONL, one {"messages": [...]} per line')
    source.add_argument("--from-history", type=int, metavar="N", help="the last N chats of the history")
    parser.add_argument("--max-tokens", type=int, default=BENCH_SAMPLING.max_tokens)
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="stop starting new settings once the next would end past S seconds")
    parser.add_argument("--repeat", type=int, default=TuneConfig.repeat, metavar="N",
                        help="side-by-side runs per prompt and setting (the spread needs at least 2)")
    parser.add_argument("--temperature", type=float, default=BENCH_SAMPLING.temperature)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-replay", action="store_true",
                        help="measure every suffix-drafter setting for real instead of replaying the first "
                             "run's answers offline and confirming the winner")
    add_load_arguments(parser)


def tune_config(args: argparse.Namespace) -> TuneConfig:
    """The options as a sweep, with its prompts read from the file or the history; raises AppError."""
    settings = load_settings(args, str(args.target), DraftSettings(drafter_path=str(args.drafter) if args.drafter
                                                                   else None))
    if args.prompts is not None:
        source, prompts = str(args.prompts), read_prompts(args.prompts)
    else:
        source, prompts = "history", history_prompts(args.from_history)
    sampling = replace(BENCH_SAMPLING, max_tokens=args.max_tokens, temperature=args.temperature)
    return TuneConfig(settings, tuple(prompts), source, sampling, repeat=args.repeat, budget_s=args.budget_s,
                      replay=not args.no_replay)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def print_progress(p: Progress) -> None:
    m = p.latest
    print(f"[{p.done:>2}/{max(p.planned, p.done)}] {m.candidate.label():<28} {m.speedup:5.2f}× "
          f"({m.speedup_min:.2f}–{m.speedup_max:.2f}), {m.tok_s:.1f} tok/s; "
          f"{_minutes(p.elapsed_s)} so far, about {_minutes(p.left_s)} left", flush=True)


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        print(f"specdeck tune: --repeat must be at least 1, not {args.repeat}.", file=sys.stderr)
        return EXIT_ERROR
    if args.from_history is not None and args.from_history < 1:
        print(f"specdeck tune: --from-history must be at least 1, not {args.from_history}.", file=sys.stderr)
        return EXIT_ERROR
    if args.budget_s is not None and not args.budget_s > 0:
        print(f"specdeck tune: --budget-s must be above 0, not {args.budget_s}.", file=sys.stderr)
        return EXIT_ERROR
    try:
        config = tune_config(args)
        print(f"tuning {terminal_safe(args.target.name, one_line=True)}"
              + (f" with {terminal_safe(args.drafter.name, one_line=True)}" if args.drafter else "")
              + f" on {len(config.prompts)} prompts from {config.source}, {args.repeat} side-by-side runs each"
              + (f", budget {_minutes(args.budget_s)}" if args.budget_s else "") + "; Ctrl-C keeps what "
              "was measured", flush=True)
        report = tune(config, on_progress=print_progress)
    except EngineCrashedError as exc:
        print(f"specdeck tune: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ENGINE_CRASHED
    except AppError as exc:
        print(f"specdeck tune: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ERROR
    return _finish(report, args)


def _finish(report: TuneReport, args: argparse.Namespace) -> int:
    if report.stopped == "cancelled":
        print("cancelled: keeping what was measured", flush=True)
    elif report.stopped == "budget":
        print("stopped at the time budget", flush=True)
    if not report.results:
        print("Nothing was measured; nothing was saved.")
        return EXIT_CANCELLED if report.stopped == "cancelled" else EXIT_ERROR
    print(table(report))
    code = EXIT_CANCELLED if report.stopped == "cancelled" else 0
    try:
        tuned = save_winner(report)
    except AppError as exc:
        print(f"specdeck tune: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        code = EXIT_ERROR
    else:
        best = report.best
        if tuned is not None and best is not None:
            print(f"best: {best.candidate.label()}, {tuned.speedup:.2f}× "
                  f"({tuned.speedup_min:.2f}–{tuned.speedup_max:.2f}); saved to {report.saved_to}, "
                  "the window offers it for this pair (Use tuned settings)")
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report.as_json(), indent=2))
        except OSError as exc:
            print(f"specdeck tune: cannot write {args.json}: {exc.strerror}.", file=sys.stderr)
            return EXIT_ERROR
    return code
