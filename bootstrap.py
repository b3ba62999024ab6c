#!/usr/bin/env python3
"""Set SpecDeck up on this machine, or run its checks.

    python3 bootstrap.py          # .venv, llama.cpp built for this machine, demo models, then the app
    python3 bootstrap.py test     # ruff, mypy, vulture and the whole test suite
    python3 bootstrap.py test --fast   # the same checks and the tests without a window, process, server, demo
                                       # models or a slow mark (FAST_MARKERS)

    # The suite against another build of llama.cpp, in its own venv (.venv-avx2 here), built once and cached:
    python3 bootstrap.py test --build avx2 [--cached-only] [pytest args]
    python3 bootstrap.py test --build "-DGGML_NATIVE=OFF -DGGML_AVX2=ON ..." [--venv DIR]
    python3 bootstrap.py --build portable --no-launch   # set up .venv-portable only (any x86-64 CPU, for bundles)
    python3 bootstrap.py --build portable-vulkan --no-launch   # the same plus the Vulkan module (packaging/vulkan_sdk
                                                              # first, for its headers)
    python3 bootstrap.py --build cuda --no-launch       # .venv-cuda: the CUDA bundle's build (packaging/gpu_check)

On a machine with an NVIDIA GPU and no nvcc, the CUDA toolkit comes from PyPI (CUDA_PIP_TOOLKIT, into
~/.cache/specdeck/cuda-13-*), and llama.cpp is built for that machine's GPUs with it.

Only the standard library is used here: this runs before anything is installed.
Options:
    --no-launch           set up without opening the window (also SPECDECK_NO_LAUNCH=1)
    --venv DIR            set up, or test with, DIR instead of .venv
    --build FLAGS|PRESET  llama.cpp built with these CMake flags (presets: BUILD_PRESETS, MACHINE_PRESETS) in
                          its own venv
    --cached-only         test --build: skip (exit 0) when that build is not cached yet, never compile (CI)
    --fast                test: leave out the tests marked window, process, server, demo or slow
Environment:
    SPECDECK_CMAKE_ARGS   replaces the CMake flags chosen for llama.cpp (backend and CPU features)
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"  # rebound by --venv
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# Tools, examples and tests of llama.cpp are not needed and double the build time; nor is the multimodal
# library (llama_cpp loads it only for image chats, which SpecDeck does not use).
COMMON_CMAKE = [
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
]


# The portable x86-64 baseline (Haswell, Zen 1 and later): AVX2, FMA and F16C, nothing newer, no BMI2.
AVX2_PORTABLE = [
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
    "-DGGML_BMI2=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
]
# One CPU backend per x86-64 instruction-set level, chosen at run time, as loadable modules beside libllama
# (in llama_cpp/lib): for bundles that run on any x86-64 CPU. ggml installs the modules to its BINDIR (relative
# to the wheel); GGML_BACKEND_DIR would not do, as CMake makes a relative PATH absolute in the build folder,
# where the modules were left behind.
ANY_X86_64 = ["-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON",
              "-DCMAKE_INSTALL_BINDIR=llama_cpp/lib"]
# Named flag sets for `--build NAME`; each gets the venv .venv-NAME. "rpc": llama.cpp's RPC backend (models
# split over `rpc-server` processes on other machines), on the AVX2 baseline that packaging/build_rpc_server
# also builds its server with, so a layer computes the same on either side.
BUILD_PRESETS = {"avx2": AVX2_PORTABLE, "portable": ANY_X86_64, "rpc": [*AVX2_PORTABLE, "-DGGML_RPC=ON"]}

# CUDA from PyPI, for machines with an NVIDIA GPU and no nvcc. CUDA 13.0's wheels hold a whole compiler under
# nvidia/cu13 (nvcc, fatbinary and ptxas in nvidia-cuda-nvcc, cicc in nvidia-nvvm, the crt headers in
# nvidia-cuda-crt); CUDA 12's nvidia-cuda-nvcc-cu12 holds only ptxas and libnvvm, no nvcc. CUDA 13 runs on
# Turing (compute capability 7.5) and newer, with an NVIDIA driver of 580 or newer.
CUDA_PIP_TOOLKIT = [
    "nvidia-cuda-nvcc==13.0.88", "nvidia-nvvm==13.0.88", "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cccl==13.0.85", "nvidia-cublas==13.1.1.3",
]
CUDA_PIP_MAJOR = 13
CUDA_MIN_DRIVER = 580  # the first driver branch of CUDA 13.0
CUDA_MIN_COMPUTE = 75  # CUDA 13 dropped Maxwell, Pascal and Volta
# What libggml-cuda links at run time; copied beside it (its RUNPATH is $ORIGIN) in a venv and in a bundle.
CUDA_RUNTIME_LIBS = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")
# The architectures of the CUDA bundle: PTX for Turing, which the driver compiles for whichever GPU of compute
# capability 7.5 or newer runs it (RTX 20 to 50, A100, H100), kernel by kernel at first use, and caches. Each
# real architecture (86-real for RTX 30, 89-real for RTX 40) would spare that first-use compile on its GPUs
# but costs another pass of nvcc over every kernel: more than a 2-core builder can do in an hour.
CUDA_BUNDLE_ARCHS = "75-virtual"
# No VMM: the pip toolkit has no libcuda stub to link against (ggml then pools memory with cudaMalloc).
# $ORIGIN: libggml-cuda finds the CUDA runtime copied beside it (copy_cuda_runtime), also as a module.
CUDA_COMMON = ["-DGGML_CUDA=ON", "-DGGML_CUDA_NO_VMM=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]


def say(message: str) -> None:
    print(f"[specdeck setup] {message}", flush=True)


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def venv_script(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / (name + (".exe" if os.name == "nt" else ""))


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    say("$ " + " ".join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, env=env)


def cpu_flags() -> set[str]:
    """CPU features that both the processor and the OS support (Linux lists only those it enabled)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def x86_cpu_cmake(flags: set[str]) -> list[str]:
    """Explicit x86 flags from what the CPU and OS report, never a native build.

    A native build can emit AMX instructions on CPUs that report AMX where the OS has not
    granted it, and dies with SIGILL at the first decode; AMX is therefore never enabled.
    """
    args = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    wanted = {
        "GGML_AVX": {"avx"},
        "GGML_AVX2": {"avx2"},
        "GGML_FMA": {"fma"},
        "GGML_F16C": {"f16c"},
        "GGML_BMI2": {"bmi2"},
        "GGML_AVX_VNNI": {"avx_vnni"},
        "GGML_AVX512": {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"},
        "GGML_AVX512_VBMI": {"avx512f", "avx512vbmi"},
        "GGML_AVX512_VNNI": {"avx512f", "avx512_vnni"},
        "GGML_AVX512_BF16": {"avx512f", "avx512_bf16"},
    }
    for option, needs in wanted.items():
        args.append(f"-D{option}={'ON' if needs <= flags else 'OFF'}")
    return args


def _probe(cmd: list[str], timeout: float = 30) -> str | None:
    """A probing tool's stdout, or None when it is missing, fails or hangs."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def nvidia_gpus(smi_list: str | None) -> list[str]:
    """GPU names from `nvidia-smi -L` ("GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-...)")."""
    return [m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.+?)(?: \(UUID:.*\))?$", smi_list or "", re.M)]


# vulkaninfo's device types; llvmpipe and other software rasterizers report CPU.
VULKAN_GPU_TYPES = {
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": "discrete GPU",
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": "integrated GPU",
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": "virtual GPU",
}


def vulkan_devices(summary: str | None) -> list[tuple[str, str]]:
    """(deviceName, deviceType) per device listed by `vulkaninfo --summary`."""
    devices: list[tuple[str, str]] = []
    for block in re.split(r"^GPU\d+:\s*$", summary or "", flags=re.M)[1:]:
        fields = dict(re.findall(r"^\s+(\w+)\s*=\s*(.*?)\s*$", block, flags=re.M))
        if "deviceType" in fields:
            devices.append((fields.get("deviceName", "unnamed device"), fields["deviceType"]))
    return devices


def nvidia_compute_caps(smi_query: str | None) -> list[tuple[int, int]]:
    """(compute capability as 86, driver major as 580) per GPU from `nvidia-smi --query-gpu=compute_cap,
    driver_version --format=csv,noheader` ("8.6, 580.65.06")."""
    caps = []
    for m in re.finditer(r"^\s*(\d+)\.(\d+)\s*,\s*(\d+)[.\d]*\s*$", smi_query or "", re.M):
        caps.append((int(m.group(1)) * 10 + int(m.group(2)), int(m.group(3))))
    return caps


def pip_cuda_toolkit_dir() -> Path:
    """Where the CUDA toolkit from PyPI is unpacked, one folder per pinned set; its root is nvidia/cu13 inside."""
    key = hashlib.sha256("|".join(CUDA_PIP_TOOLKIT).encode()).hexdigest()[:12]
    return cache_base() / f"cuda-{CUDA_PIP_MAJOR}-{key}"


def pip_cuda_root(base: Path | None = None) -> Path:
    return (base or pip_cuda_toolkit_dir()) / "nvidia" / f"cu{CUDA_PIP_MAJOR}"


def toolkit_problems(root: Path) -> list[str]:
    """What a CUDA toolkit at ``root`` lacks for building ggml's CUDA backend (empty: complete)."""
    wanted = ["bin/nvcc", "bin/ptxas", "bin/fatbinary", "nvvm/bin/cicc", "include/cuda_runtime.h",
              "include/crt/host_config.h", "include/cccl/cub/cub.cuh", "include/cublas_v2.h",
              *(f"lib/{name}" for name in CUDA_RUNTIME_LIBS)]
    return [name for name in wanted if not (root / name).exists()]


def arrange_pip_toolkit(root: Path) -> None:
    """Give the wheels' nvidia/cuXX the layout CMake and nvcc expect of a toolkit: unversioned library names
    (the linker's -lcudart), lib64, and targets/x86_64-linux/{include,lib} (nvcc.profile's include path)."""
    lib = root / "lib"
    for name in CUDA_RUNTIME_LIBS:
        link = lib / name.split(".so")[0]
        link = link.with_name(link.name + ".so")
        if not link.exists():
            link.symlink_to(name)
    if not (root / "lib64").exists():
        (root / "lib64").symlink_to("lib")
    target = root / "targets" / "x86_64-linux"
    target.mkdir(parents=True, exist_ok=True)
    for sub in ("include", "lib"):
        if not (target / sub).exists():
            (target / sub).symlink_to(Path("..", "..", sub))


def ensure_pip_cuda_toolkit(python: Path) -> Path:
    """The CUDA toolkit from PyPI (CUDA_PIP_TOOLKIT), installed once into the cache; returns its root."""
    base = pip_cuda_toolkit_dir()
    root = pip_cuda_root(base)
    if not toolkit_problems(root):
        return root
    say(f"installing the CUDA {CUDA_PIP_MAJOR} toolkit from PyPI into {base} (about 1 GB, once)")
    tmp = base.with_name(base.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp), *CUDA_PIP_TOOLKIT])
    arrange_pip_toolkit(pip_cuda_root(tmp))
    missing = toolkit_problems(pip_cuda_root(tmp))
    if missing:
        sys.exit(f"The CUDA toolkit from PyPI is incomplete (missing {', '.join(missing)}); install the CUDA "
                 "toolkit (nvcc) instead.")
    shutil.rmtree(base, ignore_errors=True)
    tmp.replace(base)
    return root


