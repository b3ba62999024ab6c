"""What the Find models view's workers hand back, and how it reads: a repository's listing with what is already
in the models folder, a quant's verdict with the library's drafters for it, and the sentences for failures,
speeds, times left and drafters. No widget here: these run on the workers or format for one."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import AppError
from app.hub.client import list_files
from app.hub.files import DRAFT_HEAD, MODEL, MTP_HEAD, ModelFiles, group_files
from app.hub.pairing import RemoteDrafter, smaller_than
from app.hub.pending import on_disk
from app.hub.verdict import QuantVerdict
from app.measure.recommend import DrafterReport
from app.units import format_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listing:
    repo: str
    groups: tuple[ModelFiles, ...]
    on_disk: dict[str, tuple[bool, int]]  # by group name, models only: (every part in place, bytes on disk)


@dataclass(frozen=True)
class Judged:
    verdict: QuantVerdict
    drafters: DrafterReport | None  # None: the header could not be read, or the library could not be ranked


def list_repo(repo: str) -> Listing:
    groups = tuple(group_files(list_files(repo)))
    return Listing(repo, groups, {g.name: on_disk(repo, g) for g in groups if g.kind == MODEL and g.complete})


def error_text(exc: BaseException) -> str:
    """The sentence for a failed task: an AppError's own, a disk's, or (a bug) the exception, logged."""
    if isinstance(exc, AppError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"A file could not be written: {exc.strerror or exc}."
    logger.error("a Find models task failed", exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


def speed_text(tokens_per_second: float | None) -> str:
    if tokens_per_second is None:
        return "–"
    return f"{tokens_per_second:.{0 if tokens_per_second >= 100 else 1}f}"


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min left"
    return f"{seconds // 60} min {seconds % 60:02d} s left" if seconds >= 60 else f"{seconds} s left"


def drafters_text(judged: Judged | None, others: Sequence[ModelFiles]) -> str:
    """The drafters that pair with a quant where that is known: the library's models with its tokenizer, ranked
    as the picker ranks them, its own MTP heads, and the head files its repository also has."""
    heads = [g.label for g in others if g.kind in (MTP_HEAD, DRAFT_HEAD)]
    repo_note = f" This repository also has {', '.join(heads)} (a drafter head, not a model)." if heads else ""
    if judged is None:
        return "Drafters: checking…"
    if judged.drafters is None:
        return "Drafters: not known until its header can be read." + repo_note
    report = judged.drafters
    models = [r for r in report.recommendations if r.kind == "model" and r.drafter_path]
    # A model as large as the quant (a copy of the same model) shares its tokenizer but cannot draft cheaply.
    slow = [f"{r.name} ({r.speedup:.2f}× predicted)" for r in models if r.speedup <= 1.0]
    slow_note = f" Sharing its tokenizer but predicted no faster than plain: {'; '.join(slow)}." if slow else ""
    found = [f"{r.name} ({r.speedup:.2f}× predicted)" for r in models if r.speedup > 1.0]
    found += [offer.label for offer in report.heads if offer.fits]
    if not found:
        none = ("no model in your library that shares its tokenizer is predicted to be faster" if slow
                else "no model in your library shares its tokenizer")
        return f"Drafters: {none}; the suffix drafter works with any model.{slow_note}{repo_note}"
    return "Drafters that pair with it: " + "; ".join(found) + "; and the suffix drafter." + slow_note + repo_note


def remote_drafters_text(remote: Sequence[RemoteDrafter] | None, size: int) -> str:
    """Other repositories' quants with the same tokenizer that are smaller than a quant of ``size`` bytes;
    None: still looking."""
    if remote is None:
        return "Drafters from other repositories: looking for ones with its tokenizer…"
    found = [f"{d.repo} · {d.group.label} ({format_bytes(d.size)})" for d in smaller_than(remote, size)]
    if not found:
        return "No smaller model in other repositories of its family has its tokenizer."
    return "From other repositories, with its tokenizer: " + "; ".join(found) + "."
