#!/usr/bin/env python3
"""Write an F16 copy of a quantized GGUF: a target whose own quantized file drafts for it.

Every quantized tensor is dequantized (``gguf.quants.dequantize``) and stored as F16 (1-D tensors, the
norms, as F32); all metadata is copied, with ``general.file_type`` set to F16. The pair (F16 target, its
quantized original as drafter) shares the vocabulary and agrees on nearly every greedy token, while a
drafter step costs a fraction of a target pass: the arithmetic that lets a model drafter pay on a CPU.

    .venv/bin/python benchmarks/f16_target.py SOURCE.gguf OUT.gguf

Uses gguf-py (the dev extra), which trusts its input: run it on the demo models, not on downloads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

FILE_TYPE_F16 = 1  # llama_ftype LLAMA_FTYPE_MOSTLY_F16


def convert(source: Path, out: Path) -> None:
    reader = GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the header fields the writer writes itself
        if field.name == "general.file_type":
            writer.add_uint32(field.name, FILE_TYPE_F16)
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), kind)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))  # numpy order: the innermost dimension last
        if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = np.asarray(tensor.data).reshape(shape)
        else:
            data = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        # Cast explicitly: an F64 tensor would load and then abort llama.cpp at the first decode.
        data = data.astype(np.float32 if len(shape) == 1 else np.float16)
        writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {sys.argv[2]} ({Path(sys.argv[2]).stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