def cuda_cmake_args(root: Path, archs: str) -> list[str]:
    """ggml's CUDA backend built with the toolkit at ``root`` for the architectures ``archs`` ("86-real;...")."""
    return [*CUDA_COMMON, f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}", f"-DCUDAToolkit_ROOT={root}",
            f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]


def pip_toolkit_in(cmake_args: list[str]) -> Path | None:
    """The PyPI CUDA toolkit that ``cmake_args`` build with, if any."""
    for arg in cmake_args:
        if arg.startswith("-DCUDAToolkit_ROOT="):
            root = Path(arg.split("=", 1)[1])
            if root == pip_cuda_root() or root.parent.name == "nvidia":
                return root
    return None


VULKAN_HEADERS_VERSION = "1.4.309"  # Debian 13's libvulkan-dev and spirv-headers (packaging/vulkan_sdk)


def vulkan_loader() -> str:
    """The system's Vulkan loader (libvulkan.so.1), by path where it is installed."""
    found = sorted(Path("/usr/lib").glob("*-linux-gnu/libvulkan.so.1")) + sorted(Path("/usr/lib64").glob(
        "libvulkan.so.1"))
    return str(found[0]) if found else "libvulkan.so.1"


def vulkan_cmake_args() -> list[str]:
    """ggml's Vulkan backend built against the Vulkan 1.4 and SPIR-V headers that packaging/vulkan_sdk unpacks
    into the cache (Debian 12's are too old for ggml-vulkan.cpp); the loader and glslc are the system's."""
    headers = cache_base() / f"vulkan-headers-{VULKAN_HEADERS_VERSION}"
    return ["-DGGML_VULKAN=ON", f"-DVulkan_INCLUDE_DIR={headers}/usr/include", f"-DVulkan_LIBRARY={vulkan_loader()}",
            f"-DSPIRV-Headers_DIR={headers}/usr/share/cmake/SPIRV-Headers"]


