"""The engine's fixed choices that every layer reads: the KV cache types it offers and the deepest draft it makes.

They live here, below every package, so that the settings check and llama.cpp's context (engine), the roofline
and the live metrics (ceiling), the settings file (storage) and the window all read one list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheType:
    """A KV cache element type as llama.cpp stores it (ggml.h's ``ggml_type``, ``ggml_type_size``)."""

    ggml_type: int
    block: int  # values per block: 1 for a float type, 32 for the quantized ones offered here
    block_bytes: int

    @property
    def quantized(self) -> bool:
        """llama.cpp refuses a quantized V cache without flash attention."""
        return self.block > 1

    def row_bytes(self, n_elements: int) -> int:
        """Bytes of one cache row of n_elements values (ggml_row_size)."""
        return math.ceil(n_elements / self.block) * self.block_bytes


# The KV cache types SpecDeck offers, in the order the window lists them.
KV_CACHE_TYPES: dict[str, KVCacheType] = {
    "f16": KVCacheType(ggml_type=1, block=1, block_bytes=2),
    "q8_0": KVCacheType(ggml_type=8, block=32, block_bytes=34),
    "q4_0": KVCacheType(ggml_type=2, block=32, block_bytes=18),
    "f32": KVCacheType(ggml_type=0, block=1, block_bytes=4),
    "bf16": KVCacheType(ggml_type=30, block=1, block_bytes=2),
}
KV_TYPES = tuple(KV_CACHE_TYPES)


def kv_cache_type(name: str) -> KVCacheType:
    """The type named; ValueError naming the known ones for any other name."""
    found = KV_CACHE_TYPES.get(name)
    if found is None:
        raise ValueError(f"unknown KV cache type {name!r}; known: {', '.join(KV_TYPES)}")
    return found


def kv_quantized(name: str) -> bool:
    return kv_cache_type(name).quantized


# The deepest draft any setting may ask for (a fixed k and the adaptive policy's cap); the live per-position
# statistics are this wide.
DEPTH_CAP = 32
