"""Trained drafter heads offered for a target, from GGUF headers alone: the target's own MTP heads, and EAGLE-3
and DFlash/DSpark files, each with the reason (one sentence) where it cannot draft for that target.

The engine checks the same facts again on the loaded models (``check_eagle3_pairing``, ``check_dflash_pairing``),
because llama.cpp aborts on most misfits; this module lets the picker list them without loading anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.library.compat import VocabInfo, check_compatible
from app.library.gguf_format import read_header
from app.library.gguf_reader import GGUFInfo
from app.library.model_file import DRAFTER_HEADS

OWN_MTP_HEADS = "the model's own MTP heads"
# Target architectures whose graph records every layer's input (t_layer_inp, src/models/*.cpp): elsewhere
# llama.cpp aborts when an EAGLE-3 or DFlash drafter asks for one.
LAYER_INPUT_ARCHS = frozenset(("llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "lfm2", "gpt-oss",
                               "nemotron_h"))

# Architectures whose MTP graph the vendored llama.cpp runs with a single block (src/models/*.cpp, graph_mtp).
# Qwen3.5's graph asserts one block: a file claiming more would abort the process, so it is refused first.
MTP_ARCHS = frozenset(("qwen35", "qwen35moe", "qwen3next"))
MAX_MTP_BLOCKS = 1


def mtp_refusal(info: GGUFInfo) -> str | None:
    """Why this target's MTP heads cannot draft here (one sentence), or None when they can."""
    name = info.name or info.path
    if info.mtp_layers <= 0:
        return f"{name} has no MTP heads ({info.architecture}.nextn_predict_layers is absent or 0)."
    if info.architecture not in MTP_ARCHS:
        return (f"{name} has {info.mtp_layers} MTP heads, but SpecDeck drafts with MTP heads only for "
                f"{', '.join(sorted(MTP_ARCHS))}, not {info.architecture}.")
    if info.mtp_layers > MAX_MTP_BLOCKS:
        return (f"{name} has {info.mtp_layers} MTP heads, but llama.cpp runs the {info.architecture} MTP graph "
                f"with exactly {MAX_MTP_BLOCKS}.")
    return None


@dataclass(frozen=True)
class HeadOffer:
    """A trained head that could draft for the target: ``path`` None is the target's own MTP heads."""

    label: str
    path: str | None
    refusal: str | None  # why it cannot draft for this target; None where it can

    @property
    def fits(self) -> bool:
        return self.refusal is None


def target_layers(head: GGUFInfo) -> list[int]:
    """The target layers a head reads (``{arch}.target_layers``), from its header."""
    header, _ = read_header(Path(head.path), collect_tokens=False)
    arr = header.arrays.get(f"{head.architecture}.target_layers")
    return [int(v) for v in arr.values] if arr is not None and arr.values is not None else []


def head_refusal(target: GGUFInfo, head: GGUFInfo) -> str | None:
    """Why ``head`` (an EAGLE-3 or DFlash file) cannot draft for ``target``, in one sentence; None where it can."""
    d_name, t_name = Path(head.path).name, Path(target.path).name
    kind = DRAFTER_HEADS.get(head.architecture, head.architecture)
    if target.architecture not in LAYER_INPUT_ARCHS:
        return (f"{d_name} is an {kind}, and llama.cpp reads the layer inputs it needs only from "
                f"{', '.join(sorted(LAYER_INPUT_ARCHS))} targets, not {target.architecture}.")
    hidden = head.metadata.get(f"{head.architecture}.target_hidden_size", head.n_embd)
    if hidden != target.n_embd:
        return f"{d_name} was trained on a target {hidden} wide, but {t_name} is {target.n_embd} wide."
    if head.n_embd != target.n_embd:
        return (f"{d_name} is {head.n_embd} wide and borrows the token embeddings of {t_name}, which is "
                f"{target.n_embd} wide.")
    ids = target_layers(head)
    trunk = target.n_layer - target.mtp_layers
    if not ids or any(not 0 <= lid < trunk for lid in ids):
        return f"{d_name} reads target layers {ids}, but {t_name} has layers 0 to {trunk - 1}."
    vocab = check_compatible(VocabInfo.from_gguf(target), VocabInfo.from_gguf(head))
    if not vocab.ok:
        return f"{d_name} cannot draft for {t_name}: {vocab.reason.rstrip('.')}."
    return None


def heads_for(target: GGUFInfo, candidates: Sequence[tuple[str, GGUFInfo]]) -> list[HeadOffer]:
    """The target's own MTP heads (where the file has any), then each EAGLE-3 or DFlash file among
    ``candidates`` (label, header), each with its refusal where it does not fit."""
    offers: list[HeadOffer] = []
    if target.mtp_layers > 0:
        offers.append(HeadOffer(OWN_MTP_HEADS, None, mtp_refusal(target)))
    for label, info in candidates:
        kind = DRAFTER_HEADS.get(info.architecture)
        if kind is not None:
            offers.append(HeadOffer(f"{label} ({kind})", info.path, head_refusal(target, info)))
    return offers