def cuda_bundle_flags() -> list[str]:
    """llama.cpp for the CUDA bundle: the AVX2 baseline's CPU backend and the CUDA backend, both loadable
    modules (CUDA's loads where its runtime does and finds no GPU without a driver), built with the PyPI
    toolkit for CUDA_BUNDLE_ARCHS."""
    return [*AVX2_PORTABLE, "-DGGML_BACKEND_DL=ON", "-DCMAKE_INSTALL_BINDIR=llama_cpp/lib",
            *cuda_cmake_args(pip_cuda_root(), CUDA_BUNDLE_ARCHS)]


# Presets whose flags name files on this machine (headers, a toolkit), worked out when asked for.
MACHINE_PRESETS = {
    "portable-vulkan": lambda: [*ANY_X86_64, *vulkan_cmake_args()],  # the any-x86-64 bundle plus Vulkan
    "cuda": cuda_bundle_flags,  # the CUDA bundle
}


def has_vulkan_sdk() -> bool:
    return bool(os.environ.get("VULKAN_SDK")) or (
        shutil.which("glslc") is not None and Path("/usr/include/vulkan/vulkan.h").exists()
    )


@dataclass
class Machine:
    """What setup found: the inputs of the backend choice, probed once."""

    system: str  # sys.platform
    arch: str  # platform.machine().lower()
    cpu_flags: set[str] = field(default_factory=set)
    nvidia_smi_list: str | None = None  # `nvidia-smi -L`, None when missing or failing
    nvidia_smi_query: str | None = None  # `nvidia-smi --query-gpu=compute_cap,driver_version --format=csv,noheader`
    has_nvcc: bool = False
    vulkaninfo_summary: str | None = None  # `vulkaninfo --summary`, None when missing or failing
    has_vulkan_sdk: bool = False

    @classmethod
    def probe(cls) -> Machine:
        return cls(
            system=sys.platform, arch=platform.machine().lower(), cpu_flags=cpu_flags(),
            nvidia_smi_list=_probe(["nvidia-smi", "-L"]),
            nvidia_smi_query=_probe(["nvidia-smi", "--query-gpu=compute_cap,driver_version", "--format=csv,noheader"]),
            has_nvcc=shutil.which("nvcc") is not None,
            vulkaninfo_summary=_probe(["vulkaninfo", "--summary"]), has_vulkan_sdk=has_vulkan_sdk(),
        )


