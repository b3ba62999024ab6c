"""A target's own multi-token-prediction (MTP, NextN) heads, from its GGUF alone: whether SpecDeck can draft
with them, and the memory they take (their weights, and the KV cache of the second context that runs them)."""

from __future__ import annotations

from dataclasses import replace

from app.ceiling.roofline import ModelShape, kv_cache_bytes
from app.library.gguf_reader import GGUFInfo

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


def mtp_heads_shape(info: GGUFInfo) -> ModelShape:
    """The target as its MTP context holds it: a KV cache in the MTP blocks only (full attention)."""
    trunk = info.n_layer - info.mtp_layers
    return replace(ModelShape.from_gguf(info), kv_layers=(False,) * trunk + (True,) * info.mtp_layers,
                   sliding_window=0, swa_layers=(), state_bytes=0)


def mtp_kv_bytes(info: GGUFInfo, n_ctx: int, kv_type: str = "f16") -> int:
    """KV bytes llama.cpp allocates for the MTP context (the whole context, the MTP blocks only)."""
    return kv_cache_bytes(mtp_heads_shape(info), n_ctx, kv_type) if info.mtp_layers > 0 else 0


def mtp_weight_bytes(info: GGUFInfo) -> int:
    """Bytes of the MTP blocks' own tensors (blk.{n_layer - mtp_layers}.* on): loaded only with load_mtp."""
    layers = ModelShape.from_gguf(info).layer_bytes
    return sum(layers[info.n_layer - info.mtp_layers :]) if info.mtp_layers > 0 and layers else 0
