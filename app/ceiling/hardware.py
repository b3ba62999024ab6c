"""What this machine can do: GPUs (NVML, or a table of known cards), the CPU (measured), and which
llama.cpp backend this build has and which devices it sees.

Absence is a normal answer here, never an error: no NVML, no GPU, no llama.cpp all give a report.
The CPU's memory bandwidth and peak FLOP/s are measured once per machine and cached.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from app.storage.atomic import atomic_write_json
from app.errors import StorageError
from app.paths import cache_dir
from app.ceiling.roofline import Device

GB = 1e9
PROBE_CACHE_FILE = "hardware_probe.json"
PROBE_SCHEMA = 2
SAFE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
SIGILL_MESSAGE = (
    "this llama.cpp build uses CPU instructions this machine cannot run; rebuild with "
    f"SPECDECK_CMAKE_ARGS='{SAFE_CMAKE_ARGS}' python3 bootstrap.py"
)
_WINDOWS_ILLEGAL_INSTRUCTION = 0xC000001D


# --- known cards --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownGPU:
    key: str  # lower-case words matched against the device name
    vendor: str
    bandwidth: float  # bytes/s, the spec sheet's memory bandwidth
    peak_flops: float | None = None  # dense FP16 tensor FLOP/s where well known; None: unknown


def _k(key: str, vendor: str, gbps: float, tflops: float | None = None) -> KnownGPU:
    return KnownGPU(key, vendor, gbps * GB, tflops * 1e12 if tflops else None)


# Spec-sheet memory bandwidth (GB/s) and, where well known, dense FP16 tensor TFLOP/s. The most
# specific key that matches a name wins ("rx 7900 xtx" over "rx 7900 xt", "m2 ultra" over "m2").
KNOWN_GPUS: tuple[KnownGPU, ...] = (
    # NVIDIA data centre
    _k("b200", "nvidia", 8000), _k("gh200", "nvidia", 4000, 989),
    _k("h200", "nvidia", 4800, 989), _k("h100", "nvidia", 3350, 989), _k("h100 sxm", "nvidia", 3350, 989),
    _k("h100 pcie", "nvidia", 2000, 756), _k("h100 nvl", "nvidia", 3900, 835),
    _k("a100", "nvidia", 1555, 312), _k("a100 sxm4 80gb", "nvidia", 2039, 312),
    _k("a100 80gb pcie", "nvidia", 1935, 312), _k("a100 pcie 80gb", "nvidia", 1935, 312),
    _k("l40s", "nvidia", 864, 362), _k("l40", "nvidia", 864, 181), _k("l4", "nvidia", 300, 121),
    _k("a40", "nvidia", 696, 150), _k("a10", "nvidia", 600, 125), _k("t4", "nvidia", 320, 65),
    _k("v100", "nvidia", 900, 125), _k("rtx a6000", "nvidia", 768), _k("rtx 6000 ada", "nvidia", 960),
    # NVIDIA GeForce
    _k("rtx 5090", "nvidia", 1792), _k("rtx 5080", "nvidia", 960), _k("rtx 5070 ti", "nvidia", 896),
    _k("rtx 5070", "nvidia", 672), _k("rtx 5060 ti", "nvidia", 448),
    _k("rtx 4090", "nvidia", 1008, 330), _k("rtx 4090 laptop", "nvidia", 576),
    _k("rtx 4080 super", "nvidia", 736), _k("rtx 4080", "nvidia", 717), _k("rtx 4080 laptop", "nvidia", 432),
    _k("rtx 4070 ti super", "nvidia", 672), _k("rtx 4070 ti", "nvidia", 504),
    _k("rtx 4070 super", "nvidia", 504), _k("rtx 4070", "nvidia", 504),
    _k("rtx 4060 ti", "nvidia", 288), _k("rtx 4060", "nvidia", 272),
    _k("rtx 3090 ti", "nvidia", 1008), _k("rtx 3090", "nvidia", 936, 142), _k("rtx 3080 ti", "nvidia", 912),
    _k("rtx 3080", "nvidia", 760), _k("rtx 3070 ti", "nvidia", 608), _k("rtx 3070", "nvidia", 448),
    _k("rtx 3060 ti", "nvidia", 448), _k("rtx 3060", "nvidia", 360),
    _k("rtx 2080 ti", "nvidia", 616), _k("titan rtx", "nvidia", 672),
    # AMD
    _k("rx 9070 xt", "amd", 640), _k("rx 9070", "amd", 640),
    _k("rx 7900 xtx", "amd", 960, 123), _k("rx 7900 xt", "amd", 800), _k("rx 7900 gre", "amd", 576),
    _k("rx 7800 xt", "amd", 624), _k("rx 7700 xt", "amd", 432), _k("rx 7600", "amd", 288),
    _k("rx 6950 xt", "amd", 576), _k("rx 6900 xt", "amd", 512), _k("rx 6800 xt", "amd", 512),
    _k("rx 6800", "amd", 512), _k("rx 6700 xt", "amd", 384), _k("radeon vii", "amd", 1024),
    _k("mi325x", "amd", 6000), _k("mi300x", "amd", 5300), _k("mi250x", "amd", 3277),
    _k("mi250", "amd", 3277), _k("mi210", "amd", 1638), _k("mi100", "amd", 1229),
    # Intel
    _k("arc a770", "intel", 560), _k("arc a750", "intel", 512), _k("arc a580", "intel", 512),
    _k("arc b580", "intel", 456), _k("arc b570", "intel", 380),
    # Apple (unified memory, shared by CPU and GPU)
    _k("m1", "apple", 68), _k("m1 pro", "apple", 200), _k("m1 max", "apple", 400),
    _k("m1 ultra", "apple", 800), _k("m2", "apple", 100), _k("m2 pro", "apple", 200),
    _k("m2 max", "apple", 400), _k("m2 ultra", "apple", 800), _k("m3", "apple", 100),
    _k("m3 pro", "apple", 150), _k("m3 max", "apple", 400), _k("m3 ultra", "apple", 819),
    _k("m4", "apple", 120), _k("m4 pro", "apple", 273), _k("m4 max", "apple", 546),
)


def _normalize(name: str) -> str:
    name = re.sub(r"\((r|tm|c)\)", " ", name.lower())  # "Intel(R) Arc(TM) A770"
    return " ".join(re.sub(r"[^a-z0-9]+", " ", name).split())


def lookup_gpu(name: str) -> KnownGPU | None:
    """The known card whose key matches the most of this device name, on word boundaries."""
    norm = f" {_normalize(name)} "
    hits = [g for g in KNOWN_GPUS if f" {g.key} " in norm]
    return max(hits, key=lambda g: len(g.key)) if hits else None


def nvml_bandwidth(bus_width_bits: int, max_memory_clock_mhz: int) -> float:
    """Bytes/s from what NVML reports: bus bytes × memory clock × 2 (double data rate)."""
    return bus_width_bits / 8 * max_memory_clock_mhz * 1e6 * 2


def guess_vendor(name: str) -> str:
    n = name.lower()
    for word, vendor in (("nvidia", "nvidia"), ("geforce", "nvidia"), ("quadro", "nvidia"), ("amd", "amd"),
                         ("radeon", "amd"), ("intel", "intel"), ("arc", "intel"), ("apple", "apple")):
        if word in n:
            return vendor
    known = lookup_gpu(name)
    return known.vendor if known else "unknown"


# --- GPUs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    vendor: str  # "nvidia", "amd", "intel", "apple", "unknown"
    memory_total: int | None
    memory_used: int | None
    memory_free: int | None
    process_memory: int | None  # this process and its children (the engine worker)
    bus_width_bits: int | None
    max_memory_clock_mhz: int | None
    bandwidth: float | None  # bytes/s
    bandwidth_source: str  # "nvml", "table", "override", "unknown"
    peak_flops: float | None
    driver_version: str | None
    source: str = "nvml"  # "nvml" or "llama.cpp" (a device only the backend reported)
    backend_device: str | None = None  # the llama.cpp device name, when the backend sees this GPU


@dataclass(frozen=True)
class NvidiaProbe:
    status: str  # "ok", or why there is nothing: "no NVIDIA driver (NVML library not found)", ...
    driver_version: str | None
    gpus: tuple[GPUInfo, ...]


def _nvml_error_reason(exc: BaseException) -> str:
    kind = type(exc).__name__
    if kind.endswith("LibraryNotFound"):
        return "no NVIDIA driver (NVML library not found)"
    if kind.endswith("DriverNotLoaded"):
        return "the NVIDIA driver is not loaded"
    if kind.endswith("NoPermission"):
        return "no permission to query the NVIDIA driver"
    return f"NVML failed: {exc}"


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _our_pids() -> set[int]:
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().children(recursive=True))
    return pids


def probe_nvidia(nvml: Any = None, *, bandwidth_override: float | None = None) -> NvidiaProbe:
    """NVIDIA GPUs through NVML. `nvml` is the pynvml module (injectable for tests)."""
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            return NvidiaProbe("nvidia-ml-py is not installed", None, ())
    nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except nvml_error as exc:
        return NvidiaProbe(_nvml_error_reason(exc), None, ())
    except OSError as exc:  # a broken libnvidia-ml can fail below pynvml's own error types
        return NvidiaProbe(f"NVML failed: {exc}", None, ())
    try:

        def ask(fn: str, *args: Any) -> Any:
            try:
                return getattr(nvml, fn)(*args)
            except (nvml_error, AttributeError, OSError):
                return None  # NotSupported and friends: that value is unknown, the rest still is

        driver = ask("nvmlSystemGetDriverVersion")
        driver_s = _text(driver) if driver is not None else None
        count = ask("nvmlDeviceGetCount") or 0
        ours = _our_pids()
        gpus: list[GPUInfo] = []
        for i in range(int(count)):
            h = ask("nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue
            name = _text(ask("nvmlDeviceGetName", h) or f"NVIDIA GPU {i}")
            mem = ask("nvmlDeviceGetMemoryInfo", h)
            bus = ask("nvmlDeviceGetMemoryBusWidth", h)
            clock = ask("nvmlDeviceGetMaxClockInfo", h, getattr(nvml, "NVML_CLOCK_MEM", 2))
            used_by_us: int | None = None
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                procs = ask(fn, h)
                if procs is None:
                    continue
                used_by_us = used_by_us or 0
                used_by_us += sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in ours)
            known = lookup_gpu(name)
            bandwidth: float | None
            if bandwidth_override:
                bandwidth, source = bandwidth_override, "override"
            elif bus and clock:
                bandwidth, source = nvml_bandwidth(int(bus), int(clock)), "nvml"
            elif known:
                bandwidth, source = known.bandwidth, "table"
            else:
                bandwidth, source = None, "unknown"
            gpus.append(GPUInfo(
                index=i, name=name, vendor="nvidia",
                memory_total=int(mem.total) if mem is not None else None,
                memory_used=int(mem.used) if mem is not None else None,
                memory_free=int(mem.free) if mem is not None else None,
                process_memory=used_by_us,
                bus_width_bits=int(bus) if bus else None,
                max_memory_clock_mhz=int(clock) if clock else None,
                bandwidth=bandwidth, bandwidth_source=source,
                peak_flops=known.peak_flops if known else None,
                driver_version=driver_s,
            ))
        return NvidiaProbe("ok" if gpus else "no NVIDIA GPU", driver_s, tuple(gpus))
    finally:
        with contextlib.suppress(Exception):  # shutting NVML down must never turn a report into an error
            nvml.nvmlShutdown()


# --- CPU ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CPUInfo:
    model: str
    physical_cores: int
    logical_cores: int
    ram_total: int
    ram_available: int
    bandwidth: float  # bytes/s read, measured (or the user's override)
    peak_flops: float  # FLOP/s, measured
    bandwidth_source: str  # "measured" or "override"
    probe_seconds: float  # how long the measurement took (0 when it came from the cache)
    cached: bool


def cpu_model_name() -> str:
    if sys.platform.startswith("linux"):
        try:
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    elif sys.platform == "win32":
        try:
            import winreg

            with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE,
                                r"HARDWARE\DESCRIPTION\System\CentralProcessor\0") as key:
                return str(winreg.QueryValueEx(key, "ProcessorNameString")[0]).strip()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


# BLAS libraries read these before they start their threads; the CPU probe's child sets them all.
SINGLE_THREAD_ENV = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                            "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")}


def _filled(nbytes: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    buf = np.empty(max(nbytes // 4 // 16384 * 16384, 16384), np.float32)
    buf.fill(1.0)  # touch every page: untouched pages all map the one zero page, which is cached
    return buf


def measure_memory_bandwidth(nbytes: int = 128 << 20, budget_s: float = 0.3) -> float:
    """Read bandwidth in bytes/s with this process's BLAS threads: the best matrix-vector product over a
    buffer larger than the caches (the in-process fallback of :func:`measure_cpu_rates`)."""
    buf = _filled(nbytes)
    mat = buf.reshape(-1, 1024)
    vec = np.ones(1024, np.float32)
    mat @ vec
    best = 0.0
    end = time.perf_counter() + budget_s
    i = 0
    while time.perf_counter() < end or i < 4:
        t = time.perf_counter()
        mat @ vec
        best = max(best, buf.nbytes / (time.perf_counter() - t))
        i += 1
    return best


def _best_matmul(budget_s: float, sizes: Sequence[int]) -> float:
    rng = np.random.default_rng(0)
    best = 0.0
    for size in sizes:
        a = rng.standard_normal((size, size), dtype=np.float32)
        b = rng.standard_normal((size, size), dtype=np.float32)
        a @ b
        reps = 0
        stop = time.perf_counter() + budget_s / len(sizes)
        while reps < 3 or (time.perf_counter() < stop and reps < 200):
            t = time.perf_counter()
            a @ b
            best = max(best, 2.0 * size**3 / (time.perf_counter() - t))
            reps += 1
    return best


def measure_peak_flops(budget_s: float = 0.15) -> float:
    """Peak FLOP/s of this process's BLAS threads on float32 matrix products (the in-process fallback)."""
    return _best_matmul(budget_s, (256, 512, 1024))


