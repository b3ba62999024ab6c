"""The command reference (``docs/reference.md``), written from the commands' own parsers, so it cannot drift
from what ``--help`` says: ``python -m app.cli.reference > docs/reference.md``. A test compares the file with
what this writes."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from app.cli import SUBCOMMANDS

HEADER = """# Command reference

Every command and option, as the commands' own parsers define them (written by `python -m app.cli.reference`;
do not edit by hand). What the commands are for, with examples: [commands.md](commands.md).
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help(action: argparse.Action, prog: str) -> str:
    """The action's help with its %(...)s filled in, as argparse's own formatter fills them."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params: dict[str, Any] = {k: v for k, v in dict(vars(action), prog=prog).items() if v is not argparse.SUPPRESS}
    for name, value in list(params.items()):
        if hasattr(value, "__name__"):
            params[name] = value.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return str(action.help % params)


def _usage_name(action: argparse.Action) -> str:
    """``--ctx N`` (``-c``, ``--ctx-size``): the first spelling with its value, then the aliases."""
    if not action.option_strings:
        return _cell(f"`{action.metavar or action.dest}`")
    first, *aliases = action.option_strings
    if action.nargs != 0:
        metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                     else action.dest.upper())
        first = f"{first} {metavar}"
    also = f" ({', '.join(f'`{a}`' for a in aliases)})" if aliases else ""
    return _cell(f"`{first}`{also}")


def command_section(name: str) -> str:
    module_name, help_text = SUBCOMMANDS[name]
    prog = f"specdeck {name}"
    parser = argparse.ArgumentParser(prog=prog, description=help_text, add_help=False)
    importlib.import_module(module_name).add_arguments(parser)
    rows = [f"| {_usage_name(a)} | {_cell(_help(a, prog))} |" for a in parser._actions
            if a.help != argparse.SUPPRESS]
    lines = [f"## `{prog}`", "", f"{help_text[0].upper()}{help_text[1:]}.", ""]
    if rows:
        lines += ["| argument | meaning |", "|---|---|", *rows]
    else:
        lines.append("No options.")
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    return "\n".join([HEADER, *(command_section(name) for name in SUBCOMMANDS)])


if __name__ == "__main__":
    print(reference_markdown(), end="")
