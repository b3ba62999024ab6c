"""`specdeck demo-models`: install the two demo models into the models folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.exit_codes import EXIT_ERROR
from app.errors import DownloadError
from app.library.demo_install import install_demo_models
from app.safe_text import terminal_safe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None, help="install into this folder (default: the models folder)")


def run(args: argparse.Namespace) -> int:
    try:
        paths = install_demo_models(args.dir, log=lambda m: print(terminal_safe(m), file=sys.stderr))
    except DownloadError as exc:
        print(f"specdeck demo-models: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ERROR
    for path in paths:
        print(terminal_safe(path, one_line=True))
    return 0