@dataclass
class BackendChoice:
    backend: str  # "cpu", "cuda", "vulkan", "metal" or "custom"
    cmake_args: list[str]
    found: list[str]  # what was found, one phrase each
    reason: str  # why this backend, one sentence


def choose_backend(machine: Machine, override: str | None = None) -> BackendChoice:
    """The llama.cpp backend for this machine: a GPU backend only for a real GPU, else the CPU.

    llvmpipe (Mesa's software Vulkan device, type CPU) does not count: a Vulkan build on it is far slower
    than the CPU backend. SPECDECK_CMAKE_ARGS (``override``) replaces the whole choice.
    """
    nvidia = nvidia_gpus(machine.nvidia_smi_list)
    vulkan = vulkan_devices(machine.vulkaninfo_summary)
    # Discrete GPUs first: llama.cpp's Vulkan backend also uses only those when there are any.
    ranked = sorted((d for d in vulkan if d[1] in VULKAN_GPU_TYPES), key=lambda d: list(VULKAN_GPU_TYPES).index(d[1]))
    vulkan_gpus = [f"{name} ({VULKAN_GPU_TYPES[kind]})" for name, kind in ranked]
    vulkan_other = [f"{name} (not a GPU: {kind.removeprefix('PHYSICAL_DEVICE_TYPE_').lower()})"
                    for name, kind in vulkan if kind not in VULKAN_GPU_TYPES]
    apple_silicon = machine.system == "darwin" and machine.arch in {"arm64", "aarch64"}
    found = [f"NVIDIA GPU {name}" for name in nvidia]
    found += [f"Vulkan device {d}" for d in vulkan_gpus + vulkan_other]
    if apple_silicon:
        found.append("Apple Silicon (Metal)")
    if not found:
        found.append("no GPU")
    if override is not None:
        return BackendChoice("custom", override.split(), found,
                             "SPECDECK_CMAKE_ARGS is set, so its flags are used as given.")

    cpu: list[str] = []
    if machine.arch in {"x86_64", "amd64", "i686", "x86"}:
        # No reliable feature list off Linux: AVX2 is the portable baseline for desktop x86.
        cpu = x86_cpu_cmake(machine.cpu_flags) if machine.system.startswith("linux") else list(AVX2_PORTABLE)
    if apple_silicon:
        return BackendChoice("metal", [*cpu, "-DGGML_METAL=ON"], found,
                             "Apple Silicon GPUs run llama.cpp through Metal.")
    notes: list[str] = []
    if nvidia and machine.has_nvcc:
        return BackendChoice("cuda", [*cpu, "-DGGML_CUDA=ON"], found,
                             f"nvidia-smi lists {nvidia[0]} and the CUDA toolkit (nvcc) is installed.")
    if nvidia:
        pip_cuda, why_not = pip_cuda_choice(machine)
        if pip_cuda is not None:
            return BackendChoice("cuda", [*cpu, *pip_cuda], found,
                                 f"nvidia-smi lists {nvidia[0]} and nvcc is not installed, so the CUDA "
                                 f"{CUDA_PIP_MAJOR} toolkit comes from PyPI ({CUDA_PIP_TOOLKIT[0]}, ...) into "
                                 f"{pip_cuda_toolkit_dir()}.")
        notes.append(f"an NVIDIA GPU is present but nvcc is not, and {why_not} (install the CUDA toolkit for the "
                     "CUDA backend)")
    if vulkan_gpus and machine.has_vulkan_sdk:
        return BackendChoice("vulkan", [*cpu, "-DGGML_VULKAN=ON"], found,
                             f"vulkaninfo lists the GPU {vulkan_gpus[0]} and the Vulkan SDK (glslc, headers) is "
                             "installed" + (f"; {notes[0]}." if notes else "."))
    if vulkan_gpus:
        notes.append("a Vulkan GPU is present but not the Vulkan SDK (install glslc and the Vulkan headers)")
    if vulkan_other and not vulkan_gpus:
        notes.append("the only Vulkan devices run on the CPU, where llama.cpp's CPU backend is faster")
    return BackendChoice("cpu", cpu, found, "CPU backend: " + ("; ".join(notes) if notes else "no GPU was found") + ".")


