"""Where llama.cpp puts a model's weights, from its GGUF tensor table: the input layer (token embeddings),
which llama.cpp keeps in host memory whatever is offloaded; each repeating layer; and the output layer.

Read once per file version (path, size, modification time); a file that cannot be read gives None, and the
roofline then spreads the weights evenly over the layers.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from app.library.gguf_format import GGUFError, read_header, tensor_nbytes
from app.library.gguf_reader import GGUFInfo

# llama.cpp's LLM_TENSOR_LAYER_INPUT tensors, by their GGUF names (llama-arch.cpp).
INPUT_TENSORS = frozenset(("token_embd.weight", "position_embd.weight", "token_types.weight",
                           "per_layer_token_embd.weight"))
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorSplit:
    input_bytes: int
    output_bytes: int  # the output layer's own tensors and any other tensor outside the layers
    layer_bytes: tuple[int, ...]
    tied_output_bytes: int  # no output.weight: the output layer gets a copy of the token embeddings


def tensor_split(info: GGUFInfo) -> TensorSplit | None:
    """The bytes per place of a single-file model, or None (a split model, or a file that cannot be read)."""
    if info.split_count > 1 or info.n_layer <= 0:
        return None
    try:
        st = os.stat(info.path)
    except OSError:
        return None
    return _split(info.path, st.st_size, st.st_mtime_ns, info.n_layer)


@functools.lru_cache(maxsize=32)
def _split(path: str, _size: int, _mtime_ns: int, n_layer: int) -> TensorSplit | None:
    try:
        header, _ = read_header(Path(path), collect_tokens=False)
    except (GGUFError, OSError):
        return None
    layers = [0] * n_layer
    input_bytes = output_bytes = embeddings = 0
    has_output = False
    for name, dims, ggml_type, _offset in header.tensors:
        nbytes = tensor_nbytes(dims, ggml_type)
        layer = _LAYER.match(name)
        if layer and int(layer.group(1)) < n_layer:
            layers[int(layer.group(1))] += nbytes
        elif name in INPUT_TENSORS:
            input_bytes += nbytes
            if name == "token_embd.weight":
                embeddings = nbytes
        else:
            output_bytes += nbytes
            has_output = has_output or name == "output.weight"
    return TensorSplit(input_bytes, output_bytes, tuple(layers), 0 if has_output else embeddings)
