"""Whether a file can be loaded as a model: the one check every path to llama.cpp goes through (the engine
session, doctor, the ceiling, `specdeck models`), with the same sentences everywhere.

A refusal is a ModelFileError (a GGUFError from the reader, a MissingShardError for split models) whose
message names the file and says what to choose instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.errors import ModelFileError
from app.library.gguf_format import GGUFError, MissingShardError
from app.library.gguf_reader import GGUFInfo, read_gguf_info
from app.library.heads import DRAFTER_HEADS, head_file_refusal

MISSING_SHOWN = 3  # missing parts named in the message; the rest are counted


def _shown_name(missing: str) -> str:
    # Entries are file paths, or a description when the file name does not say where the parts are.
    return Path(missing).name if os.sep in missing or "/" in missing else missing


def ensure_complete(info: GGUFInfo) -> None:
    """Refuse a split model with missing parts, and a part other than the first, before llama.cpp sees it."""
    name = Path(info.path).name
    if info.missing_shards:
        shown = [_shown_name(m) for m in info.missing_shards[:MISSING_SHOWN]]
        if len(info.missing_shards) > MISSING_SHOWN:
            shown.append(f"and {len(info.missing_shards) - MISSING_SHOWN} more")
        raise MissingShardError(
            f"{name} is split into {info.split_count} parts and these are missing: {', '.join(shown)}. "
            "Put every part in the same folder.",
            info.path,
        )
    if info.kind == "shard":
        raise MissingShardError(
            f"{name} is part of a split model; choose its first part (…-00001-of-….gguf), not part "
            f"{info.split_index + 1} of {info.split_count}.",
            info.path,
        )


def ensure_model(info: GGUFInfo) -> None:
    """Refuse a header that is whole but not a language model llama.cpp can run."""
    name = Path(info.path).name
    if info.kind == "mmproj":
        raise ModelFileError(f"{name} is a vision projector (mmproj), not a language model; choose the main "
                             "model file.")
    if info.kind == "lora":
        raise ModelFileError(f"{name} is a LoRA adapter, not a model; choose the base model file.")
    ensure_complete(info)
    if info.n_layer <= 0 or info.tensor_bytes <= 0:
        raise ModelFileError(f"{name} has no layers or no tensor data; it is not a usable model.")


def check_model_file(path: str | Path, role: str = "target") -> GGUFInfo:
    """The header of a model file that llama.cpp may be given, or a ModelFileError saying in one sentence
    why not (``role``, "target" or "drafter", names the file's job in the message)."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"The {role} model {p} does not exist (moved or deleted?). Choose it again.")
    if p.is_dir():
        raise ModelFileError(f"The {role} model {p} is a folder; choose a .gguf file inside it.")
    if not p.is_file():
        raise ModelFileError(f"The {role} model {p} is not a regular file (a pipe or device?); choose a .gguf "
                             "file.")
    try:
        info = read_gguf_info(p)
    except GGUFError as exc:
        raise ModelFileError(f"The {role} model {p.name} cannot be used: {exc}") from exc
    try:
        ensure_model(info)
    except MissingShardError as exc:  # one kind for every refusal a user sees, as for the reader's errors
        raise ModelFileError(str(exc)) from exc
    head = DRAFTER_HEADS.get(info.architecture)
    if head and role == "target":
        raise ModelFileError(f"{p.name} is an {head}, not a chat model; choose it as the drafter of its target.")
    if head:
        refusal = head_file_refusal(info)  # what llama.cpp's loader would refuse without saying why
        if refusal:
            raise ModelFileError(refusal)
    return info