def pip_cuda_choice(machine: Machine) -> tuple[list[str] | None, str]:
    """(CMake flags for CUDA from the PyPI toolkit, built for this machine's GPUs only) or (None, why not)."""
    if not (machine.system.startswith("linux") and machine.arch in {"x86_64", "amd64"}):
        return None, "the CUDA toolkit from PyPI is only set up on Linux x86-64"
    caps = nvidia_compute_caps(machine.nvidia_smi_query)
    if not caps:
        return None, "nvidia-smi did not report the GPU's compute capability"
    old_driver = min(driver for _, driver in caps)
    if old_driver < CUDA_MIN_DRIVER:
        return None, (f"the NVIDIA driver {old_driver} is older than CUDA {CUDA_PIP_MAJOR} needs "
                      f"({CUDA_MIN_DRIVER} or newer)")
    usable = sorted({cap for cap, _ in caps if cap >= CUDA_MIN_COMPUTE})
    if not usable:
        return None, (f"CUDA {CUDA_PIP_MAJOR} does not support compute capability "
                      f"{caps[0][0] // 10}.{caps[0][0] % 10} (it needs 7.5 or newer)")
    # Machine code for each GPU here only (one architecture builds in minutes, not hours); Blackwell's
    # 120 and 121 need their architecture-specific "a" variants (ggml's own CMake rewrites them too).
    archs = ";".join(f"{cap}a-real" if cap >= 120 else f"{cap}-real" for cap in usable)
    return cuda_cmake_args(pip_cuda_root(), archs), ""


def choose_cmake_args() -> tuple[str, list[str]]:
    """(backend name, CMake flags) for this machine; SPECDECK_CMAKE_ARGS overrides both. Says what it found."""
    choice = choose_backend(Machine.probe(), os.environ.get("SPECDECK_CMAKE_ARGS"))
    say("found: " + "; ".join(choice.found))
    say(f"chose the {choice.backend} backend. {choice.reason}")
    return choice.backend, choice.cmake_args


def cache_base() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdeck"


def wheel_cache_dir(cmake_args: list[str]) -> Path:
    """Built wheels live under a key of everything that changes the binary, so reruns are instant."""
    base = cache_base() / "wheels"
    key = "|".join([LLAMA_CPP_PYTHON, sys.version.split()[0], platform.platform(), *cmake_args])
    return base / hashlib.sha256(key.encode()).hexdigest()[:16]


