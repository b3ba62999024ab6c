"""The fit places weights as llama.cpp does: the token embeddings (the input layer) stay in host memory
whatever is offloaded; each layer's own tensors go where the layer runs. Checked against the tensor sizes
of a real tiny GGUF, read with gguf's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.ceiling.fit import fit_estimate
from app.ceiling.roofline import Device, ModelShape
from app.ceiling.tensor_split import tensor_split
from app.library.gguf_reader import read_gguf_info
from tests.gguf_fixtures import save, write_tiny_model

N_LAYER = 4
DEVICES = [Device("cpu", "CPU", "cpu", 1.0), Device("gpu0", "GPU", "gpu", 1.0, free_bytes=1 << 30)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("fit") / "tiny-4.gguf", n_layer=N_LAYER, n_embd=64,
                            n_head=4, n_head_kv=2, n_ff=128)


def sizes(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    return {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}


def weights(path: Path, n_gpu_layers: int) -> dict[str, int]:
    fit = fit_estimate(ModelShape.from_gguf(read_gguf_info(path)), DEVICES, 256, n_gpu_layers=n_gpu_layers)
    return {d.device: d.weights for d in fit.devices}


def test_full_offload_keeps_the_token_embeddings_in_host_memory(model: Path) -> None:
    s = sizes(model)
    placed = weights(model, -1)
    assert placed["gpu0"] == sum(s.values()) - s["token_embd.weight"]
    assert placed["cpu"] == s["token_embd.weight"]


def test_partial_offload_puts_the_last_layer_and_the_output_layer_on_the_gpu(model: Path) -> None:
    s = sizes(model)
    placed = weights(model, 2)  # the output layer and the last repeating layer
    last = sum(n for name, n in s.items() if name.startswith(f"blk.{N_LAYER - 1}."))
    output = s["output.weight"] + s["output_norm.weight"]
    assert placed["gpu0"] == last + output
    assert placed["cpu"] == sum(s.values()) - last - output
    assert placed["cpu"] + placed["gpu0"] == read_gguf_info(model).tensor_bytes


def test_nothing_offloaded_puts_every_weight_on_the_cpu(model: Path) -> None:
    assert weights(model, 0) == {"cpu": read_gguf_info(model).tensor_bytes}


def test_tied_embeddings_are_copied_to_the_output_layer_on_the_gpu(tmp_path: Path) -> None:
    """Without output.weight llama.cpp gives the output layer a copy of the token embeddings, on its
    device; on the CPU the copy shares the mapped file."""
    import numpy as np
    from gguf import GGUFReader, GGUFWriter

    src = write_tiny_model(tmp_path / "untied.gguf", n_layer=2)
    reader = GGUFReader(src)
    tied = tmp_path / "tied.gguf"
    writer = GGUFWriter(tied, "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        if t.name != "output.weight":
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    save(writer)
    s = sizes(tied)
    assert "output.weight" not in s
    placed = weights(tied, -1)
    assert placed["gpu0"] == sum(s.values())  # all but the embeddings, plus their copy
    assert placed["cpu"] == s["token_embd.weight"]
    assert weights(tied, 0) == {"cpu": sum(s.values())}


def test_a_model_whose_tensor_table_cannot_be_read_is_spread_evenly(model: Path) -> None:
    info = read_gguf_info(model)
    gone = info.__class__(**{**info.__dict__, "path": str(model.parent / "missing.gguf")})
    assert tensor_split(gone) is None
    shape = ModelShape.from_gguf(gone)
    assert shape.layer_bytes == ()
    fit = fit_estimate(shape, DEVICES, 256, n_gpu_layers=-1)
    assert {d.device: d.weights for d in fit.devices} == {"gpu0": info.tensor_bytes}
