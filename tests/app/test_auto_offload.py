"""--gpu-layers auto: the most layers that fit in each GPU's free memory, the rest on the CPU, said in one line;
an explicit count that does not fit is refused naming the one that does; a load too large for the RAM too is
refused with the sizes. The devices are llama.cpp's device list as data (free and total memory as it reports
them), the model a real GGUF (a sparse 7.7 GB file, and a tiny one loaded for real on the CPU)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.ceiling.backend import BackendDevice, probe_backend
from app.ceiling.device_fit import choose_gpu_layers, load_gpu_layers
from app.ceiling.memory import offload_devices
from app.engine.session import EngineSession
from app.errors import SettingsError
from app.library.gguf_reader import GGUFInfo, read_gguf_info
from app.params import ALL_GPU_LAYERS, AUTO_GPU_LAYERS, DraftSettings, LoadSettings
from tests.setup.test_device_fit import gpu_check_module

GIB = 1 << 30
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 60 * GIB, 64 * GIB)


def gpu(name: str, free_gib: float, total_gib: float = 24) -> BackendDevice:
    return BackendDevice(name, "NVIDIA RTX", "gpu", "CUDA", int(free_gib * GIB), int(total_gib * GIB))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    """32 layers, 7.7 GB of Q8_0 weights (a sparse file: almost no disk)."""
    g = gpu_check_module()
    return read_gguf_info(g.write_model(tmp_path_factory.mktemp("big") / "big-8gb.gguf", g.SHAPES["8gb"],
                                        sparse=True))


def test_auto_is_the_default_and_a_value_of_its_own() -> None:
    assert LoadSettings("m.gguf").n_gpu_layers == AUTO_GPU_LAYERS
    LoadSettings("m.gguf").validate()
    LoadSettings("m.gguf", n_gpu_layers=ALL_GPU_LAYERS).validate()
    with pytest.raises(SettingsError) as err:
        LoadSettings("m.gguf", n_gpu_layers=-3).validate()
    assert str(err.value) == "GPU layers must be auto, all or a number from 0 to 10000, not -3."


def test_auto_puts_everything_on_a_gpu_it_fits_in(big: GGUFInfo) -> None:
    chosen = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 20)])
    assert chosen.error is None
    assert chosen.n_gpu_layers == ALL_GPU_LAYERS
    assert chosen.note.startswith("GPU layers auto: 33 of 33 on CUDA0 (NVIDIA RTX) with their KV cache; ")
    assert chosen.note.endswith(" left on CUDA0")


def test_auto_counts_free_memory_not_the_total(big: GGUFInfo) -> None:
    """The same 24 GB card with 4 GB free (a game or another model on it) takes only part of the model."""
    chosen = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 4)])
    assert 0 < chosen.n_gpu_layers < 33
    assert f"{chosen.n_gpu_layers} of 33 on CUDA0 (NVIDIA RTX) with their KV cache, the rest on the CPU" \
        in chosen.note
    assert "\n" not in chosen.note
    # The most that fit: one more layer would not leave the headroom.
    more = choose_gpu_layers(big, chosen.n_gpu_layers + 1, 4096, [CPU, gpu("CUDA0", 4)])
    fewer = choose_gpu_layers(big, chosen.n_gpu_layers, 4096, [CPU, gpu("CUDA0", 4)])
    assert fewer.error is None
    assert more.error is None or f"--gpu-layers {chosen.n_gpu_layers}" in more.error


def test_a_longer_context_leaves_room_for_fewer_layers(big: GGUFInfo) -> None:
    short = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 4)]).n_gpu_layers
    long = choose_gpu_layers(big, AUTO_GPU_LAYERS, 32768, [CPU, gpu("CUDA0", 4)]).n_gpu_layers
    assert 0 <= long < short


def test_a_drafter_takes_its_room_first(big: GGUFInfo) -> None:
    alone = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 4)])
    paired = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 4)], drafter=big)
    assert paired.drafter_gpu_layers == ALL_GPU_LAYERS or paired.n_gpu_layers == 0
    assert paired.n_gpu_layers < alone.n_gpu_layers


def test_two_gpus_share_the_layers_by_free_memory(big: GGUFInfo) -> None:
    one = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 3)]).n_gpu_layers
    both = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 3), gpu("CUDA1", 3)])
    assert both.n_gpu_layers > one
    assert "on CUDA0 (NVIDIA RTX) and CUDA1 (NVIDIA RTX)" in both.note
    assert "left on CUDA0" in both.note
    assert "left on CUDA1" in both.note
    # main_gpu: the one chosen alone.
    alone = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 3), gpu("CUDA1", 20)], main_gpu=1)
    assert alone.n_gpu_layers == ALL_GPU_LAYERS
    assert "CUDA0" not in alone.note


def test_a_gpu_index_llama_cpp_lacks_is_left_to_the_load_to_name(big: GGUFInfo) -> None:
    """Not a silent fall back to the CPU: all layers are asked, and the load refuses the index."""
    chosen = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 20)], main_gpu=3)
    assert (chosen.n_gpu_layers, chosen.error) == (ALL_GPU_LAYERS, None)


def test_a_full_gpu_means_the_cpu_and_says_so(big: GGUFInfo) -> None:
    chosen = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 0.1)])
    assert (chosen.n_gpu_layers, chosen.drafter_gpu_layers, chosen.error) == (0, 0, None)
    assert chosen.note == "GPU layers auto: none fit (107 MB free on CUDA0), so the model runs on the CPU"


def test_no_gpu_means_the_cpu_and_nothing_to_say(big: GGUFInfo) -> None:
    assert choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU]) == choose_gpu_layers(big, 0, 4096, [CPU])
    chosen = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU])
    assert (chosen.n_gpu_layers, chosen.note, chosen.error) == (0, "", None)


def test_an_explicit_count_that_does_not_fit_names_the_one_that_does(big: GGUFInfo) -> None:
    auto = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 4)])
    refused = choose_gpu_layers(big, ALL_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 4)])
    assert refused.error is not None
    assert refused.error.startswith("big-8gb.gguf needs 7.56 GB of weights on CUDA0 (NVIDIA RTX) and ")
    assert "which has 4.29 GB free of 25.8 GB of memory in all" in refused.error
    assert refused.error.endswith(f"choose at most {auto.n_gpu_layers} GPU layers (--gpu-layers "
                                  f"{auto.n_gpu_layers}) or --gpu-layers auto.")
    none = choose_gpu_layers(big, 20, 4096, [CPU, gpu("CUDA0", 0.1)])
    assert none.error is not None
    assert none.error.endswith("choose --gpu-layers 0 (no GPU layers, the CPU alone) or a smaller model.")


def test_a_model_too_large_for_the_ram_as_well_is_refused_with_the_sizes(big: GGUFInfo) -> None:
    chosen = choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 2)], ram_free=2 * GIB)
    assert chosen.error is not None
    assert chosen.error.startswith("big-8gb.gguf needs ")
    assert " of system memory (" in chosen.error
    assert "and 2.15 GB is available" in chosen.error
    assert "\n" not in chosen.error
    assert choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU], ram_free=2 * GIB).error is not None
    # The same model fits once a GPU takes it.
    assert choose_gpu_layers(big, AUTO_GPU_LAYERS, 4096, [CPU, gpu("CUDA0", 20)], ram_free=2 * GIB).error is None


def test_the_load_settings_choose_as_the_session_will(big: GGUFInfo) -> None:
    settings = LoadSettings(big.path, DraftSettings(ngram=3), n_ctx=8192, kv_type="q8_0")
    by_settings = load_gpu_layers(big, settings, [CPU, gpu("CUDA0", 4)])
    by_hand = choose_gpu_layers(big, AUTO_GPU_LAYERS, 8192, [CPU, gpu("CUDA0", 4)], kv_type="q8_0")
    assert by_settings == by_hand
    assert load_gpu_layers(big, replace(settings, kv_type="f16"), [CPU, gpu("CUDA0", 4)]).n_gpu_layers \
        < by_settings.n_gpu_layers  # an f16 cache is twice the size


def test_auto_loads_a_real_model_on_the_cpu(tiny_target: Path) -> None:
    logs: list[str] = []
    session = EngineSession(LoadSettings(str(tiny_target), n_ctx=256, n_batch=64, n_threads=1), log=logs.append)
    try:
        if offload_devices(probe_backend(()).devices):
            assert [line for line in logs if line.startswith("GPU layers auto: ")]
        else:
            assert session.target.n_gpu_layers == 0
            assert session.devices == ()
            assert not [line for line in logs if "GPU" in line]  # nothing alarming on a machine without one
    finally:
        session.close()