def cached_wheel(cmake_args: list[str]) -> Path | None:
    wheels = sorted(wheel_cache_dir(cmake_args).glob("llama_cpp_python-*.whl"))
    return wheels[-1] if wheels else None


def build_llama_wheel(backend: str, cmake_args: list[str]) -> Path:
    wheel = cached_wheel(cmake_args)
    if wheel is not None:
        say(f"llama.cpp ({backend}) already built: {wheel}")
        return wheel
    out_dir = wheel_cache_dir(cmake_args)
    if pip_toolkit_in(cmake_args) is not None:
        ensure_pip_cuda_toolkit(venv_python())
    say(f"building llama.cpp for backend '{backend}' (several minutes, once): {' '.join(cmake_args)}")
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join([*cmake_args, *COMMON_CMAKE])
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    # --no-cache-dir: pip's own wheel cache knows nothing of CMAKE_ARGS and would hand back the first build.
    run([str(venv_python()), "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "--no-binary", "llama-cpp-python",
         "-w", str(tmp_dir), LLAMA_CPP_PYTHON], env=env)
    tmp_dir.replace(out_dir)
    return sorted(out_dir.glob("llama_cpp_python-*.whl"))[-1]


def ensure_venv() -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 - this runs on whatever python3 the user has
        sys.exit("SpecDeck needs Python 3.10 or newer; run this script with a newer python3.")
    if not venv_python().exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
        run([str(venv_python()), "-m", "pip", "install", "-q", "--upgrade", "pip", "wheel", "setuptools"])


def installed_wheel_marker() -> Path:
    return VENV / "specdeck-llama-wheel.txt"


# CMake option -> the name llama_print_system_info() lists when that instruction set is compiled in.
SYSTEM_INFO_FEATURES = {
    "GGML_AVX": "AVX", "GGML_AVX2": "AVX2", "GGML_FMA": "FMA", "GGML_F16C": "F16C", "GGML_BMI2": "BMI2",
    "GGML_AVX_VNNI": "AVX_VNNI", "GGML_AVX512": "AVX512", "GGML_AVX512_VBMI": "AVX512_VBMI",
    "GGML_AVX512_VNNI": "AVX512_VNNI", "GGML_AVX512_BF16": "AVX512_BF16", "GGML_AMX_INT8": "AMX_INT8",
}


def build_mismatches(cmake_args: list[str], system_info: str) -> list[str]:
    """CPU options of ``cmake_args`` that the installed build does not show in its system info."""
    if "-DGGML_BACKEND_DL=ON" in cmake_args:
        return []  # the CPU variant is chosen at run time
    shown = set(re.findall(r"(\w+) = 1", system_info))
    wrong = []
    for arg in cmake_args:
        m = re.fullmatch(r"-D(GGML_\w+)=(ON|OFF)", arg, flags=re.I)
        if m and m.group(1) in SYSTEM_INFO_FEATURES:
            want = m.group(2).upper() == "ON"
            if (SYSTEM_INFO_FEATURES[m.group(1)] in shown) != want:
                wrong.append(arg)
    return wrong