SLICE_BYTES = 16 << 20


def measure_cpu_rates(threads: int, nbytes: int = 128 << 20, budget_s: float = 0.35) -> dict[str, float]:
    """The CPU probe proper; run it where BLAS is single-threaded (SINGLE_THREAD_ENV, a child process).

    Bandwidth: matrix-vector products read 16 MB slices of a buffer larger than the caches, in turn, so
    each slice read has been evicted since its last read; by one thread, and by `threads` threads at
    once (llama.cpp streams its weights from all cores). A slice takes well under a scheduler tick, so
    among a few hundred runs some finish untouched by other programs, which only ever slow a run down:
    the best is kept.

    Peak FLOP/s: one core's best float32 matrix product, times the cores. This is an honest upper bound
    for decoding: cores never scale better than linearly, and llama.cpp's quantized kernels unpack the
    weights before they multiply, so they run below a float32 GEMM (from cache, 100-200 GFLOP/s on two
    cores of the test VM against 2 × 125 for this product). Decoding is a matrix-vector product per
    token and reaches less still. A cores × clock × SIMD × FMA figure would be higher again, but clocks
    cannot be read reliably (VMs, boost), and multi-threaded BLAS measures far too low when another
    program holds a core for a scheduler tick.
    """
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, threads)
    buf = _filled(nbytes)
    cols = 1024
    rows = max(1, min(SLICE_BYTES, buf.nbytes // (2 * threads)) // (4 * cols))
    mats = buf[: buf.size // (rows * cols) * rows * cols].reshape(-1, rows, cols)  # slices, in memory order
    vec = np.ones(cols, np.float32)
    n = len(mats)
    slice_bytes = float(mats[0].nbytes)
    single = multi = 0.0
    with ThreadPoolExecutor(threads) as pool:
        end = time.perf_counter() + budget_s * 0.7
        i = 0
        while time.perf_counter() < end or i < 3 * n:
            t = time.perf_counter()
            mats[i % n] @ vec
            single = max(single, slice_bytes / (time.perf_counter() - t))
            if threads > 1 and n >= 2 * threads:
                # Thread j reads slice (i + j * n / threads) mod n: all far apart, all cold.
                picks = [mats[(i + j * n // threads) % n] for j in range(threads)]
                t = time.perf_counter()
                list(pool.map(lambda m: m @ vec, picks))
                multi = max(multi, threads * slice_bytes / (time.perf_counter() - t))
            i += 1
    peak_one = _best_matmul(budget_s * 0.3, (256, 512))
    return {"bandwidth_single": single, "bandwidth_threads": multi, "peak_flops_core": peak_one,
            "threads": float(threads)}


def cpu_probe_worker(threads: int, nbytes: int) -> int:
    """Entry of the probe's child process (`specdeck doctor --cpu-probe-json`): one JSON line."""
    print(json.dumps(measure_cpu_rates(threads, nbytes)), flush=True)
    return 0


def measure_cpu(physical_cores: int, nbytes: int = 128 << 20, timeout_s: float = 60.0) -> tuple[float, float]:
    """(read bandwidth bytes/s, peak FLOP/s) of the CPU, measured in a child with single-threaded BLAS;
    in this process if the child cannot run."""
    cmd = doctor_command("--cpu-probe-json", "--probe-threads", str(physical_cores),
                         "--probe-bytes", str(nbytes))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env={**specdeck_env(), **SINGLE_THREAD_ENV})
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode == 0 and lines:
            r = json.loads(lines[-1])
            bandwidth = max(float(r["bandwidth_single"]), float(r["bandwidth_threads"]))
            peak = float(r["peak_flops_core"]) * physical_cores
            if bandwidth > 0 and peak > 0:
                return bandwidth, peak
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        pass
    return measure_memory_bandwidth(nbytes), measure_peak_flops()


def machine_fingerprint(model: str, physical: int, logical: int, ram_total: int) -> str:
    # A cached probe is reused only on the same machine and BLAS (numpy ships its own).
    return "|".join([model, str(physical), str(logical), str(round(ram_total / 2**30)), platform.machine(),
                     platform.node(), np.__version__])


def _busy() -> bool:
    """Whether other programs were using much of the CPU just now (a probe then reads low)."""
    try:
        return float(psutil.cpu_percent(interval=0.05)) > 25.0
    except (OSError, psutil.Error):
        return False


def probe_cpu(*, refresh: bool = False, cache_path: Path | None = None,
              bandwidth_override: float | None = None) -> CPUInfo:
    """The CPU, its RAM, and its measured bandwidth and peak, cached per machine.

    A probe taken while the machine was busy is kept but taken again on the next call, and the cache
    holds the best of all probes: load only ever lowers a measurement, and the ceiling must be an upper
    bound. `refresh` starts over (after a hardware change)."""
    model = cpu_model_name()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    vm = psutil.virtual_memory()
    key = machine_fingerprint(model, physical, logical, int(vm.total))
    path = cache_path or cache_dir() / PROBE_CACHE_FILE
    previous: dict[str, Any] | None = None
    if not refresh:
        try:
            data = json.loads(path.read_text())
            if data.get("schema") == PROBE_SCHEMA and data.get("machine") == key \
                    and float(data["bandwidth"]) > 0 and float(data["peak_flops"]) > 0:
                previous = data
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            previous = None  # missing or damaged cache: measure again
    measured = previous
    seconds = 0.0
    if previous is None or not previous.get("quiet", False):
        busy = _busy()
        t = time.perf_counter()
        # Keep the buffer well within free memory on small machines.
        nbytes = int(min(128 << 20, max(32 << 20, vm.available // 8)))
        bandwidth, peak = measure_cpu(int(physical), nbytes)
        seconds = time.perf_counter() - t
        busy = busy or _busy()
        runs = int(previous.get("runs", 1)) + 1 if previous else 1
        measured = {
            "schema": PROBE_SCHEMA, "machine": key,
            "bandwidth": max(bandwidth, float(previous["bandwidth"])) if previous else bandwidth,
            "peak_flops": max(peak, float(previous["peak_flops"])) if previous else peak,
            "quiet": not busy, "runs": runs, "probe_seconds": seconds, "measured_at": time.time(),
        }
        with contextlib.suppress(StorageError):  # a read-only cache only costs re-measuring next time
            atomic_write_json(path, measured)
    assert measured is not None
    return CPUInfo(
        model=model, physical_cores=int(physical), logical_cores=int(logical),
        ram_total=int(vm.total), ram_available=int(vm.available),
        bandwidth=float(bandwidth_override or measured["bandwidth"]),
        peak_flops=float(measured["peak_flops"]),
        bandwidth_source="override" if bandwidth_override else "measured",
        probe_seconds=seconds, cached=seconds == 0.0,
    )


# --- llama.cpp backend --------------------------------------------------------------------------

_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
_BACKEND_NAMES = {"cuda": "cuda", "vulkan": "vulkan", "metal": "metal", "mtl": "metal", "rocm": "rocm",
                  "hip": "rocm", "sycl": "sycl", "opencl": "opencl", "musa": "musa", "cann": "cann",
                  "kompute": "kompute", "webgpu": "webgpu", "zdnn": "zdnn"}


@dataclass(frozen=True)
class BackendDevice:
    name: str  # llama.cpp's device name: "CPU", "CUDA0", "Vulkan0", "Metal"
    description: str  # usually the hardware's name: "NVIDIA GeForce RTX 4090", "AMD EPYC"
    type: str  # "cpu", "gpu", "igpu", "accel"
    backend: str  # the registry it belongs to: "CPU", "CUDA", "Vulkan", ...
    memory_free: int | None
    memory_total: int | None


@dataclass(frozen=True)
class BackendInfo:
    """Which llama.cpp this is and what it can run on (also the About box's build info)."""

    available: bool
    llama_cpp_python: str = ""
    llama_cpp: str = ""  # llama_version(), e.g. "0.5.0-dev"
    ggml_version: str = ""
    ggml_commit: str = ""
    backend: str = "cpu"  # "cpu", "cuda", "vulkan", "metal", "rocm", "sycl", ...
    gpu_offload: bool = False
    system_info: str = ""
    cpu_features: tuple[str, ...] = ()
    devices: tuple[BackendDevice, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendInfo:
        devices = tuple(BackendDevice(**d) for d in data.get("devices", ()))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "devices"}
        known["cpu_features"] = tuple(known.get("cpu_features", ()))
        return cls(**known, devices=devices)

    @property
    def gpu_devices(self) -> tuple[BackendDevice, ...]:
        return tuple(d for d in self.devices if d.type in ("gpu", "igpu"))


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """llama_print_system_info() as {section: {flag: value}}: "CPU : AVX2 = 1 | ..." ."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9_ ]+?)\s*:\s*(.*)$", part)
        if m and "=" in m.group(2):
            current = m.group(1).strip()
            part = m.group(2)
        name, eq, value = part.partition("=")
        if eq:
            sections.setdefault(current, {})[name.strip()] = value.strip()
    return sections


def cpu_features_from_system_info(text: str) -> tuple[str, ...]:
    cpu = parse_system_info(text).get("CPU", {})
    return tuple(k for k, v in cpu.items() if v not in ("0", ""))


def _ggml_libs(lib_dir: Path) -> list[ctypes.CDLL]:
    libs: list[ctypes.CDLL] = []
    patterns = ("libggml.so", "libggml.dylib", "ggml.dll", "libggml-base.so", "libggml-base.dylib",
                "ggml-base.dll")
    for pattern in patterns:
        path = lib_dir / pattern
        if path.exists():
            try:
                libs.append(ctypes.CDLL(str(path)))
            except OSError:
                continue
    return libs


def _fn(libs: Sequence[ctypes.CDLL], name: str, restype: Any, argtypes: list[Any]) -> Any:
    for lib in libs:
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = restype
            f.argtypes = argtypes
            return f
    raise AttributeError(name)


def ggml_devices(lib_dir: Path) -> tuple[BackendDevice, ...]:
    """ggml's device list, bound with ctypes (llama-cpp-python does not bind ggml_backend_dev_*)."""
    libs = _ggml_libs(lib_dir)
    vp = ctypes.c_void_p
    count = _fn(libs, "ggml_backend_dev_count", ctypes.c_size_t, [])
    get = _fn(libs, "ggml_backend_dev_get", vp, [ctypes.c_size_t])
    dev_name = _fn(libs, "ggml_backend_dev_name", ctypes.c_char_p, [vp])
    dev_desc = _fn(libs, "ggml_backend_dev_description", ctypes.c_char_p, [vp])
    dev_type = _fn(libs, "ggml_backend_dev_type", ctypes.c_int, [vp])
    dev_mem = _fn(libs, "ggml_backend_dev_memory", None,
                  [vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)])
    try:
        dev_reg = _fn(libs, "ggml_backend_dev_backend_reg", vp, [vp])
        reg_name = _fn(libs, "ggml_backend_reg_name", ctypes.c_char_p, [vp])
    except AttributeError:
        dev_reg = reg_name = None
    if count() == 0:
        with contextlib.suppress(AttributeError):  # builds with backends as loadable modules
            _fn(libs, "ggml_backend_load_all", None, [])()
    out: list[BackendDevice] = []
    for i in range(int(count())):
        dev = get(i)
        if not dev:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        dev_mem(dev, ctypes.byref(free), ctypes.byref(total))
        reg = _text(reg_name(dev_reg(dev)) or b"") if dev_reg and reg_name else ""
        out.append(BackendDevice(
            name=_text(dev_name(dev) or b""), description=_text(dev_desc(dev) or b""),
            type=_DEVICE_TYPES.get(int(dev_type(dev)), "unknown"), backend=reg,
            memory_free=int(free.value) or None, memory_total=int(total.value) or None,
        ))
    return tuple(out)


def _backend_name(devices: Iterable[BackendDevice], sections: Iterable[str], offload: bool) -> str:
    for dev in devices:
        if dev.type in ("gpu", "igpu"):
            return _BACKEND_NAMES.get((dev.backend or dev.name).rstrip("0123456789").lower(),
                                      (dev.backend or "gpu").lower())
    for section in sections:
        name = _BACKEND_NAMES.get(section.lower())
        if name:
            return name
    return "gpu" if offload else "cpu"


def probe_backend() -> BackendInfo:
    """The llama.cpp build in this process. Loads llama.cpp: call it from doctor or the engine worker,
    or use :func:`probe_backend_isolated` from the GUI process."""
    try:
        import llama_cpp
    except Exception as exc:  # missing, or a shared library that fails to load
        return BackendInfo(available=False, error=f"llama-cpp-python could not be loaded: {exc}")
    errors: list[str] = []
    system_info = _text(llama_cpp.llama_print_system_info() or b"")
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    llama_version = ""
    if hasattr(llama_cpp, "llama_version"):
        llama_version = _text(llama_cpp.llama_version() or b"")
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    ggml_version = ggml_commit = ""
    try:
        libs = _ggml_libs(lib_dir)
        ggml_version = _text(_fn(libs, "ggml_version", ctypes.c_char_p, [])() or b"")
        ggml_commit = _text(_fn(libs, "ggml_commit", ctypes.c_char_p, [])() or b"")
    except (AttributeError, OSError):
        pass  # older ggml has no version functions
    devices: tuple[BackendDevice, ...] = ()
    try:
        devices = ggml_devices(lib_dir)
    except (AttributeError, OSError) as exc:
        errors.append(f"could not list llama.cpp's devices: {exc}")
    sections = parse_system_info(system_info)
    return BackendInfo(
        available=True,
        llama_cpp_python=str(getattr(llama_cpp, "__version__", "")),
        llama_cpp=llama_version,
        ggml_version=ggml_version,
        ggml_commit=ggml_commit,
        backend=_backend_name(devices, sections, offload),
        gpu_offload=offload,
        system_info=system_info.strip(),
        cpu_features=cpu_features_from_system_info(system_info),
        devices=devices,
        error="; ".join(errors) or None,
    )


def doctor_command(*args: str) -> list[str]:
    """`specdeck doctor ...` as a child process: the frozen executable itself, or `python -m app.cli.doctor`
    (not `-m app`, so doctor works even when another subcommand's module is broken)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "doctor", *args]
    return [sys.executable, "-m", "app.cli.doctor", *args]


def specdeck_env() -> dict[str, str]:
    # Make `-m app` importable from any working directory, installed or not.
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def describe_exit(returncode: int) -> str:
    """A child's exit status in words; SIGILL gets the rebuild advice."""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"killed by signal {-returncode}"
        if sig == signal.SIGILL:
            return SIGILL_MESSAGE
        return f"crashed with {sig.name}"
    if returncode & 0xFFFFFFFF == _WINDOWS_ILLEGAL_INSTRUCTION:
        return SIGILL_MESSAGE
    return f"exited with status {returncode}"


def probe_backend_isolated(timeout_s: float = 120.0) -> BackendInfo:
    """:func:`probe_backend` in a child process, so a build that traps cannot take this process down."""
    cmd = doctor_command("--backend-json")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=specdeck_env())
    except subprocess.TimeoutExpired:
        return BackendInfo(available=False, error=f"probing llama.cpp took longer than {timeout_s:g} s")
    except OSError as exc:
        return BackendInfo(available=False, error=f"could not start the llama.cpp probe: {exc}")
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:]
        why = describe_exit(done.returncode)
        return BackendInfo(available=False, error=f"loading llama.cpp {why}" + (f" ({tail[0]})" if tail
                                                                                 else ""))
    try:
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        return BackendInfo.from_dict(json.loads(lines[-1]))
    except (IndexError, ValueError, TypeError) as exc:
        return BackendInfo(available=False, error=f"the llama.cpp probe gave no readable answer ({exc})")


# --- the whole machine --------------------------------------------------------------------------


@dataclass(frozen=True)
class HardwareReport:
    cpu: CPUInfo
    gpus: tuple[GPUInfo, ...]
    nvml_status: str
    driver_version: str | None
    backend: BackendInfo | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _merge_backend_gpus(nvidia: Sequence[GPUInfo], backend: BackendInfo | None,
                        override: float | None) -> tuple[list[GPUInfo], list[str]]:
    gpus = list(nvidia)
    notes: list[str] = []
    if backend is None:
        return gpus, notes
    unclaimed = list(range(len(gpus)))
    for dev in backend.gpu_devices:
        label = dev.description or dev.name
        match = next((i for i in unclaimed if _normalize(gpus[i].name) == _normalize(label)), None)
        if match is None and dev.backend.upper() == "CUDA" and unclaimed:
            # CUDA numbers devices as NVML does (unless CUDA_VISIBLE_DEVICES says otherwise).
            match = unclaimed[0]
        if match is not None:
            unclaimed.remove(match)
            g = gpus[match]
            gpus[match] = GPUInfo(**{**asdict(g), "backend_device": dev.name})
            continue
        known = lookup_gpu(label)
        bandwidth: float | None
        if override:
            bandwidth, source = override, "override"
        elif known:
            bandwidth, source = known.bandwidth, "table"
        else:
            bandwidth, source = None, "unknown"
            notes.append(f"The memory bandwidth of {label} is not known: set it in the settings to get "
                         "a ceiling for it.")
        used = (dev.memory_total - dev.memory_free) if dev.memory_total and dev.memory_free else None
        gpus.append(GPUInfo(
            index=len(gpus), name=label, vendor=guess_vendor(label), memory_total=dev.memory_total,
            memory_used=used, memory_free=dev.memory_free, process_memory=None, bus_width_bits=None,
            max_memory_clock_mhz=None, bandwidth=bandwidth, bandwidth_source=source,
            peak_flops=known.peak_flops if known else None, driver_version=None, source="llama.cpp",
            backend_device=dev.name,
        ))
    if backend.available and not backend.gpu_offload and nvidia:
        notes.append("This llama.cpp build has no GPU backend, so the NVIDIA GPU is not used: rebuild with "
                     "SPECDECK_CMAKE_ARGS='-DGGML_CUDA=on' python3 bootstrap.py.")
    return gpus, notes


def probe_hardware(
    *,
    backend: BackendInfo | None = None,
    nvml: Any = None,
    gpu_bandwidth_override: float | None = None,
    cpu_bandwidth_override: float | None = None,
    refresh: bool = False,
    cache_path: Path | None = None,
) -> HardwareReport:
    """Everything doctor and the dashboard need. Overrides are bytes/s from the user's settings."""
    cpu = probe_cpu(refresh=refresh, cache_path=cache_path, bandwidth_override=cpu_bandwidth_override)
    nv = probe_nvidia(nvml, bandwidth_override=gpu_bandwidth_override)
    gpus, notes = _merge_backend_gpus(nv.gpus, backend, gpu_bandwidth_override)
    return HardwareReport(cpu, tuple(gpus), nv.status, nv.driver_version, backend, tuple(notes))


def roofline_devices(report: HardwareReport) -> list[Device]:
    """The devices llama.cpp can run layers on, as the roofline sees them: the CPU, plus every GPU the
    backend uses whose bandwidth is known (all known GPUs when the backend was not probed)."""
    cpu = report.cpu
    devices = [Device("cpu", cpu.model, "cpu", cpu.bandwidth, cpu.peak_flops, cpu.ram_available)]
    backend = report.backend
    for g in report.gpus:
        if g.bandwidth is None:
            continue
        if backend is not None and (not backend.gpu_offload or g.backend_device is None):
            continue
        devices.append(Device(f"gpu{g.index}", g.name, "gpu", g.bandwidth, g.peak_flops, g.memory_free))
    return devices
