"""The picker's GPU layers: "auto" by default (the engine's own choice, shown before loading), "all", or N."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.ceiling.backend import BackendDevice
from app.library.gguf_reader import GGUFInfo, read_gguf_info
from app.params import ALL_GPU_LAYERS, AUTO_GPU_LAYERS
from tests.setup.test_device_fit import gpu_check_module
from ui.models.load_box import GpuLayersSpin, fit_text

GIB = 1 << 30
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 60 * GIB, 64 * GIB)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    g = gpu_check_module()
    return read_gguf_info(g.write_model(tmp_path_factory.mktemp("big") / "big-8gb.gguf", g.SHAPES["8gb"],
                                        sparse=True))


def test_the_spin_box_reads_and_writes_auto_all_and_counts(qtbot: QtBot) -> None:
    spin = GpuLayersSpin()
    qtbot.addWidget(spin)
    assert (spin.value(), spin.text()) == (AUTO_GPU_LAYERS, "auto")
    spin.setValue(ALL_GPU_LAYERS)
    assert spin.text() == "all"
    spin.setValue(12)
    assert spin.text() == "12"
    assert spin.valueFromText("auto") == AUTO_GPU_LAYERS
    assert spin.valueFromText("All") == ALL_GPU_LAYERS
    assert spin.valueFromText("7") == 7
    spin.lineEdit().selectAll()
    qtbot.keyClicks(spin.lineEdit(), "all")
    spin.interpretText()
    assert spin.value() == ALL_GPU_LAYERS


def test_the_fit_says_what_auto_chooses_on_the_free_memory(big: GGUFInfo) -> None:
    small_gpu = BackendDevice("CUDA0", "NVIDIA RTX", "gpu", "CUDA", 4 * GIB, 24 * GIB)
    text = fit_text(big, None, 4096, "f16", AUTO_GPU_LAYERS, True, [CPU, small_gpu])
    first = text.splitlines()[0]
    assert first.startswith("GPU layers auto: ")
    assert "of 33 on CUDA0 (NVIDIA RTX) with their KV cache, the rest on the CPU" in first
    roomy = BackendDevice("CUDA0", "NVIDIA RTX", "gpu", "CUDA", 20 * GIB, 24 * GIB)
    assert "33 of 33 on CUDA0" in fit_text(big, None, 4096, "f16", AUTO_GPU_LAYERS, True, [CPU, roomy])
    assert "GPU layers auto" not in fit_text(big, None, 4096, "f16", ALL_GPU_LAYERS, True, [CPU, roomy])
