"""The `specdeck` command: opens the window, or runs a headless subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from app import __version__

# subcommand -> (module with add_arguments/run, one-line help)
SUBCOMMANDS = {
    "bench": ("app.cli.bench", "measure speculative decoding against plain decoding (the benchmark contract)"),
    "chat": ("app.cli.chat", "chat in the terminal with streaming output"),
    "doctor": ("app.cli.doctor", "backend, devices, bandwidth and the ceiling for a model"),
    "models": ("app.cli.models", "list the GGUF models found on this machine and which drafters fit"),
    "demo-models": ("app.cli.demo_models", "install the two small demo models into the models folder"),
    "tune": ("app.cli.tune", "find the fastest drafting settings for a pair on your own prompts, and keep them"),
    "serve": ("app.cli.serve", "serve the engine over an OpenAI-compatible HTTP API with Prometheus /metrics"),
    "search": ("app.cli.hub", "search the Hugging Face Hub for GGUF models, or list a repository's quants and fit"),
    "pull": ("app.cli.hub", "download a GGUF model from the Hub into the models folder (resumable, verified)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; only ``command``'s module is imported, so one subcommand never slows another."""
    parser = argparse.ArgumentParser(
        prog="specdeck",
        description="SpecDeck runs local GGUF models fast with speculative decoding. "
        "Without a subcommand it opens the window.",
    )
    parser.add_argument("--version", action="version", version=f"SpecDeck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None, open_window: Callable[[], int] | None = None) -> int:
    """Run a subcommand; without one, ``open_window`` (the GUI layer passes it in: app never imports ui)."""
    from app.logs import setup_logging

    setup_logging()  # once per process: the window and every subcommand log to the same rotating file
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(args_list)
    if args.command is None:
        if open_window is None:
            parser.print_help()
            return 0
        return open_window()
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
