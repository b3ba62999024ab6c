"""The `specdeck` entry point: the command line from app, with the window from ui.

Qt is imported only when the window opens, so headless subcommands never load it.
"""

from __future__ import annotations

from collections.abc import Sequence


def open_window() -> int:
    from ui.main import run_app

    return run_app()


def main(argv: Sequence[str] | None = None) -> int:
    from app.cli import main as cli_main

    return cli_main(argv, open_window=open_window)
