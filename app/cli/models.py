"""`specdeck models`: the GGUF models found on this machine, and with --target, which drafters fit it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.cli.exit_codes import EXIT_ERROR
from app.errors import ModelFileError
from app.library.discovery import LibraryEntry, discover
from app.library.gguf_reader import GGUFInfo
from app.library.heads import DRAFTER_HEADS
from app.library.model_file import check_model_file
from app.measure.recommend import DrafterReport, Recommendation, drafters_for
from app.safe_text import terminal_safe
from app.storage.pair_stats import load_measured
from app.units import format_bytes, format_count

MAX_LISTED_ERRORS = 50  # past this, the unusable files are summarised (all of them are in --json)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--target", type=Path, default=None, metavar="PATH",
                        help="also rank the library's models as drafters for this target model")
    parser.add_argument("--folder", type=Path, action="append", default=[], metavar="DIR",
                        help="also look in this folder (repeatable)")


def _info_json(info: GGUFInfo) -> dict[str, Any]:
    return {
        "kind": info.kind, "architecture": info.architecture, "name": info.name, "n_params": info.n_params,
        "tensor_bytes": info.tensor_bytes, "quantization": info.quantization,
        "context_length": info.context_length, "n_layer": info.n_layer, "vocab_type": info.vocab_type,
        "n_vocab": info.n_vocab, "has_chat_template": info.has_chat_template,
        "split_count": info.split_count, "missing_shards": list(info.missing_shards),
        "mtp_heads": info.mtp_layers,
    }


def _entry_json(e: LibraryEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"path": e.path, "source": e.source, "label": e.label, "size_bytes": e.size,
                           "error": e.error, "error_type": e.error_type}
    if e.info is not None:
        out.update(_info_json(e.info))
    return out


def _rec_json(r: Recommendation) -> dict[str, Any]:
    return {"path": r.drafter_path, "name": r.name, "kind": r.kind, "cost_ratio": round(r.cost_ratio, 6),
            "acceptance": r.acceptance, "acceptance_source": r.acceptance_source, "best_k": r.best_k,
            "tokens_per_pass": round(r.tokens_per_pass, 4), "predicted_speedup": round(r.speedup, 4),
            "curve": r.curve, "bandwidth_bound_speedup": round(r.bandwidth_speedup, 4), "note": r.note,
            "per_position_acceptance": list(r.per_position)}


def _cell(value: object) -> str:
    """File-derived text (names, architectures, reasons) as one terminal-safe line."""
    return terminal_safe(value, one_line=True)


def _table(rows: Sequence[Sequence[str]]) -> str:
    rows = [[_cell(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _library_text(entries: Sequence[LibraryEntry]) -> str:
    rows: list[list[str]] = [["SOURCE", "MODEL", "ARCH", "SIZE", "PARAMS", "QUANT", "CTX", "VOCAB", "NOTE"]]
    broken: list[str] = []
    for e in entries:
        i = e.info
        if i is None:
            broken.append(f"  {_cell(e.source)}: {_cell(e.label)}: {_cell(e.error)}")
            continue
        note = "" if i.kind == "model" else i.kind
        if i.mtp_layers:
            note = f"MTP heads: {i.mtp_layers}"
        if i.architecture in DRAFTER_HEADS:
            note = f"{DRAFTER_HEADS[i.architecture]} (not a chat model; --drafter of its target)"
        if e.error:
            note = "incomplete: shards missing"
        rows.append([e.source, e.label, i.architecture or "-", format_bytes(e.size), format_count(i.n_params),
                     i.quantization or "-", str(i.context_length or "-"), str(i.n_vocab or "-"), note])
    out = [_table(rows)] if len(rows) > 1 else ["No GGUF models found."]
    if broken:
        out.append(f"\nCannot be used ({len(broken)}):")
        out += broken[:MAX_LISTED_ERRORS]
        if len(broken) > MAX_LISTED_ERRORS:
            out.append(f"  … and {len(broken) - MAX_LISTED_ERRORS} more (`specdeck models --json` lists them all).")
    return "\n".join(out)


def _drafters_text(target: GGUFInfo, report: DrafterReport, entries: Sequence[LibraryEntry]) -> str:
    labels = {e.path: e.label for e in entries}
    curve = report.recommendations[-1].curve  # every row of one ranking uses the target's curve
    out = [f"\nDrafters for {_cell(Path(target.path).name)} ({format_bytes(target.tensor_bytes)} of weights), "
           f"ranked by predicted speedup on {curve}:"]
    rows = [["#", "DRAFTER", "c", "ACCEPT", "K", "TOK/PASS", "SPEEDUP", "GPU-STYLE"]]
    for n, r in enumerate(report.recommendations, 1):
        if r.kind == "ngram":
            rank, label = "free", r.name
        elif r.kind == "model" and r.drafter_path is not None:
            rank, label = str(n), f"{labels.get(r.drafter_path, Path(r.drafter_path).name)} ({r.name})"
        else:  # a trained head, named as the heads below name it
            rank, label = str(n), r.name
        rows.append([rank, label, f"{r.cost_ratio:.3f}", f"{r.acceptance:.2f} {r.acceptance_source}",
                     str(r.best_k), f"{r.tokens_per_pass:.2f}", f"{r.speedup:.2f}x",
                     f"{r.bandwidth_speedup:.2f}x bandwidth-bound"])
    out.append(_table(rows))
    if len(report.recommendations) == 1:
        out.append("No model in the library has a vocabulary this target accepts; the n-gram drafter "
                   "needs none.")
    if report.heads:
        out.append("\nTrained heads for it (they read its hidden states; --mtp for its own, --drafter for a file):")
        out += [f"  {_cell(h.label)}: " + ("fits" if h.fits else f"does not fit: {_cell(h.refusal)}")
                for h in report.heads]
    if report.refused:
        out.append(f"\nCannot draft for it ({len(report.refused)}):")
        out += [f"  {_cell(e.label)}: {_cell(res.reason)}" for e, res in report.refused[:MAX_LISTED_ERRORS]]
        if len(report.refused) > MAX_LISTED_ERRORS:
            out.append(f"  … and {len(report.refused) - MAX_LISTED_ERRORS} more (`--json` lists them all).")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    for stream in (sys.stdout, sys.stderr):  # odd file names or a narrow console must not crash the listing
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
    target: GGUFInfo | None = None
    if args.target is not None:
        try:
            target = check_model_file(args.target, "target")
        except ModelFileError as exc:
            print(f"specdeck models: {_cell(exc)}", file=sys.stderr)
            return EXIT_ERROR
    entries = discover(extra_folders=args.folder)
    report = drafters_for(target, entries, load_measured()) if target is not None else None

    if args.json:
        doc: dict[str, Any] = {"models": [_entry_json(e) for e in entries]}
        if target is not None and report is not None:
            doc["target"] = {"path": target.path, **_info_json(target)}
            doc["drafters"] = [_rec_json(r) for r in report.recommendations]
            doc["heads"] = [{"label": h.label, "path": h.path, "fits": h.fits, "reason": h.refusal}
                            for h in report.heads]
            doc["incompatible"] = [
                {"path": e.path, "label": e.label, "check": res.check, "reason": res.reason}
                for e, res in report.refused
            ]
        print(json.dumps(doc, indent=2))
        return 0

    print(_library_text(entries))
    if target is not None and report is not None:
        print(_drafters_text(target, report, entries))
    return 0
