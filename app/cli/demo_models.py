"""`specdeck demo-models`: install the two demo models into the models folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.errors import DownloadError
from app.library.demo_install import install_demo_models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None, help="install into this folder (default: the models folder)")


def run(args: argparse.Namespace) -> int:
    try:
        paths = install_demo_models(args.dir, log=lambda m: print(m, file=sys.stderr))
    except DownloadError as exc:
        print(f"specdeck demo-models: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0
