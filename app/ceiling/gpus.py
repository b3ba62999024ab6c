"""GPUs: a table of known cards (spec-sheet bandwidth and peak) and NVIDIA's own figures through NVML.

Absence is a normal answer: no NVML, no driver or no GPU all give an empty probe with the reason.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Any

import psutil

GB = 1e9


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


def normalize_name(name: str) -> str:
    name = re.sub(r"\((r|tm|c)\)", " ", name.lower())  # "Intel(R) Arc(TM) A770"
    return " ".join(re.sub(r"[^a-z0-9]+", " ", name).split())


def lookup_gpu(name: str) -> KnownGPU | None:
    """The known card whose key matches the most of this device name, on word boundaries."""
    norm = f" {normalize_name(name)} "
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


def as_text(value: object) -> str:
    """A C string from NVML or ggml (bytes or str) as text."""
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
        driver_s = as_text(driver) if driver is not None else None
        count = ask("nvmlDeviceGetCount") or 0
        ours = _our_pids()
        gpus: list[GPUInfo] = []
        for i in range(int(count)):
            h = ask("nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue
            name = as_text(ask("nvmlDeviceGetName", h) or f"NVIDIA GPU {i}")
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

