"""A target's own multi-token-prediction (MTP, NextN) heads, from its GGUF alone: the memory they take (their
weights, and the KV cache of the second context that runs them) and the bytes a draft step reads. Whether
SpecDeck can draft with them is the library's answer (``app.library.heads.mtp_refusal``)."""

from __future__ import annotations

from dataclasses import replace

from app.ceiling.roofline import ModelShape, kv_cache_bytes
from app.library.gguf_reader import GGUFInfo


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


def mtp_step_ratio(info: GGUFInfo) -> float:
    """c of one MTP draft step from the bytes it reads: one block and the output layer (which the heads share
    with the target), over the trunk's one-token pass; inf where the header gives no trunk."""
    shape = ModelShape.from_gguf(info)
    heads = mtp_weight_bytes(info)
    trunk = info.tensor_bytes - heads
    if info.mtp_layers <= 0 or trunk <= 0:
        return float("inf")
    return (heads / info.mtp_layers + shape.output_bytes + shape.tied_output_bytes) / trunk
