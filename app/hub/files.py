"""A repository's GGUF files as a person picks them: models grouped by quant (split parts joined into one model
with their total size), and the files that are not models (vision projectors, importance matrices, MTP and
draft heads) labelled as what they are, never offered as a quant."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:IQ[1-4]_(?:XXS|XS|S|M|NL)|Q[1-8]_K(?:_(?:XXS|XS|S|M|L|XL))?|Q[1-8]_[01]"
    r"(?:_[48]_[48])?|TQ[12]_0|MXFP4(?:_MOE)?|NVFP4|BF16|FP16|F16|FP32|F32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)

MODEL = "model"
PROJECTOR = "vision projector (mmproj)"
IMATRIX = "importance matrix (imatrix)"
MTP_HEAD = "MTP head (a drafter, not a model)"
DRAFT_HEAD = "draft head (a drafter, not a model)"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository, as its tree listing gives it."""

    path: str
    size: int
    sha256: str | None = None  # the LFS object id; None for a file kept in git itself


@dataclass(frozen=True)
class ModelFiles:
    """One downloadable artefact: a single file, or every part of a split model in order."""

    kind: str  # MODEL or what the file is instead
    quant: str  # from the file name ("" when the name does not say)
    name: str  # the first part's path in the repository
    parts: tuple[RemoteFile, ...]
    expected_parts: int = 1

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def complete(self) -> bool:
        return len(self.parts) == self.expected_parts

    @property
    def label(self) -> str:
        base = PurePosixPath(self.name).name
        if self.expected_parts > 1:
            return f"{base} (+{self.expected_parts - 1} parts)"
        return base


def quant_of(name: str) -> str:
    """The quantization a file name states (the last one in it), upper-cased: "Q4_K_M", "IQ4_XS", "BF16"."""
    found = [m.group(1) for m in _QUANT.finditer(PurePosixPath(name).name.removesuffix(".gguf"))]
    if not found:
        return ""
    quant = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(quant, quant)


def kind_of(path: str) -> str:
    """What a .gguf file is, from its path: MODEL, or a projector, an imatrix, an MTP or a draft head."""
    p = PurePosixPath(path)
    base = p.name.lower()
    folders = [part.lower() for part in p.parts[:-1]]
    if "mmproj" in base:
        return PROJECTOR
    if "imatrix" in base:
        return IMATRIX
    if base.startswith("mtp-") or "mtp" in folders:
        return MTP_HEAD
    if base.startswith(("draft-", "eagle3-", "dflash-")) or any(f in ("draft", "eagle3", "dflash") for f in folders):
        return DRAFT_HEAD
    return MODEL


def split_of(path: str) -> tuple[str, int, int] | None:
    """(the path without the part suffix, part number from 1, part count) for `name-00001-of-00003.gguf`."""
    m = _SPLIT.match(path)
    if m is None:
        return None
    return m.group("prefix"), int(m.group("no")), int(m.group("count"))


def is_safe_name(path: str) -> bool:
    """A listed name that stays a plain file name inside the models folder on every platform."""
    name = PurePosixPath(path).name
    return not name.startswith(".") and not any(c in name for c in '\\:*?"<>|') and name.isprintable()


def group_files(files: Iterable[RemoteFile]) -> list[ModelFiles]:
    """The .gguf files of a listing as artefacts: models first (by quant, then name), then the other files."""
    singles: list[ModelFiles] = []
    splits: dict[tuple[str, int], list[tuple[int, RemoteFile]]] = {}
    for f in files:
        if not f.path.lower().endswith(".gguf") or not is_safe_name(f.path):
            continue
        split = split_of(f.path)
        if split is None:
            singles.append(ModelFiles(kind_of(f.path), quant_of(f.path), f.path, (f,)))
            continue
        prefix, no, count = split
        splits.setdefault((prefix, count), []).append((no, f))
    groups = list(singles)
    for (prefix, count), numbered in splits.items():
        numbered.sort(key=lambda x: x[0])
        parts = tuple(f for _, f in numbered)
        name = numbered[0][1].path if numbered[0][0] == 1 else f"{prefix}-00001-of-{count:05d}.gguf"
        groups.append(ModelFiles(kind_of(name), quant_of(f"{prefix}.gguf"), name, parts, count))
    return sorted(groups, key=lambda g: (g.kind != MODEL, g.kind, g.quant, g.name))


def models_only(groups: Sequence[ModelFiles]) -> list[ModelFiles]:
    """The groups a person can load as a chat model: whole models, split sets with every part present."""
    return [g for g in groups if g.kind == MODEL and g.complete]
