"""Memory in use now: VRAM per GPU (NVML) and system RAM, polled about once a second for the dashboard."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from app.ceiling.gpus import probe_nvidia


@dataclass(frozen=True)
class GpuMemory:
    index: int
    name: str
    total: int
    used: int
    ours: int | None = None  # this process and the engine worker


@dataclass(frozen=True)
class MemoryReading:
    gpus: tuple[GpuMemory, ...]
    ram_total: int
    ram_used: int
    process_rss: int


class MemoryProbe:
    """VRAM per GPU (app.ceiling.gpus' NVML probe) and system RAM (psutil). Poll at ~1 Hz, not per pass."""

    def __init__(self, probe_gpus: Callable[[], Sequence[GpuMemory]] | None = None) -> None:
        self._probe_gpus = probe_gpus or _nvidia_memory
        self._gpu_ok = True  # stop asking NVML once it said there is nothing

    def read(self) -> MemoryReading:
        gpus: tuple[GpuMemory, ...] = ()
        if self._gpu_ok:
            gpus = tuple(self._probe_gpus())
            self._gpu_ok = bool(gpus)
        vm = psutil.virtual_memory()
        rss = int(psutil.Process(os.getpid()).memory_info().rss)
        return MemoryReading(gpus, int(vm.total), int(vm.total - vm.available), rss)


def _nvidia_memory() -> tuple[GpuMemory, ...]:
    try:
        probe = probe_nvidia()
    except Exception:
        return ()
    return tuple(
        GpuMemory(g.index, g.name, g.memory_total, g.memory_used or 0, g.process_memory)
        for g in probe.gpus if g.memory_total
    )
