"""Why a build with a GPU backend runs on the CPU: one line from what the drivers report. The real bundles are
checked by packaging/gpu_check --bundle (the Vulkan module on llvmpipe and without a driver, the CUDA bundle
without an NVIDIA driver); here, the reasoning, the module list and the driver probes on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.ceiling.backend import BackendDevice, BackendInfo, _backend_name, probe_backend
from app.ceiling.gpu_fallback import (
    CudaDriver,
    VulkanDevice,
    cuda_reason,
    cuda_runtime_major,
    gpu_module_files,
    module_load_error,
    vulkan_reason,
    why_no_gpu,
)

ROOT = Path(__file__).resolve().parents[2]
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 20 << 30, 24 << 30)
LLVMPIPE = VulkanDevice("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU")


def test_cuda_reasons_name_what_the_driver_lacks() -> None:
    assert cuda_reason(CudaDriver(loaded=False), 13) == "no NVIDIA driver is installed (libcuda not found)"
    old = cuda_reason(CudaDriver(loaded=True, version=12040, devices=1), 13)
    assert old == "the NVIDIA driver supports CUDA 12.4, this build needs CUDA 13: update the driver"
    assert cuda_reason(CudaDriver(loaded=True, version=13000, init_error="CUDA_ERROR_NO_DEVICE"), 13) == (
        "the NVIDIA driver found no usable GPU (cuInit: CUDA_ERROR_NO_DEVICE)")
    assert cuda_reason(CudaDriver(loaded=True, version=13000), 13) == "the NVIDIA driver lists no GPU"
    assert "lists none of the driver's 2 GPUs" in cuda_reason(CudaDriver(loaded=True, version=13000, devices=2), 13)


def test_vulkan_reasons_name_the_device_or_the_missing_driver() -> None:
    only_cpu = vulkan_reason([LLVMPIPE], None)
    assert only_cpu.startswith("the only Vulkan device, llvmpipe (LLVM 15.0.6, 256 bits) (CPU), runs on the CPU")
    assert vulkan_reason([], "no Vulkan driver is installed (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER)") == (
        "no Vulkan driver is installed (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER)")
    gpu = vulkan_reason([LLVMPIPE, VulkanDevice("AMD Radeon RX 7900 XTX", "discrete GPU")], None)
    assert "AMD Radeon RX 7900 XTX (discrete GPU)" in gpu


def test_gpu_modules_are_told_from_cpu_variants_and_ggml_itself(tmp_path: Path) -> None:
    for name in ("libggml.so", "libggml-base.so", "libggml-cpu-haswell.so", "libggml-cpu.so", "libggml-vulkan.so",
                 "libggml-cuda.so", "libcudart.so.13", "libllama.so"):
        (tmp_path / name).write_bytes(b"")
    assert gpu_module_files(tmp_path) == {"cuda": tmp_path / "libggml-cuda.so",
                                          "vulkan": tmp_path / "libggml-vulkan.so"}
    assert cuda_runtime_major(tmp_path) == 13
    assert gpu_module_files(tmp_path / "missing") == {}


def test_a_module_the_linker_refuses_is_named_with_the_linkers_words(tmp_path: Path) -> None:
    broken = tmp_path / "libggml-vulkan.so"
    broken.write_bytes(b"not an ELF file".ljust(4096, b"."))  # long enough to be read as a header
    error = module_load_error(broken)
    assert error
    assert "ELF" in error
    assert str(tmp_path) not in error
    line = why_no_gpu(tmp_path, ("CPU",), ())
    assert line is not None
    assert line.startswith("Vulkan: its module does not load (")
    assert line.endswith("; llama.cpp runs on the CPU")


def test_a_build_without_a_gpu_backend_needs_no_reason(tmp_path: Path) -> None:
    (tmp_path / "libggml-cpu-haswell.so").write_bytes(b"")
    assert why_no_gpu(tmp_path, ("CPU",), ("libggml-cpu-haswell.so",)) is None


def test_a_linked_in_cuda_backend_without_a_device_asks_this_machines_driver(tmp_path: Path) -> None:
    line = why_no_gpu(tmp_path, ("CPU", "CUDA"), ())
    assert line is not None
    assert line.startswith("CUDA: ")
    assert line.endswith("; llama.cpp runs on the CPU")
    assert line.count("CUDA: ") == 1


def test_a_gpu_backend_without_a_device_is_the_cpu_backend() -> None:
    # A CUDA build lists a CUDA section in its system info even with no GPU: the devices decide.
    assert _backend_name([CPU], ["CPU", "CUDA"], True) == "cpu"
    gpu = BackendDevice("CUDA0", "NVIDIA GeForce RTX 4090", "gpu", "CUDA", 20 << 30, 24 << 30)
    assert _backend_name([CPU, gpu], ["CPU", "CUDA"], True) == "cuda"
    assert _backend_name([], ["CPU", "CUDA"], True) == "cuda"  # no device list at all: the build's sections


@pytest.mark.process
def test_the_vulkan_loader_without_a_driver_says_so() -> None:
    """On this machine, with the loader pointed at no driver file: no device, and a reason, never a crash."""
    code = ("import json; from app.ceiling.gpu_fallback import vulkan_devices as v; d, e = v(); "
            "print(json.dumps([[x.name for x in d], e]))")
    env = {"VK_DRIVER_FILES": "/nonexistent/none.json", "VK_ICD_FILENAMES": "/nonexistent/none.json",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    devices, error = json.loads(out.stdout)
    assert devices == []
    assert error.startswith(("no Vulkan driver is installed", "no Vulkan loader"))


def test_this_build_gives_a_reason_exactly_when_it_has_a_gpu_backend_but_no_gpu() -> None:
    info = probe_backend()
    if info.gpu_devices:
        assert info.gpu_fallback is None
    elif info.gpu_fallback is not None:
        assert info.backend == "cpu"
        assert info.gpu_fallback.endswith("; llama.cpp runs on the CPU")
    else:  # the default build here: no GPU backend at all
        assert not info.gpu_offload or not info.devices


def test_doctor_shows_the_memory_llama_cpp_reports_per_device() -> None:
    from app.cli.doctor import _device_text

    vulkan = BackendDevice(name="Vulkan0", description="llvmpipe (LLVM 15.0.6, 256 bits)", type="gpu",
                           backend="Vulkan", memory_free=3 << 29, memory_total=2 << 30)
    assert _device_text(vulkan) == "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits): 1.61 GB free of 2.15 GB)"
    cpu = BackendDevice(name="CPU", description="AMD EPYC", type="cpu", backend="CPU", memory_free=None,
                        memory_total=None)
    assert _device_text(cpu) == "CPU (AMD EPYC)"


def test_doctor_blames_the_missing_gpu_not_the_build() -> None:
    """A GPU build on a machine without the GPU: the backend line says no GPU was found, and the next line
    says why; "no GPU offload in this build" is for builds without a GPU backend."""
    from app.cli.doctor import backend_lines

    def lines(fallback: str | None) -> list[str]:
        backend = BackendInfo(available=True, llama_cpp="b1", ggml_version="0.9", ggml_commit="abc",
                              llama_cpp_python="0.3.36", backend="cpu", gpu_offload=False, cpu_features=("AVX2",),
                              gpu_fallback=fallback)
        return [line for line in backend_lines(backend) if line.startswith(("backend", "no GPU"))]

    why = "CUDA: no NVIDIA driver is installed (libcuda not found); llama.cpp runs on the CPU"
    assert lines(why) == ["backend      cpu (no GPU found)", f"no GPU       {why}"]
    assert lines(None) == ["backend      cpu (no GPU offload in this build)"]
