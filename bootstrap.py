#!/usr/bin/env python3
"""Set SpecDeck up on this machine, or run its checks.

    python3 bootstrap.py          # .venv, llama.cpp built for this machine, demo models, then the app
    python3 bootstrap.py test     # ruff, mypy and the whole test suite

Only the standard library is used here: this runs before anything is installed.
Environment:
    SPECDECK_CMAKE_ARGS   replaces the CMake flags chosen for llama.cpp (backend and CPU features)
    SPECDECK_NO_LAUNCH=1  set up without opening the window (also --no-launch)
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# Tools, examples and tests of llama.cpp are not needed and double the build time.
COMMON_CMAKE = [
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
]


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


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def has_vulkan_sdk() -> bool:
    return bool(os.environ.get("VULKAN_SDK")) or (
        shutil.which("glslc") is not None and Path("/usr/include/vulkan/vulkan.h").exists()
    )


def choose_cmake_args() -> tuple[str, list[str]]:
    """(backend name, CMake flags) for this machine; SPECDECK_CMAKE_ARGS overrides both."""
    override = os.environ.get("SPECDECK_CMAKE_ARGS")
    if override is not None:
        return "custom", override.split()
    machine = platform.machine().lower()
    cpu: list[str] = []
    if machine in {"x86_64", "amd64", "i686", "x86"}:
        cpu = x86_cpu_cmake(cpu_flags()) if sys.platform.startswith("linux") else [
            # No reliable feature list off Linux: AVX2 is the portable baseline for desktop x86.
            "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
        ]
    if sys.platform == "darwin":
        return "metal", [*cpu, "-DGGML_METAL=ON"]
    # nvcc alone is not enough: a CUDA build on a machine with no NVIDIA GPU only costs build time.
    if shutil.which("nvcc") and has_nvidia_gpu():
        return "cuda", [*cpu, "-DGGML_CUDA=ON"]
    if has_vulkan_sdk():
        return "vulkan", [*cpu, "-DGGML_VULKAN=ON"]
    return "cpu", cpu


def wheel_cache_dir(cmake_args: list[str]) -> Path:
    """Built wheels live under a key of everything that changes the binary, so reruns are instant."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdeck" / "wheels"
    key = "|".join([LLAMA_CPP_PYTHON, sys.version.split()[0], platform.platform(), *cmake_args])
    return base / hashlib.sha256(key.encode()).hexdigest()[:16]


def build_llama_wheel() -> Path:
    backend, cmake_args = choose_cmake_args()
    out_dir = wheel_cache_dir(cmake_args)
    wheels = sorted(out_dir.glob("llama_cpp_python-*.whl"))
    if wheels:
        say(f"llama.cpp ({backend}) already built: {wheels[-1].name}")
        return wheels[-1]
    say(f"building llama.cpp for backend '{backend}' (several minutes, once): {' '.join(cmake_args)}")
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join([*cmake_args, *COMMON_CMAKE])
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    run([str(venv_python()), "-m", "pip", "wheel", "--no-deps", "--no-binary", "llama-cpp-python",
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


def install() -> None:
    ensure_venv()
    wheel = build_llama_wheel()
    run([str(venv_python()), "-m", "pip", "install", "-q", str(wheel), "-e", f"{ROOT}[dev]"])
    run([str(venv_script("specdeck")), "demo-models"])
    check = subprocess.run([str(venv_script("specdeck")), "doctor", "--decode-check"])
    if check.returncode != 0:
        # A trapping build must not stay cached, or every rerun would install it again.
        shutil.rmtree(wheel.parent, ignore_errors=True)
        sys.exit("llama.cpp could not decode one token with this build (see above). The cached build was "
                 "removed; set SPECDECK_CMAKE_ARGS to safer flags (e.g. '-DGGML_NATIVE=OFF -DGGML_AVX2=ON') "
                 "and run this again.")


def has_display() -> bool:
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def test() -> int:
    if not venv_python().exists():
        sys.exit("No .venv yet: run `python3 bootstrap.py` first.")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    steps = [
        [str(venv_python()), "-m", "ruff", "check", "app", "ui", "tests", "packaging", "benchmarks", "bootstrap.py"],
        [str(venv_python()), "-m", "mypy", "app", "ui"],
        [str(venv_python()), "-m", "pytest", *sys.argv[2:]],
    ]
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
    os.chdir(ROOT)
    if len(sys.argv) > 1 and sys.argv[1] == "test":
        return test()
    install()
    if "--no-launch" in sys.argv or os.environ.get("SPECDECK_NO_LAUNCH") or os.environ.get("CI"):
        say("set up; start SpecDeck with .venv/bin/specdeck")
        return 0
    if not has_display():
        say("set up, but there is no display here; start SpecDeck with .venv/bin/specdeck on a desktop")
        return 0
    say("opening SpecDeck")
    return subprocess.run([str(venv_script("specdeck"))]).returncode


if __name__ == "__main__":
    sys.exit(main())
