"""Trained drafter heads offered for a target, from GGUF headers alone: the target's own MTP heads, and EAGLE-3
and DFlash/DSpark files, each with the reason (one sentence) where it cannot draft for that target.

The engine checks the same facts again on the loaded models (``check_eagle3_pairing``, ``check_dflash_pairing``),
because llama.cpp aborts on most misfits; this module lets the picker list them without loading anything. What
llama.cpp's loader requires of a head's own file (``head_file_refusal``: its target-layer and width keys, of the
types it reads them as, a mask token for DFlash, an ``fc`` of the matching shape) is checked here too, once, for the
picker, ``specdeck models`` and the load (``check_model_file``) alike: llama.cpp refuses such a file unexplained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.library.compat import VocabInfo, check_compatible
from app.library.gguf_format import GGUFError, Header, read_header, type_name
from app.library.gguf_reader import MAX_LAYERS, GGUFInfo

# Architectures that only draft for another model (they read its hidden states and borrow its embeddings).
DRAFTER_HEADS = {"eagle3": "EAGLE-3 drafter", "dflash": "DFlash drafter"}

OWN_MTP_HEADS = "the model's own MTP heads"
# Target architectures whose graph records every layer's input (t_layer_inp, src/models/*.cpp): elsewhere
# llama.cpp aborts when an EAGLE-3 or DFlash drafter asks for one.
LAYER_INPUT_ARCHS = frozenset(("llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "lfm2", "gpt-oss",
                               "nemotron_h"))

# Architectures whose MTP graph the vendored llama.cpp runs with a single block (src/models/*.cpp, graph_mtp),
# all driven alike: an MTP context reading (token, h_nextn row) pairs, its own h_nextn the next step's row.
# Each graph (Qwen3.5, GLM-4.5's glm4moe, deepseek2 with MLA as GLM-4.7-Flash ships) asserts one block: a file
# claiming more would abort the process, so it is refused first. Not here: nemotron_h, whose loader reads the
# NextN tensors but whose graph has no MTP variant (only nemotron_h_moe's has); deepseek2 without MLA, whose
# MTP graph asserts MLA (mtp_refusal reads it from the header).
MTP_ARCHS = frozenset(("qwen35", "qwen35moe", "qwen3next", "glm4moe", "deepseek2"))
MAX_MTP_BLOCKS = 1

# What llama.cpp's EAGLE-3 and DFlash loaders read from a head's header (src/llama-model.cpp): the target layer ids
# as an int32 or uint32 array (EAGLE-3: exactly three), EAGLE-3's target width and the mask token id as uint32s.
EAGLE3_ARCH, DFLASH_ARCH = "eagle3", "dflash"
EAGLE3_LAYERS = 3
_U32, _I32 = 4, 5  # GGUF value types
MASK_TOKEN_KEY = "tokenizer.ggml.mask_token_id"
FC_TENSOR = "fc.weight"


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
    if info.architecture in _MOE_MTP_ARCHS:
        return _moe_mtp_refusal(info, name)
    return None


_MOE_MTP_ARCHS = frozenset(("glm4moe", "deepseek2"))


def _moe_mtp_refusal(info: GGUFInfo, name: str) -> str | None:
    """What the glm4moe and deepseek2 MTP graphs assert of the header (src/models/glm4-moe.cpp, deepseek2.cpp),
    where a miss aborts the process: a MoE MTP block; for deepseek2 MLA with a query LoRA and no attention
    temperature."""
    arch = info.architecture
    try:
        header, _ = read_header(Path(info.path), collect_tokens=False)
    except GGUFError as exc:
        return f"{name}'s MTP heads cannot draft: {str(exc).rstrip('.')}."

    def num(key: str) -> float:
        value = header.kv.get(f"{arch}.{key}", 0)
        return float(value) if isinstance(value, (int, float)) else 0.0

    if num("leading_dense_block_count") > info.n_layer - info.mtp_layers:
        return f"{name}'s MTP block has a dense FFN, but llama.cpp's {arch} MTP graph runs only a MoE one."
    if arch == "glm4moe":
        if info.head_dim_k != info.head_dim_v:
            return (f"{name}'s key and value heads differ in width ({info.head_dim_k} and {info.head_dim_v}), "
                    "which llama.cpp's glm4moe MTP graph does not run.")
        return None
    if not num("attention.key_length_mla") or not num("attention.value_length_mla"):
        return (f"{name} stores its attention without MLA (no {arch}.attention.key_length_mla), but llama.cpp's "
                f"{arch} MTP graph runs only MLA.")
    if not num("attention.q_lora_rank"):
        return (f"{name} has no query LoRA ({arch}.attention.q_lora_rank, as in DeepSeek-V2-Lite), which "
                f"llama.cpp's {arch} MTP graph requires.")
    if num("attention.temperature_scale"):
        return f"{name} scales its attention temperature, which llama.cpp's {arch} MTP graph does not run."
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


def _u32(header: Header, key: str, d_name: str, why: str) -> tuple[int | None, str | None]:
    """(the value of a uint32 key llama.cpp requires, None) or (None, why the file cannot draft without it)."""
    if key not in header.kv and key not in header.arrays:
        return None, f"{d_name} cannot draft: it has no {key} key ({why}), without which llama.cpp cannot load it."
    value = header.kv.get(key)
    vtype = header.kv_types.get(key, -1)
    if vtype != _U32 or isinstance(value, bool) or not isinstance(value, int):
        shown = f"stored as {type_name(vtype)}" if key in header.kv else "an array"
        return None, f"{d_name} cannot draft: its {key} is {shown}, but llama.cpp reads it only as a uint32."
    return value, None


def _head_keys(header: Header, head: GGUFInfo) -> tuple[list[int], str | None]:
    """(the target layer ids, why llama.cpp would refuse to load the head's file or None)."""
    d_name, arch = Path(head.path).name, head.architecture
    key = f"{arch}.target_layers"
    arr = header.arrays.get(key)
    if arr is None:
        kind = "a single value, not an array" if key in header.kv else "missing"
        return [], (f"{d_name} cannot draft: its {key} key (the target layers it reads) is {kind}, so llama.cpp "
                    "cannot load it.")
    if arr.elem_type not in (_U32, _I32):
        return [], (f"{d_name} cannot draft: its {key} is an array of {type_name(arr.elem_type)}, but llama.cpp "
                    "reads layer ids only as int32 or uint32.")
    if arch == EAGLE3_ARCH and arr.count != EAGLE3_LAYERS:
        return [], (f"{d_name} cannot draft: its {key} lists {arr.count:,} layers, but llama.cpp's EAGLE-3 reads "
                    f"exactly {EAGLE3_LAYERS}.")
    if not arr.count or arr.count > MAX_LAYERS:
        return [], (f"{d_name} cannot draft: its {key} lists {arr.count:,} layers, where a model has 1 to "
                    f"{MAX_LAYERS}.")
    if arr.values is None:  # the header's other arrays used up the numbers read from one file
        return [], f"{d_name} cannot draft: its {key} lies past the numbers SpecDeck reads from one header."
    ids = [int(v) for v in arr.values]
    hidden = head.n_embd
    if arch == EAGLE3_ARCH:
        value, refusal = _u32(header, f"{arch}.target_hidden_size", d_name, "the width of the target it reads")
        if refusal:
            return ids, refusal
        assert value is not None
        hidden = value
    if arch == DFLASH_ARCH:
        mask, refusal = _u32(header, MASK_TOKEN_KEY, d_name, "the mask token its blocks are made of")
        if refusal:
            return ids, refusal
        assert mask is not None
        if head.n_vocab and mask >= head.n_vocab:
            return ids, (f"{d_name} cannot draft: its mask token {mask:,} is outside its vocabulary of "
                         f"{head.n_vocab:,} tokens.")
    fc = next((dims for name, dims, _, _ in header.tensors if name == FC_TENSOR), None)
    want = (len(ids) * hidden, head.n_embd)
    if hidden > 0 and head.n_embd > 0 and fc != want:
        has = "tensor is missing" if fc is None else f"is {' × '.join(map(str, fc))}"
        layers = f"{len(ids)} target layer{'s' if len(ids) != 1 else ''}"
        return ids, (f"{d_name} cannot draft: its {FC_TENSOR} {has}, where its {layers} of width {hidden} call for "
                     f"{want[0]} × {want[1]}.")
    return ids, None


def _read_head(head: GGUFInfo) -> tuple[list[int], str | None]:
    try:
        header, _ = read_header(Path(head.path), collect_tokens=False)
    except GGUFError as exc:  # changed or removed since the library read it
        return [], f"{Path(head.path).name} cannot draft: {str(exc).rstrip('.')}."
    return _head_keys(header, head)


def target_layers(head: GGUFInfo) -> list[int]:
    """The target layers a head reads (``{arch}.target_layers``), from its header."""
    return _read_head(head)[0]


def head_file_refusal(head: GGUFInfo) -> str | None:
    """Why llama.cpp would refuse to load this EAGLE-3 or DFlash file whatever its target, in one sentence (a key it
    requires missing, of another type or out of range; an ``fc`` that does not match); None where it loads."""
    if head.architecture not in DRAFTER_HEADS:
        return None
    return _read_head(head)[1]


def head_refusal(target: GGUFInfo, head: GGUFInfo) -> str | None:
    """Why ``head`` (an EAGLE-3 or DFlash file) cannot draft for ``target``, in one sentence; None where it can:
    first what its own file lacks (``head_file_refusal``), then how it pairs with the target."""
    d_name, t_name = Path(head.path).name, Path(target.path).name
    kind = DRAFTER_HEADS.get(head.architecture, head.architecture)
    ids, broken = _read_head(head)
    if broken:
        return broken
    if target.architecture not in LAYER_INPUT_ARCHS:
        return (f"{d_name} is an {kind}, and llama.cpp reads the layer inputs it needs only from "
                f"{', '.join(sorted(LAYER_INPUT_ARCHS))} targets, not {target.architecture}.")
    hidden = head.metadata.get(f"{head.architecture}.target_hidden_size", head.n_embd)
    if hidden != target.n_embd:
        return f"{d_name} was trained on a target {hidden} wide, but {t_name} is {target.n_embd} wide."
    if head.n_embd != target.n_embd:
        return (f"{d_name} is {head.n_embd} wide and borrows the token embeddings of {t_name}, which is "
                f"{target.n_embd} wide.")
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
