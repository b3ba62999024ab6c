"""`specdeck bench`: arguments and printing; the measuring lives in app.engine.bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.exit_codes import EXIT_ENGINE_CRASHED, EXIT_ERROR
from app.engine.bench import EngineCrashedError, add_bench_arguments, bench
from app.errors import AppError
from app.library.verify_cost import record_report as record_verify_cost
from app.safe_text import terminal_safe
from app.storage.atomic import check_destination


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_bench_arguments(parser)


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
        where = terminal_safe(exc.filename or args.json or "a file", one_line=True)
        print(f"specdeck bench: cannot write {where}: {exc.strerror or exc}.", file=sys.stderr)
        return EXIT_ERROR
    return 0
