"""`specdeck tune`: arguments, prompts from a file or the history, progress and the ranked table."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.cli.exit_codes import EXIT_CANCELLED, EXIT_ENGINE_CRASHED, EXIT_ERROR
from app.engine.bench import EngineCrashedError, read_prompts
from app.engine.tune import Progress, history_prompts, save_winner, table, tune
from app.errors import AppError
from app.safe_text import terminal_safe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model to try alone and under the n-gram drafter")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", type=Path, help='JSONL, one {"messages": [...]} per line')
    source.add_argument("--from-history", type=int, metavar="N", help="the last N chats of the history")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="stop starting new settings once the next would end past S seconds")
    parser.add_argument("--repeat", type=int, default=2, metavar="N",
                        help="side-by-side runs per prompt and setting (the spread needs at least 2)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = physical cores)")
    parser.add_argument("--ctx", type=int, default=4096, help="context size")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-replay", action="store_true",
                        help="measure every suffix-drafter setting for real instead of replaying the first "
                             "run's answers offline and confirming the winner")


def bench_namespace(target: Path, prompts: Path, args: argparse.Namespace) -> argparse.Namespace:
    """The bench's own arguments with its own defaults, for the tune to vary."""
    from app.cli import bench as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args([
        "--target", str(target), "--prompts", str(prompts), "--max-tokens", str(args.max_tokens),
        "--repeat", str(args.repeat), "--temperature", str(args.temperature), "--threads", str(args.threads),
        "--ctx", str(args.ctx), "--baseline",
    ])


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
    with tempfile.TemporaryDirectory(prefix="specdeck-tune-") as scratch:
        try:
            if args.prompts is not None:
                source, prompts = str(args.prompts), read_prompts(args.prompts)
                prompts_file = args.prompts
            else:
                source, prompts = "history", history_prompts(args.from_history)
                prompts_file = Path(scratch) / "history.jsonl"
                prompts_file.write_text("".join(json.dumps({"messages": p}) + "\n" for p in prompts),
                                        encoding="utf-8")
            base = bench_namespace(args.target, prompts_file, args)
            drafter = str(args.drafter) if args.drafter else None
            print(f"tuning {terminal_safe(args.target.name, one_line=True)}"
                  + (f" with {terminal_safe(args.drafter.name, one_line=True)}" if args.drafter else "")
                  + f" on {len(prompts)} prompts from {source}, {args.repeat} side-by-side runs each"
                  + (f", budget {_minutes(args.budget_s)}" if args.budget_s else "") + "; Ctrl-C keeps what "
                  "was measured", flush=True)
            report = tune(base, drafter=drafter, source=source, prompts=len(prompts), budget_s=args.budget_s,
                          on_progress=print_progress, replay=not getattr(args, "no_replay", False))
        except EngineCrashedError as exc:
            print(f"specdeck tune: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
            return EXIT_ENGINE_CRASHED
        except AppError as exc:
            print(f"specdeck tune: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
            return EXIT_ERROR
        except OSError as exc:
            print(f"specdeck tune: cannot write the history's prompts: {exc.strerror}.", file=sys.stderr)
            return EXIT_ERROR
    return _finish(report, args)


def _finish(report: Any, args: argparse.Namespace) -> int:
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
        if tuned is not None:
            print(f"best: {report.best.candidate.label()}, {tuned.speedup:.2f}× "
                  f"({tuned.speedup_min:.2f}–{tuned.speedup_max:.2f}); saved to {report.saved_to}, "
                  "the window offers it for this pair (Use tuned settings)")
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report.as_json(), indent=2))
        except OSError as exc:
            print(f"specdeck tune: cannot write {args.json}: {exc.strerror}.", file=sys.stderr)
            return EXIT_ERROR
    return code
