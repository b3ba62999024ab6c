"""`specdeck search` and `specdeck pull`: GGUF models on the Hugging Face Hub, and their download into the
models folder (HF_ENDPOINT for a mirror, HF_TOKEN for gated repositories)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.ceiling.roofline import Device
from app.cli.exit_codes import EXIT_BAD_OPTIONS, EXIT_CANCELLED, EXIT_ERROR
from app.errors import AppError
from app.hub.client import RepoHit, list_files, repo_id, search
from app.hub.files import MODEL, ModelFiles, group_files
from app.hub.pending import target_folder
from app.hub.transfer import Progress, choose, pull
from app.safe_text import terminal_safe
from app.units import format_bytes, format_count

if TYPE_CHECKING:  # the fit and the pairing pull in the roofline and numpy: `pull` never needs them
    from app.hub.pairing import RemoteDrafter
    from app.hub.verdict import QuantVerdict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if parser.prog.rsplit(" ", 1)[-1] == "pull":
        parser.add_argument("repo", metavar="REPO", help="the repository, owner/name or its Hub URL")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--file", default=None, metavar="NAME", help="the GGUF file (any part of a split model)")
        which.add_argument("--quant", default=None, metavar="Q", help="the quant, e.g. Q4_K_M")
        parser.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit (default main)")
        return
    parser.add_argument("query", metavar="QUERY", help="words to search for, or owner/name to list its GGUF files")
    parser.add_argument("--files", action="store_true", help="QUERY is a repository: list its GGUF files")
    parser.add_argument("--limit", type=int, default=20, metavar="N", help="repositories to show (default 20)")
    parser.add_argument("--ctx", type=int, default=None, metavar="N",
                        help="context length for the fit (default 4096, or the model's if smaller)")
    parser.add_argument("--no-fit", action="store_true", help="skip reading each quant's header from the Hub")
    parser.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit (default main)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _cell(value: object) -> str:
    return terminal_safe(value, one_line=True)  # names come from the Hub: untrusted text


def _table(rows: Sequence[Sequence[str]]) -> str:
    rows = [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _fail(command: str, message: object, code: int = EXIT_ERROR) -> int:
    print(f"specdeck {command}: {_cell(message)}", file=sys.stderr)
    return code


def _hit_json(h: RepoHit) -> dict[str, Any]:
    return {"repo": h.repo, "downloads": h.downloads, "likes": h.likes, "gated": h.gated,
            "last_modified": h.last_modified.isoformat() if h.last_modified else None}


def _search(args: argparse.Namespace) -> int:
    if args.limit < 1:
        return _fail("search", f"--limit must be at least 1, not {args.limit}.", EXIT_BAD_OPTIONS)
    hits = search(args.query, args.limit)
    if args.json:
        print(json.dumps({"query": args.query, "repositories": [_hit_json(h) for h in hits]}, indent=2))
        return 0
    if not hits:
        print(f"No GGUF repositories match {_cell(args.query)!r}.")
        return 0
    rows = [["REPOSITORY", "DOWNLOADS", "LIKES", "UPDATED"]]
    rows += [[h.repo + (" (gated)" if h.gated else ""), format_count(h.downloads), str(h.likes),
              h.last_modified.strftime("%Y-%m-%d") if h.last_modified else "-"] for h in hits]
    print(_table(rows))
    print("\n`specdeck search OWNER/NAME` lists a repository's quants; `specdeck pull OWNER/NAME --quant Q` "
          "downloads one.")
    return 0


def _devices() -> list[Device]:
    from app.ceiling.builder import probe_machine

    return probe_machine()[1]


def _drafter_json(d: RemoteDrafter) -> dict[str, Any]:
    return {"repo": d.repo, "file": d.group.name, "quant": d.group.quant, "size_bytes": d.size,
            "tokenizer": d.reason}


def _group_json(g: ModelFiles, v: QuantVerdict | None, drafters: Sequence[RemoteDrafter] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": g.kind, "quant": g.quant, "file": g.name, "size_bytes": g.size,
                           "parts": [p.path for p in g.parts], "expected_parts": g.expected_parts,
                           "complete": g.complete, "sha256": [p.sha256 for p in g.parts]}
    if v is not None:
        out.update({"ctx": v.ctx, "fits": v.fits, "fit": v.fit_message, "tokens_per_second": v.tokens_per_second,
                    "ceiling_tokens_per_second": v.ceiling_tokens_per_second,
                    "efficiency": v.efficiency.efficiency if v.efficiency else None,
                    "speed_basis": v.speed_basis or None,
                    "error": v.error or None,
                    "architecture": v.info.architecture if v.info else None,
                    "n_params": v.info.n_params if v.info else None,
                    "quantization": v.info.quantization if v.info else None})
    if drafters is not None and g.kind == MODEL and g.complete:
        from app.hub.pairing import smaller_than

        out["drafters_from_other_repositories"] = [_drafter_json(d) for d in smaller_than(drafters, g.size)]
    return out


def _files(args: argparse.Namespace, repo: str) -> int:
    if args.ctx is not None and args.ctx < 16:
        return _fail("search", f"--ctx must be at least 16, not {args.ctx}.", EXIT_BAD_OPTIONS)
    groups = group_files(list_files(repo, args.revision))
    models = [g for g in groups if g.kind == MODEL and g.complete]
    from app.hub.pairing import remote_drafters
    from app.hub.verdict import judge

    verdicts: dict[str, QuantVerdict] = {}
    if models and not args.no_fit:
        devices = _devices()
        verdicts = {g.name: judge(repo, g, devices, args.ctx, args.revision) for g in models}
    target = next((v.info for v in verdicts.values() if v.info is not None), None)
    drafters = None if target is None else remote_drafters(repo, target, max(g.size for g in models))
    if args.json:
        print(json.dumps({"repo": repo, "revision": args.revision,
                          "files": [_group_json(g, verdicts.get(g.name), drafters) for g in groups]}, indent=2))
        return 0
    if not groups:
        print(f"{_cell(repo)} has no GGUF files.")
        return 0
    out: list[str] = []
    if models:
        ctx = next(iter(verdicts.values())).ctx if verdicts else None
        rows = [["QUANT", "FILE", "SIZE", f"FITS (ctx {ctx})" if ctx else "FITS", "PLAIN TOK/S"]]
        notes: list[str] = []
        for g in models:
            v = verdicts.get(g.name)
            fit, speed = "-", "-"
            if v is not None and v.error:
                fit = "unknown (below)"
                notes.append(f"  {g.quant or g.label}: {_cell(v.error)}")
            elif v is not None:
                fit = "fits" if v.fits else "does not fit"
                if v.tokens_per_second is not None:
                    speed = f"{v.tokens_per_second:.{0 if v.tokens_per_second >= 100 else 1}f}"
                if not v.fits:
                    notes.append(f"  {g.quant or g.label}: {_cell(v.fit_message)}")
            rows.append([g.quant or "?", g.label, format_bytes(g.size), fit, speed])
        out.append(_table(rows))
        bases = sorted({v.speed_basis for v in verdicts.values() if v.speed_basis})
        if len(bases) == 1:
            out.append(f"PLAIN TOK/S: {bases[0]}.")
        else:  # quants bound by different devices (one spills to the CPU): each says its own
            out += [f"  {g.quant or g.label} tok/s: {verdicts[g.name].speed_basis}" for g in models
                    if g.name in verdicts and verdicts[g.name].speed_basis]
        out += notes
        if drafters:
            out.append("\nDrafters from other repositories (the same tokenizer; each pairs with the quants larger "
                       "than it):")
            out.append(_table([["  " + d.repo, d.group.label, format_bytes(d.size)] for d in drafters]))
    others = [g for g in groups if g not in models]
    if others:
        out.append("\nNot models (never a quant to pick):" if models else "No models, only:")
        out.append(_table([["  " + g.label, format_bytes(g.size), g.kind if g.complete else
                            f"incomplete split model ({len(g.parts)} of {g.expected_parts} parts)"] for g in others]))
    if models:
        out.append(f"\n`specdeck pull {repo} --quant Q` downloads one into the models folder.")
    print("\n".join(out))
    return 0


def _progress_printer() -> Any:
    tty = sys.stderr.isatty()
    last = [-1, 0.0]  # the tenth of the way shown last (a file or pipe), the time of the last line (a terminal)

    def show(p: Progress) -> None:
        percent = int(p.done * 100 / p.total) if p.total else 100
        now = time.monotonic()
        if tty and now - last[1] < 0.25 and p.done < p.total:
            return
        if not tty and percent // 10 == last[0]:
            return
        last[0], last[1] = percent // 10, now
        eta = "?" if p.eta is None else f"{int(p.eta // 60)}m{int(p.eta % 60):02d}s"
        line = (f"{_cell(p.file)}: {format_bytes(p.done)} of {format_bytes(p.total)} ({percent}%), "
                f"{format_bytes(p.rate)}/s, {eta} left")
        print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    return show


def _pull(args: argparse.Namespace) -> int:
    repo = repo_id(args.repo)
    if repo is None:
        return _fail("pull", f"{args.repo!r} is not a repository: give it as owner/name or its Hub URL.",
                     EXIT_BAD_OPTIONS)
    group = choose(group_files(list_files(repo, args.revision)), file=args.file, quant=args.quant, repo=repo)
    try:
        done = pull(repo, group, revision=args.revision, progress=_progress_printer())
    except KeyboardInterrupt:
        print(f"\nspecdeck pull: stopped; the partial file is kept in {_cell(target_folder(repo))}: pull again "
              "to continue.", file=sys.stderr)
        return EXIT_CANCELLED
    if sys.stderr.isatty():
        print(file=sys.stderr)
    where = done.paths[0]
    if done.already_there:
        print(f"{_cell(where.name)} is already in the models folder: {_cell(where)}")
        return 0
    checked = "verified against the Hub's sha256" if done.verified else "size checked (the Hub gave no sha256)"
    parts = f" and its {len(done.paths) - 1} other parts" if len(done.paths) > 1 else ""
    print(f"Pulled {_cell(where.name)}{parts} ({format_bytes(group.size)}, {checked}) into {_cell(where.parent)}; "
          "`specdeck models` lists it.")
    return 0


def run(args: argparse.Namespace) -> int:
    command = "pull" if args.command == "pull" else "search"
    try:
        if command == "pull":
            return _pull(args)
        repo = repo_id(args.query)
        if args.files or repo is not None:
            if repo is None:
                return _fail(command, f"{args.query!r} is not a repository: give it as owner/name.",
                             EXIT_BAD_OPTIONS)
            return _files(args, repo)
        return _search(args)
    except KeyboardInterrupt:
        print(f"\nspecdeck {command}: stopped.", file=sys.stderr)
        return EXIT_CANCELLED
    except AppError as exc:
        return _fail(command, exc)
    except OSError as exc:
        return _fail(command, f"a file could not be written: {exc.strerror or exc}.")