def install(backend: str, cmake_args: list[str]) -> None:
    """VENV with llama.cpp built with ``cmake_args``, SpecDeck (editable) and the demo models."""
    ensure_venv()
    wheel = build_llama_wheel(backend, cmake_args)
    marker = installed_wheel_marker()
    # Every cached build has the same version number: without --force-reinstall pip keeps the one installed.
    stamp = f"{wheel} {wheel.stat().st_mtime_ns}"  # a rebuilt wheel has the same path
    same = marker.exists() and marker.read_text() == stamp
    force = [] if same else ["--force-reinstall", "--no-deps"]
    run([str(venv_python()), "-m", "pip", "install", "-q", *force, str(wheel)])
    if pip_toolkit_in(cmake_args) is not None:
        copy_cuda_runtime(ensure_pip_cuda_toolkit(venv_python()))
    run([str(venv_python()), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]"])
    info = subprocess.run([str(venv_python()), "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info()"
                           ".decode(errors='replace'))"], capture_output=True, text=True).stdout
    wrong = build_mismatches(cmake_args, info)
    if wrong:
        shutil.rmtree(wheel.parent, ignore_errors=True)
        sys.exit(f"The installed llama.cpp does not match its flags ({' '.join(wrong)}; it reports: {info.strip()}). "
                 "The cached build was removed; run this again to rebuild it.")
    marker.write_text(stamp)
    run([str(venv_script("specdeck")), "demo-models"])
    check = subprocess.run([str(venv_script("specdeck")), "doctor", "--decode-check"], capture_output=True,
                           text=True)
    print(check.stdout, end="", flush=True)
    print(check.stderr, end="", file=sys.stderr, flush=True)
    if check.returncode != 0:
        if not trapped(check.stdout + check.stderr):
            # A slow or busy machine, a missing model: the build itself is fine and stays cached.
            sys.exit("llama.cpp could not decode one token with this build (see above); the build is kept.")
        # A trapping build must not stay cached, or every rerun would install it again.
        shutil.rmtree(wheel.parent, ignore_errors=True)
        marker.unlink(missing_ok=True)
        sys.exit("llama.cpp could not decode one token with this build (see above). The cached build was "
                 "removed; set SPECDECK_CMAKE_ARGS to safer flags (e.g. '-DGGML_NATIVE=OFF -DGGML_AVX2=ON') "
                 "and run this again.")


def copy_cuda_runtime(toolkit: Path) -> None:
    """The CUDA runtime and cuBLAS beside libggml-cuda in the venv's llama_cpp/lib (its RUNPATH is $ORIGIN), so
    the venv and a bundle made from it run without a CUDA installation; only the NVIDIA driver is the system's."""
    # Found without importing llama_cpp, which would load libggml-cuda before its runtime is there.
    where = ("import importlib.util as u, os; "
             "print(os.path.join(list(u.find_spec('llama_cpp').submodule_search_locations)[0], 'lib'))")
    lib = Path(subprocess.run([str(venv_python()), "-c", where], capture_output=True, text=True,
                              check=True).stdout.strip())
    for name in CUDA_RUNTIME_LIBS:
        if not (lib / name).exists():
            shutil.copy2(toolkit / "lib" / name, lib / name)


def trapped(check_output: str) -> bool:
    """Whether a failed decode check died of an instruction this CPU cannot run (the build is unusable)."""
    return bool(re.search(r"SIGILL|Illegal instruction|instructions this machine cannot run", check_output))


# The system libraries Qt's X11 platform plugin links (Qt >= 6.5 needs libxcb-cursor too), by soname: the
# Debian/Ubuntu package, then the Fedora one. PySide6's wheels carry Qt itself, not these.
QT_XCB_PACKAGES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
}


def missing_libraries(binaries: list[Path]) -> list[str]:
    """The sonames the dynamic linker cannot find for ``binaries`` (from ldd; none where ldd is missing)."""
    missing: list[str] = []
    for binary in binaries:
        try:
            out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        for line in out.splitlines():
            name, _, where = line.strip().partition(" => ")
            if where.strip() == "not found" and name not in missing:
                missing.append(name)
    return missing


def qt_platform_hint(missing: list[str]) -> str:
    """One paragraph: what the window needs, and the apt and dnf commands that install it."""
    packages = [QT_XCB_PACKAGES[name] for name in missing if name in QT_XCB_PACKAGES]
    debian = sorted({deb for deb, _ in packages})
    fedora = sorted({rpm for _, rpm in packages})
    unknown = [name for name in missing if name not in QT_XCB_PACKAGES]
    hint = (f"the window cannot open on X11: Qt's platform plugin needs {', '.join(missing)}, which this system "
            "lacks.")
    if debian:
        hint += (f" On Debian or Ubuntu: sudo apt-get install {' '.join(debian)}."
                 f" On Fedora: sudo dnf install {' '.join(fedora)}.")
    if unknown:
        hint += f" Install the packages that provide {', '.join(unknown)} with your system's package manager."
    return hint


def qt_xcb_binaries() -> list[Path]:
    """Qt's X11 platform plugin and its library, in the venv's PySide6."""
    found = sorted(VENV.glob("lib/python3*/site-packages/PySide6/Qt/plugins/platforms/libqxcb.so"))
    found += sorted(VENV.glob("lib/python3*/site-packages/PySide6/Qt/lib/libQt6XcbQpa.so*"))
    return found


def has_display() -> bool:
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


@dataclass
class Options:
    command: str  # "setup" or "test"
    no_launch: bool = False
    venv: Path | None = None
    build: str | None = None
    cached_only: bool = False
    fast: bool = False
    rest: list[str] = field(default_factory=list)  # passed on to pytest


