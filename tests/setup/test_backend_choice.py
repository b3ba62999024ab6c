"""bootstrap.py's backend choice, from recorded `vulkaninfo --summary` and `nvidia-smi -L` outputs and from
this machine's own tools; and its option parsing for builds in other venvs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bootstrap
from bootstrap import AVX2_PORTABLE, Machine, choose_backend

RECORDED = Path(__file__).parent / "vulkaninfo"
LINUX_AVX2 = {"avx", "avx2", "fma", "f16c", "bmi2"}
SMI_H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4c1b6f0e-2a57-8d3e-91f0-5e2b7c9d1a63)\n"


def linux(**kwargs: object) -> Machine:
    return Machine(system="linux", arch="x86_64", cpu_flags=set(LINUX_AVX2), **kwargs)  # type: ignore[arg-type]


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def test_vulkan_summary_is_parsed_per_device() -> None:
    devices = bootstrap.vulkan_devices(recorded("intel-nvidia-llvmpipe.txt"))
    assert devices == [
        ("Intel(R) UHD Graphics 770 (ADL-S GT1)", "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU"),
        ("NVIDIA GeForce RTX 4090", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"),
        ("llvmpipe (LLVM 15.0.6, 256 bits)", "PHYSICAL_DEVICE_TYPE_CPU"),
    ]
    assert bootstrap.vulkan_devices(None) == []
    assert bootstrap.vulkan_devices("garbage\nGPU0:\n\tnothing here\n") == []


def test_only_llvmpipe_chooses_the_cpu_and_says_why() -> None:
    choice = choose_backend(linux(vulkaninfo_summary=recorded("llvmpipe.txt"), has_vulkan_sdk=True))
    assert choice.backend == "cpu"
    assert "-DGGML_VULKAN=ON" not in choice.cmake_args
    assert any("llvmpipe" in f and "not a GPU" in f for f in choice.found)
    assert "run on the CPU" in choice.reason


def test_a_real_vulkan_gpu_with_the_sdk_chooses_vulkan_and_names_the_discrete_one() -> None:
    choice = choose_backend(linux(vulkaninfo_summary=recorded("intel-nvidia-llvmpipe.txt"), has_vulkan_sdk=True))
    assert choice.backend == "vulkan"
    assert "-DGGML_VULKAN=ON" in choice.cmake_args
    assert "NVIDIA GeForce RTX 4090 (discrete GPU)" in choice.reason


def test_a_vulkan_gpu_without_the_sdk_falls_back_to_the_cpu_with_advice() -> None:
    choice = choose_backend(linux(vulkaninfo_summary=recorded("radv.txt"), has_vulkan_sdk=False))
    assert choice.backend == "cpu"
    assert "Vulkan SDK" in choice.reason
    assert any("AMD Radeon RX 7900 XTX" in f for f in choice.found)


def test_nvidia_needs_both_a_gpu_and_nvcc() -> None:
    assert bootstrap.nvidia_gpus(SMI_H100) == ["NVIDIA H100 80GB HBM3"]
    cuda = choose_backend(linux(nvidia_smi_list=SMI_H100, has_nvcc=True))
    assert cuda.backend == "cuda"
    assert "-DGGML_CUDA=ON" in cuda.cmake_args
    assert "NVIDIA H100 80GB HBM3" in cuda.reason
    # nvcc on a machine without an NVIDIA GPU (nvidia-smi missing) only costs build time.
    assert choose_backend(linux(nvidia_smi_list=None, has_nvcc=True)).backend == "cpu"
    no_toolkit = choose_backend(linux(nvidia_smi_list=SMI_H100, has_nvcc=False))
    assert no_toolkit.backend == "cpu"
    assert "nvcc" in no_toolkit.reason


SMI_QUERY_4090 = "8.9, 580.65.06\n"


def test_an_nvidia_gpu_without_nvcc_builds_cuda_with_the_toolkit_from_pypi() -> None:
    cuda = choose_backend(linux(nvidia_smi_list=SMI_H100, nvidia_smi_query=SMI_QUERY_4090, has_nvcc=False))
    assert cuda.backend == "cuda"
    root = bootstrap.pip_cuda_root()
    assert root.parent.name == "nvidia"
    assert root.name == f"cu{bootstrap.CUDA_PIP_MAJOR}"
    assert f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}" in cuda.cmake_args
    assert f"-DCUDAToolkit_ROOT={root}" in cuda.cmake_args
    # Machine code for this machine's GPU only; no libcuda stub in the wheels, so no VMM.
    assert "-DCMAKE_CUDA_ARCHITECTURES=89-real" in cuda.cmake_args
    assert "-DGGML_CUDA_NO_VMM=ON" in cuda.cmake_args
    assert "from PyPI" in cuda.reason
    assert "NVIDIA H100 80GB HBM3" in cuda.reason
    assert bootstrap.pip_toolkit_in(cuda.cmake_args) == root
    assert bootstrap.pip_toolkit_in(["-DGGML_CUDA=ON", "-DCUDAToolkit_ROOT=/usr/local/cuda"]) is None
    # nvcc installed: the system's toolkit, as before.
    assert bootstrap.pip_toolkit_in(choose_backend(linux(nvidia_smi_list=SMI_H100, nvidia_smi_query=SMI_QUERY_4090,
                                                         has_nvcc=True)).cmake_args) is None


def test_the_pypi_toolkit_is_refused_for_old_drivers_and_old_gpus_with_the_reason() -> None:
    assert bootstrap.nvidia_compute_caps("8.6, 550.54.14\n12.0, 580.65\n") == [(86, 550), (120, 580)]
    assert bootstrap.nvidia_compute_caps("[N/A], 580.1\n") == []
    old_driver = choose_backend(linux(nvidia_smi_list=SMI_H100, nvidia_smi_query="9.0, 550.54.14\n"))
    assert old_driver.backend == "cpu"
    assert "driver 550 is older than CUDA 13 needs (580 or newer)" in old_driver.reason
    pascal = choose_backend(linux(nvidia_smi_list="GPU 0: NVIDIA GeForce GTX 1080 (UUID: GPU-1)\n",
                                  nvidia_smi_query="6.1, 580.65.06\n"))
    assert pascal.backend == "cpu"
    assert "compute capability 6.1" in pascal.reason
    unknown = choose_backend(linux(nvidia_smi_list=SMI_H100, nvidia_smi_query=None))
    assert unknown.backend == "cpu"
    assert "compute capability" in unknown.reason
    windows = choose_backend(Machine(system="win32", arch="amd64", nvidia_smi_list=SMI_H100,
                                     nvidia_smi_query=SMI_QUERY_4090))
    assert windows.backend == "cpu"
    assert "only set up on Linux" in windows.reason


def test_two_gpu_generations_get_one_architecture_each_blackwell_its_a_variant() -> None:
    query = "8.6, 580.65\n12.0, 580.65\n8.6, 580.65\n"
    choice = choose_backend(linux(nvidia_smi_list=SMI_H100, nvidia_smi_query=query))
    assert "-DCMAKE_CUDA_ARCHITECTURES=86-real;120a-real" in choice.cmake_args


def test_the_cuda_bundle_and_vulkan_presets_build_loadable_modules() -> None:
    name, flags = bootstrap.build_flags("cuda")
    assert name == ".venv-cuda"
    assert "-DGGML_BACKEND_DL=ON" in flags
    assert "-DGGML_CUDA=ON" in flags
    assert f"-DCMAKE_CUDA_ARCHITECTURES={bootstrap.CUDA_BUNDLE_ARCHS}" in flags
    assert bootstrap.pip_toolkit_in(flags) == bootstrap.pip_cuda_root()
    name, flags = bootstrap.build_flags("portable-vulkan")
    assert name == ".venv-portable-vulkan"
    assert flags[:len(bootstrap.ANY_X86_64)] == bootstrap.ANY_X86_64
    assert "-DGGML_VULKAN=ON" in flags
    # The default setup is untouched: no GPU, no module build.
    assert "-DGGML_BACKEND_DL=ON" not in choose_backend(linux()).cmake_args


def test_a_pypi_toolkit_gets_the_layout_cmake_and_nvcc_expect(tmp_path: Path) -> None:
    root = tmp_path / "nvidia" / "cu13"
    assert "bin/nvcc" in bootstrap.toolkit_problems(root)
    (root / "lib").mkdir(parents=True)
    (root / "include").mkdir()
    for name in bootstrap.CUDA_RUNTIME_LIBS:
        (root / "lib" / name).write_bytes(b"")
    bootstrap.arrange_pip_toolkit(root)
    bootstrap.arrange_pip_toolkit(root)  # a second run changes nothing
    assert (root / "lib" / "libcudart.so").resolve() == (root / "lib" / "libcudart.so.13").resolve()
    assert (root / "lib" / "libcublasLt.so").resolve() == (root / "lib" / "libcublasLt.so.13").resolve()
    assert (root / "lib64").resolve() == (root / "lib").resolve()
    assert (root / "targets" / "x86_64-linux" / "include").resolve() == (root / "include").resolve()


@pytest.mark.process
def test_the_installed_pypi_toolkit_compiles_cuda(tmp_path: Path) -> None:
    """The toolkit bootstrap installs from PyPI (python3 bootstrap.py --build cuda) is a complete compiler: its
    nvcc (with cicc and the runtime and crt headers of the other wheels) turns a kernel into PTX. Needs no GPU."""
    root = bootstrap.pip_cuda_root()
    if bootstrap.toolkit_problems(root):
        pytest.skip(f"the CUDA toolkit from PyPI is not installed in {root.parent.parent}")
    nvcc = str(root / "bin" / "nvcc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    assert f"release {bootstrap.CUDA_PIP_MAJOR}." in version.stdout
    kernel = tmp_path / "add.cu"
    kernel.write_text("#include <cuda_fp16.h>\n"
                      "__global__ void add(half *x) { x[threadIdx.x] = __hadd(x[threadIdx.x], x[0]); }\n")
    ptx = tmp_path / "add.ptx"
    done = subprocess.run([nvcc, "-arch=compute_75", "--ptx", "-o", str(ptx), str(kernel)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert ".target sm_75" in ptx.read_text()


def test_metal_only_on_apple_silicon() -> None:
    arm = choose_backend(Machine(system="darwin", arch="arm64"))
    assert arm.backend == "metal"
    assert "-DGGML_METAL=ON" in arm.cmake_args
    intel = choose_backend(Machine(system="darwin", arch="x86_64"))
    assert intel.backend == "cpu"
    assert intel.cmake_args == AVX2_PORTABLE


def test_the_override_wins() -> None:
    choice = choose_backend(linux(nvidia_smi_list=SMI_H100, has_nvcc=True), "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    assert choice.backend == "custom"
    assert choice.cmake_args == ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON"]


def test_this_machine_with_only_software_vulkan_devices_chooses_no_vulkan() -> None:
    machine = Machine.probe()
    devices = bootstrap.vulkan_devices(machine.vulkaninfo_summary)
    if not devices:
        pytest.skip("vulkaninfo is not installed here, or lists no device")
    if any(kind in bootstrap.VULKAN_GPU_TYPES for _, kind in devices):
        pytest.skip(f"this machine has a real Vulkan GPU: {devices}")
    assert choose_backend(machine).backend != "vulkan"


def test_setup_says_what_it_found_and_chose(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECDECK_CMAKE_ARGS", raising=False)
    backend, _ = bootstrap.choose_cmake_args()
    out = capsys.readouterr().out
    assert "[specdeck setup] found: " in out
    assert f"chose the {backend} backend" in out


def test_build_presets_and_flag_strings_get_their_own_venvs() -> None:
    name, flags = bootstrap.build_flags("avx2")
    assert name == ".venv-avx2"
    assert flags == AVX2_PORTABLE
    assert "-DGGML_BMI2=OFF" in flags
    assert "-DGGML_AVX512=OFF" in flags
    name2, flags2 = bootstrap.build_flags("-DGGML_NATIVE=OFF  -DGGML_AVX2=ON")
    assert name2.startswith(".venv-build-")
    assert flags2 == ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON"]
    opts = bootstrap.parse_args(["test", "--build", "avx2", "--cached-only", "tests/setup", "-q"])
    assert (opts.command, opts.build, opts.cached_only, opts.rest) == ("test", "avx2", True, ["tests/setup", "-q"])
    setup = bootstrap.parse_args(["--build", "portable", "--no-launch"])
    assert (setup.command, setup.build, setup.no_launch) == ("setup", "portable", True)
    assert "-DGGML_CPU_ALL_VARIANTS=ON" in bootstrap.build_flags("portable")[1]


@pytest.mark.process
def test_cached_only_skips_an_uncached_build_without_compiling(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, str(Path(bootstrap.__file__)), "test", "--build", "-DGGML_NATIVE=OFF -DGGML_SSE42=ON",
         "--venv", str(tmp_path / "venv"), "--cached-only"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "is not cached; skipped" in out.stdout
    assert not (tmp_path / "venv").exists()
    assert not (tmp_path / "specdeck" / "wheels").exists()


@pytest.mark.process
def test_bad_build_value_is_one_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(Path(bootstrap.__file__)), "test", "--build", "fast"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "--build takes CMake flags" in out.stderr
    assert "Traceback" not in out.stderr


# llama_print_system_info() of the default build on an AVX2 + BMI2 machine (AMD EPYC, Debian 12).
SYSTEM_INFO_AVX2_BMI2 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
                         "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")


def test_an_installed_build_is_checked_against_its_flags() -> None:
    native = bootstrap.x86_cpu_cmake(LINUX_AVX2)
    assert bootstrap.build_mismatches(native, SYSTEM_INFO_AVX2_BMI2) == []
    # The portable flag set turns BMI2 off: a build that still has it is some other build.
    assert bootstrap.build_mismatches(AVX2_PORTABLE, SYSTEM_INFO_AVX2_BMI2) == ["-DGGML_BMI2=OFF"]
    assert bootstrap.build_mismatches(["-DGGML_BACKEND_DL=ON", "-DGGML_AVX512=ON"], SYSTEM_INFO_AVX2_BMI2) == []


def test_this_venv_runs_the_build_its_flags_describe() -> None:
    import llama_cpp

    marker = Path(sys.prefix) / "specdeck-llama-wheel.txt"
    if not marker.exists():
        pytest.skip("this venv was not set up by bootstrap.py")
    wheel = Path(marker.read_text().split()[0])
    flags = next((f for f in (bootstrap.build_flags(p)[1] for p in bootstrap.BUILD_PRESETS)
                  if bootstrap.wheel_cache_dir(f) == wheel.parent), None)
    flags = flags or bootstrap.x86_cpu_cmake(bootstrap.cpu_flags())
    if bootstrap.wheel_cache_dir(flags) != wheel.parent:
        pytest.skip("this venv's build used flags from SPECDECK_CMAKE_ARGS that are not known here")
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    assert bootstrap.build_mismatches(flags, info) == []


def test_only_a_trapping_build_is_dropped_from_the_cache() -> None:
    assert bootstrap.trapped("decode check failed: the engine stopped with SIGILL (Illegal instruction)")
    assert bootstrap.trapped("this llama.cpp build uses CPU instructions this machine cannot run; rebuild")
    # A timeout on a busy machine, or no model: the 10-minute build stays cached.
    assert not bootstrap.trapped("decode check failed: no answer within 300 s")
    assert not bootstrap.trapped("no model to check: pass --model PATH")
