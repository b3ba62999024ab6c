"""The engine refuses to put more weights on a GPU than the memory it reports in all, in one sentence."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from app.ceiling.backend import BackendDevice
from app.ceiling.device_fit import device_fit_error
from app.library.gguf_reader import read_gguf_info

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 20 * GIB, 24 * GIB)
# llama.cpp's device as it reports Mesa's llvmpipe (ggml_backend_dev_memory: 2 GiB, all free).
LLVMPIPE = BackendDevice("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", "Vulkan", 2 * GIB, 2 * GIB)


def gpu_check_module() -> ModuleType:
    """packaging/gpu_check.py (its synthetic-model writer), imported by path."""
    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "packaging" / "gpu_check.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """7.7 GB of Q8_0 weights as a sparse file: a real GGUF that takes almost no disk."""
    g = gpu_check_module()
    return g.write_model(tmp_path_factory.mktemp("big") / "big-8gb.gguf", g.SHAPES["8gb"], sparse=True)


def test_weights_beyond_the_device_memory_are_refused_with_the_numbers(big_model: Path) -> None:
    info = read_gguf_info(big_model)
    message = device_fit_error(info, -1, 4096, [CPU, LLVMPIPE])
    assert message is not None
    # 7.70 GB in all, less the token embeddings (0.14 GB), which llama.cpp keeps in host memory.
    assert "big-8gb.gguf needs 7.56 GB of weights on Vulkan0 (llvmpipe" in message
    assert "2.15 GB of memory in all" in message
    assert "GPU layers" in message
    assert message.count(".") >= 1
    assert "\n" not in message


def test_what_fits_or_stays_on_the_cpu_is_not_refused(big_model: Path) -> None:
    info = read_gguf_info(big_model)
    assert device_fit_error(info, 0, 4096, [CPU, LLVMPIPE]) is None  # nothing offloaded
    assert device_fit_error(info, -1, 4096, [CPU]) is None  # no GPU
    assert device_fit_error(info, 4, 4096, [CPU, LLVMPIPE]) is None  # 4 of 32 layers: about 0.9 GB
    big_gpu = BackendDevice("CUDA0", "NVIDIA H200", "gpu", "CUDA", 140 * GIB, 141 * GIB)
    assert device_fit_error(info, -1, 4096, [CPU, big_gpu]) is None