def parse_args(argv: list[str]) -> Options:
    opts = Options(command="test" if argv[:1] == ["test"] else "setup")
    args = argv[1:] if opts.command == "test" else list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--venv", "--build") and not args:
            sys.exit(f"{arg} needs a value.")
        if arg == "--no-launch":
            opts.no_launch = True
        elif arg == "--venv":
            opts.venv = (ROOT / args.pop(0)).resolve()
        elif arg == "--build":
            opts.build = args.pop(0)
        elif arg == "--cached-only" and opts.command == "test":
            opts.cached_only = True
        elif arg == "--fast" and opts.command == "test":
            opts.fast = True
        elif opts.command == "test":
            opts.rest.append(arg)
        else:
            sys.exit(f"Unknown option {arg!r}; see the top of bootstrap.py.")
    return opts


def build_flags(build: str) -> tuple[str, list[str]]:
    """(venv name, CMake flags) for `--build`: a preset's name, or the flags themselves."""
    if build in BUILD_PRESETS:
        return f".venv-{build}", list(BUILD_PRESETS[build])
    if build in MACHINE_PRESETS:
        return f".venv-{build}", MACHINE_PRESETS[build]()
    if not build.strip().startswith("-D"):
        sys.exit(f"--build takes CMake flags (-D...) or a preset name ({', '.join([*BUILD_PRESETS, *MACHINE_PRESETS])}"
                 f"), not {build!r}.")
    flags = build.split()
    return ".venv-build-" + hashlib.sha256(" ".join(flags).encode()).hexdigest()[:8], flags


# The suite runs in one pytest-xdist worker: a test that crashes it (a segfault in llama.cpp) is reported
# as failed by name, a new worker takes the rest, and the run reaches its summary.
PYTEST_ISOLATION = ["-n", "1"]
# `test --fast`: what needs no window, process, server or demo model (markers set in tests/conftest.py).
FAST_MARKERS = "not window and not process and not server and not demo and not slow"


def test(opts: Options) -> int:
    global VENV
    lint = True
    if opts.build is not None:
        name, flags = build_flags(opts.build)
        VENV = opts.venv or ROOT / name
        if cached_wheel(flags) is None and opts.cached_only:
            say(f"llama.cpp built with {' '.join(flags)} is not cached; skipped "
                "(run without --cached-only to build it)")
            return 0
        say(f"testing against llama.cpp built with {' '.join(flags)}, in {VENV}")
        install("custom", flags)
        lint = False  # ruff and mypy do not depend on the llama.cpp build
    if not venv_python().exists():
        sys.exit(f"No {VENV.name} yet: run `python3 bootstrap.py` first.")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    steps = [
        [str(venv_python()), "-m", "ruff", "check", "app", "ui", "tests", "packaging", "benchmarks", "bootstrap.py"],
        [str(venv_python()), "-m", "mypy", "app", "ui"],
        [str(venv_python()), "-m", "vulture"],  # paths and confidence in [tool.vulture]
    ] if lint else []
    fast = ["-m", FAST_MARKERS] if opts.fast else []
    steps.append([str(venv_python()), "-m", "pytest", *PYTEST_ISOLATION, *fast, *opts.rest])
    for step in steps:
        say("$ " + " ".join(step[2:]))
        code = subprocess.run(step, cwd=ROOT, env=env).returncode
        if code == 5:
            say("pytest collected no tests: that is a failure")
            return 1
        if code != 0:
            return code
    return 0


def main() -> int:
    global VENV
    os.chdir(ROOT)
    opts = parse_args(sys.argv[1:])
    if opts.venv is not None:
        VENV = opts.venv
    if opts.command == "test":
        return test(opts)
    if opts.build is not None:
        name, flags = build_flags(opts.build)
        VENV = opts.venv or ROOT / name
        install("custom", flags)
    else:
        install(*choose_cmake_args())
    launcher = venv_script("specdeck").relative_to(ROOT) if VENV.is_relative_to(ROOT) else venv_script("specdeck")
    missing = missing_libraries(qt_xcb_binaries()) if sys.platform.startswith("linux") else []
    if missing:
        say(qt_platform_hint(missing))
    if opts.no_launch or os.environ.get("SPECDECK_NO_LAUNCH") or os.environ.get("CI"):
        say(f"set up; start SpecDeck with {launcher}")
        return 0
    if not has_display():
        say(f"set up, but there is no display here; start SpecDeck with {launcher} on a desktop")
        return 0
    if missing and not os.environ.get("WAYLAND_DISPLAY"):
        say(f"set up; install those libraries, then start SpecDeck with {launcher}")
        return 1
    say("opening SpecDeck")
    return subprocess.run([str(venv_script("specdeck"))]).returncode


if __name__ == "__main__":
    sys.exit(main())
