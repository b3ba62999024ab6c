"""Choosing one GPU among several: llama.cpp reads main_gpu only with split mode NONE, so a chosen GPU loads
with that mode and that index, and no choice keeps llama.cpp's default (layers spread over its GPUs). The
parameters are checked in llama.cpp's own llama_model_params struct, as the load receives it."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as lc
import pytest

from app.ceiling.backend import BackendDevice
from app.ceiling.device_fit import device_fit_error
from app.ceiling.memory import offload_devices
from app.engine.llama import Model, _check_main_gpu, model_params
from app.errors import EngineLoadError, SettingsError
from app.library.gguf_reader import read_gguf_info
from app.params import LoadSettings
from tests.setup.test_device_fit import gpu_check_module

GIB = 1 << 30
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 60 * GIB, 64 * GIB)
IGPU = BackendDevice("Vulkan0", "AMD Radeon 780M", "igpu", "Vulkan", 8 * GIB, 8 * GIB)
SMALL = BackendDevice("Vulkan1", "AMD Radeon RX 6500 XT", "gpu", "Vulkan", 4 * GIB, 4 * GIB)
BIG = BackendDevice("Vulkan2", "AMD Radeon RX 7900 XTX", "gpu", "Vulkan", 24 * GIB, 24 * GIB)


def test_no_choice_keeps_llama_cpps_default_split() -> None:
    default = lc.llama_model_default_params()
    params = model_params(n_gpu_layers=-1)
    assert params.split_mode == default.split_mode == lc.LLAMA_SPLIT_MODE_LAYER
    assert params.main_gpu == default.main_gpu
    assert params.n_gpu_layers == (-1 if lc.llama_supports_gpu_offload() else 0)


@pytest.mark.parametrize("index", [0, 1, 3])
def test_a_chosen_gpu_loads_alone_with_split_mode_none(index: int) -> None:
    params = model_params(n_gpu_layers=-1, main_gpu=index)
    assert isinstance(params, lc.llama_model_params)
    assert params.split_mode == lc.LLAMA_SPLIT_MODE_NONE
    assert params.main_gpu == index


def test_vocab_only_and_layers_pass_through() -> None:
    params = model_params(n_gpu_layers=7, vocab_only=True)
    assert params.vocab_only
    assert params.n_gpu_layers == (7 if lc.llama_supports_gpu_offload() else 0)


def test_llama_cpp_offloads_to_discrete_gpus_and_to_integrated_ones_only_without_them() -> None:
    assert offload_devices([CPU, IGPU, SMALL, BIG]) == (SMALL, BIG)
    assert offload_devices([CPU, IGPU]) == (IGPU,)
    assert offload_devices([CPU]) == ()


def test_a_gpu_this_build_does_not_have_is_named_in_one_sentence() -> None:
    """On this CPU build llama.cpp has no GPU at all: the index is refused before the load."""
    with pytest.raises(EngineLoadError) as err:
        _check_main_gpu(0)
    assert str(err.value) == "GPU 0 does not exist; llama.cpp's GPUs here are none."


def test_a_model_loads_on_the_cpu_build_with_a_chosen_gpu_and_no_offload(tiny_target: Path) -> None:
    model = Model(tiny_target, n_gpu_layers=0, main_gpu=0)
    try:
        assert model.n_vocab > 0
    finally:
        model.close()


def test_the_load_settings_take_no_choice_or_a_gpu_index() -> None:
    assert LoadSettings("m.gguf").main_gpu is None
    LoadSettings("m.gguf").validate()
    LoadSettings("m.gguf", main_gpu=2).validate()
    with pytest.raises(SettingsError, match="Main GPU"):
        LoadSettings("m.gguf", main_gpu=-1).validate()


def test_the_fit_checks_only_the_chosen_gpu(tmp_path: Path) -> None:
    """A 7.7 GB model (sparse GGUF) fits the 24 GiB card, not the 4 GiB one: choosing decides."""
    g = gpu_check_module()
    info = read_gguf_info(g.write_model(tmp_path / "big-8gb.gguf", g.SHAPES["8gb"], sparse=True))
    devices = [CPU, IGPU, SMALL, BIG]
    assert device_fit_error(info, -1, 4096, devices, main_gpu=1) is None  # BIG: llama.cpp's GPU 1
    refused = device_fit_error(info, -1, 4096, devices, main_gpu=0)  # SMALL alone
    assert refused is not None
    assert "on Vulkan1 (AMD Radeon RX 6500 XT)" in refused
    assert device_fit_error(info, -1, 4096, devices) is None  # both GPUs share the layers
