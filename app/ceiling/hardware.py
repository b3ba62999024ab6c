"""What this machine can do, in one report: the CPU (``cpu``), the GPUs (``gpus``: NVML and known cards),
and the llama.cpp backend (``backend``), merged into the devices the roofline computes a ceiling for.

Absence is a normal answer here, never an error: no NVML, no GPU, no llama.cpp all give a report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.ceiling.backend import BackendInfo
from app.ceiling.cpu import CPUInfo, probe_cpu
from app.ceiling.gpus import GPUInfo, guess_vendor, lookup_gpu, probe_nvidia
from app.ceiling.memory import device_memory, match_backend_gpus
from app.ceiling.roofline import Device
from app.storage.settings import default_path as settings_path


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
    matches = match_backend_gpus(nvidia, backend.devices)
    memory = {m.device: m for m in device_memory(nvidia, backend.devices) if m.source == "llama.cpp"}
    for i, dev in enumerate(backend.devices):
        if dev.type not in ("gpu", "igpu"):
            continue
        if i in matches:
            g = gpus[matches[i]]
            gpus[matches[i]] = GPUInfo(**{**asdict(g), "backend_device": dev.name})
            continue
        label = dev.description or dev.name
        known = lookup_gpu(label)
        bandwidth: float | None
        if override:
            bandwidth, source = override, "override"
        elif known:
            bandwidth, source = known.bandwidth, "table"
        else:
            bandwidth, source = None, "unknown"
            notes.append(f"The memory bandwidth of {label} is not known: set bandwidth_override_gbps in "
                         f"{settings_path()} (or pass doctor --gpu-bandwidth) to get a ceiling for it.")
        mem = memory.get(dev.name)
        gpus.append(GPUInfo(
            index=len(gpus), name=label, vendor=guess_vendor(label),
            memory_total=mem.total if mem else None, memory_used=mem.used if mem else None,
            memory_free=mem.free if mem else None, process_memory=None, bus_width_bits=None,
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
    measure: bool = True,
    retake_busy: bool = True,
) -> HardwareReport:
    """Everything doctor and the dashboard need. Overrides are bytes/s from the user's settings. `measure`
    False: the CPU's cached rates only; `retake_busy` False: a cached probe is never taken again (see
    ``probe_cpu``)."""
    cpu = probe_cpu(refresh=refresh, cache_path=cache_path, bandwidth_override=cpu_bandwidth_override,
                    measure=measure, retake_busy=retake_busy)
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
