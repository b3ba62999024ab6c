"""Drafters from other repositories: GGUF repositories of the same family on the Hub whose smallest model quant
is smaller than the target and whose header shows the target's tokenizer, by the same check the library uses
for local drafters (``app.library.compat.check_compatible``). Bounded in header reads and time, and a
candidate that fails (gated, unlisted, a header that cannot be read) is skipped: it never fails the listing."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import AppError
from app.hub.client import list_files, search
from app.hub.files import ModelFiles, group_files, models_only
from app.hub.verdict import model_info
from app.library.compat import VocabInfo, check_compatible
from app.library.gguf_reader import GGUFInfo

logger = logging.getLogger(__name__)

MAX_HEADER_READS = 5
TIME_LIMIT_S = 30.0
SEARCH_LIMIT = 20  # repositories looked at for the family; most have no smaller quant, and cost one listing
_STEM_END = re.compile(r"^(?:\d+(?:\.\d+)?[BbMm]|A\d+(?:\.\d+)?[Bb]|GGUF|Instruct|Chat|Base|It|IT|MoE)$")


@dataclass(frozen=True)
class RemoteDrafter:
    repo: str
    group: ModelFiles
    reason: str  # how the tokenizer check decided

    @property
    def size(self) -> int:
        return self.group.size


def family_query(repo: str) -> str:
    """The family a repository's name starts with, as a search for its relatives: "Qwen3-0.6B-GGUF" → "Qwen3",
    "Llama-3.2-1B-Instruct-GGUF" → "Llama-3.2"."""
    words = re.split(r"[-_ ]", repo.split("/", 1)[-1])
    stem: list[str] = []
    for word in words:
        if _STEM_END.match(word):
            break
        stem.append(word)
    return "-".join(stem) or words[0]


def pairs_for(target: GGUFInfo, candidate: GGUFInfo) -> str | None:
    """How the tokenizers were found the same (the check's reason), or None: not a drafter for ``target``."""
    result = check_compatible(VocabInfo.from_gguf(target), VocabInfo.from_gguf(candidate))
    return result.reason if result.ok and result.confirmed else None


def remote_drafters(repo: str, target: GGUFInfo, largest: int, *, max_reads: int = MAX_HEADER_READS,
                    time_limit_s: float = TIME_LIMIT_S) -> list[RemoteDrafter]:
    """Other repositories' model quants, each its repository's smallest and smaller than ``largest`` bytes,
    that share ``target``'s tokenizer, smallest first. At most ``max_reads`` headers are read and no new
    request starts after ``time_limit_s``; whatever fails is skipped with a log line."""
    deadline = time.monotonic() + time_limit_s
    query = family_query(repo)
    try:
        hits = search(query, SEARCH_LIMIT)
    except AppError as exc:
        logger.info("No drafters from other repositories for %s: the search for %r failed (%s)", repo, query, exc)
        return []
    found: list[RemoteDrafter] = []
    reads = 0
    for hit in hits:
        if reads >= max_reads or time.monotonic() > deadline:
            break
        if hit.repo == repo or hit.gated:
            continue
        try:
            smaller = [g for g in models_only(group_files(list_files(hit.repo))) if g.size < largest]
            if not smaller:
                continue
            smallest = min(smaller, key=lambda g: (g.size, g.name))
            reads += 1
            info = model_info(hit.repo, smallest)
        except AppError as exc:
            logger.info("Skipped %s as a drafter for %s: %s", hit.repo, repo, exc)
            continue
        reason = pairs_for(target, info)
        if reason is not None:
            found.append(RemoteDrafter(hit.repo, smallest, reason))
    return sorted(found, key=lambda d: (d.size, d.repo))


def smaller_than(drafters: Sequence[RemoteDrafter], size: int) -> list[RemoteDrafter]:
    """The drafters for a quant of ``size`` bytes: those smaller than it."""
    return [d for d in drafters if d.size < size]
