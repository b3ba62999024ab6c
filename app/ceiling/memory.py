"""Memory per device, the one place it is worked out, for doctor and the dashboard alike.

NVIDIA GPUs are read through NVML (device-wide use, and this process's share). Every other device llama.cpp
runs on (Vulkan, Metal, CUDA without NVML, and the CPU itself) is read from llama.cpp's own report,
``ggml_backend_dev_memory``. The window never loads llama.cpp, so ``MemoryProbe`` asks a child process for
that report, in the background and at most every few seconds; NVML and system RAM are polled at ~1 Hz.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import psutil

from app.ceiling.backend import BackendDevice
from app.ceiling.gpus import GPUInfo, normalize_name, probe_nvidia
from app.events import Loaded

LLAMA_REFRESH_S = 5.0  # a child that loads llama.cpp costs about a second of CPU: not at every poll


@dataclass(frozen=True)
class GpuMemory:
    """One device's memory: a GPU, or llama.cpp's CPU device (``kind`` "cpu", whose report is system RAM)."""

    index: int
    name: str
    total: int
    used: int | None  # None: the device reports all of its memory free, i.e. it does not report its use
    ours: int | None = None  # this process and the engine worker (NVML only)
    device: str = ""  # llama.cpp's name for it ("Vulkan0", "CUDA0", "CPU"), when llama.cpp lists it
    kind: str = "gpu"  # "gpu", "igpu" or "cpu"
    source: str = "nvml"  # "nvml" or "llama.cpp"
    placed: int | None = None  # the loaded models' weights + KV cache on this device, as llama.cpp places them

    @property
    def free(self) -> int:
        return self.total if self.used is None else max(0, self.total - self.used)


@dataclass(frozen=True)
class MemoryReading:
    gpus: tuple[GpuMemory, ...]
    ram_total: int
    ram_used: int
    process_rss: int


def offload_devices(devices: Sequence[BackendDevice], rpc_servers: Sequence[str] | None = None,
                    ) -> tuple[BackendDevice, ...]:
    """The devices llama.cpp offloads layers to, in its order (``main_gpu`` indexes these): RPC servers first,
    then the discrete GPUs, or, when there is none, the integrated ones of the first backend that has one
    (llama.cpp's default). ``rpc_servers``: only these servers' devices, in this order (None: every one)."""
    rpc = [d for d in devices if is_rpc(d)]
    if rpc_servers is not None:
        rpc = [d for server in rpc_servers for d in rpc if d.description == server]
    gpus = tuple(d for d in devices if d.type == "gpu" and not is_rpc(d))
    if gpus:
        return (*rpc, *gpus)
    igpus = [d for d in devices if d.type == "igpu"]
    return (*rpc, *(d for d in igpus if d.backend == igpus[0].backend))


def is_rpc(device: BackendDevice) -> bool:
    """A device of llama.cpp's RPC backend: a server's ("RPC0", described by its endpoint host:port)."""
    return device.backend == "RPC"


def placement(devices: Sequence[BackendDevice], one_gpu: bool = False) -> str:
    """Where a load puts its layers, in words: the devices it offloads to (none: the CPU), ``one_gpu`` when
    that one was chosen alone."""
    if not devices:
        return "layers on the CPU"
    names = ", ".join(f"{d.name} ({d.description})" if d.description else d.name for d in devices)
    if one_gpu:
        return f"layers on {names} alone (one GPU chosen)"
    return f"layers split by free memory over {names}" if len(devices) > 1 else f"layers on {names}"


def match_backend_gpus(nvidia: Sequence[GPUInfo], devices: Sequence[BackendDevice]) -> dict[int, int]:
    """Which NVML GPU (by position in ``nvidia``) each llama.cpp GPU (by position in ``devices``) is."""
    unclaimed = list(range(len(nvidia)))
    matches: dict[int, int] = {}
    for i, dev in enumerate(devices):
        if dev.type not in ("gpu", "igpu"):
            continue
        label = dev.description or dev.name
        match = next((j for j in unclaimed if normalize_name(nvidia[j].name) == normalize_name(label)), None)
        if match is None and dev.backend.upper() == "CUDA" and unclaimed:
            match = unclaimed[0]  # CUDA numbers devices as NVML does (unless CUDA_VISIBLE_DEVICES says otherwise)
        if match is not None:
            unclaimed.remove(match)
            matches[i] = match
    return matches


def device_memory(nvidia: Sequence[GPUInfo], devices: Sequence[BackendDevice]) -> tuple[GpuMemory, ...]:
    """Every device's memory: NVML's GPUs first (named for llama.cpp's device where it uses them), then each
    device only llama.cpp reports. A device that reports no total is left out."""
    matches = match_backend_gpus(nvidia, devices)
    by_gpu = {j: devices[i].name for i, j in matches.items()}
    out: list[GpuMemory] = [
        GpuMemory(g.index, g.name, g.memory_total, g.memory_used or 0, g.process_memory, by_gpu.get(j, ""))
        for j, g in enumerate(nvidia) if g.memory_total
    ]
    for i, dev in enumerate(devices):
        if i in matches or not dev.memory_total:
            continue
        # A device that reports all of its memory free reports no use at all: ggml's CPU device on Linux, and
        # a Vulkan driver without the memory-budget extension (llvmpipe: free = total with a model on it).
        free = dev.memory_free if dev.memory_free is not None else dev.memory_total
        out.append(GpuMemory(
            index=len(out), name=dev.description or dev.name, total=dev.memory_total,
            used=dev.memory_total - free if free < dev.memory_total else None, device=dev.name,
            kind=dev.type if dev.type in ("gpu", "igpu") else "cpu", source="llama.cpp",
        ))
    return tuple(out)


def placed_bytes(target: str, drafter: str | None, n_ctx: int, kv_bytes_total: int, gpu_offload: bool,
                 devices: Sequence[GpuMemory], used: Sequence[str] | None = None,
                 n_gpu_layers: int = -1) -> dict[str, int]:
    """Weights + KV cache of the loaded models per llama.cpp device name, as the roofline's fit places them
    (``n_gpu_layers`` of the target's layers offloaded when the engine offloads, -1 all; the drafter goes with
    them, as the automatic choice places it), with the KV cache llama.cpp really allocated.
    ``used``: the names of the devices the load offloaded to (None: every GPU)."""
    from app.ceiling.fit import fit_estimate
    from app.ceiling.roofline import Device, ModelShape
    from app.library.gguf_reader import read_gguf_info

    gpus = [d for d in devices if d.kind != "cpu" and d.device and (used is None or d.device in used)]
    if used is not None:
        gpus.sort(key=lambda d: list(used).index(d.device))  # llama.cpp's order: RPC servers first
    roof = [Device("CPU", "CPU", "cpu", 1.0)] + [
        Device(d.device, d.name, "gpu", 1.0, free_bytes=d.free) for d in gpus]
    layers = n_gpu_layers if gpu_offload and gpus else 0
    fit = fit_estimate(ModelShape.from_gguf(read_gguf_info(target)), roof, n_ctx, n_gpu_layers=layers,
                       drafter=ModelShape.from_gguf(read_gguf_info(drafter)) if drafter else None,
                       drafter_gpu_layers=-1 if layers else 0)
    kv_estimate = sum(d.kv for d in fit.devices)
    return {d.device: d.weights + (round(kv_bytes_total * d.kv / kv_estimate) if kv_estimate else 0)
            for d in fit.devices}


def llama_devices_isolated() -> tuple[BackendDevice, ...]:
    """llama.cpp's devices with their memory now, asked in a child process (the window never loads it)."""
    from app.ceiling.backend import probe_backend_isolated

    return probe_backend_isolated(timeout_s=60.0).devices


_ONLY_CPU: set[Callable[[], Sequence[BackendDevice]]] = set()  # device probes that found only the CPU


@dataclass(frozen=True)
class LoadedModels:
    """What the dashboard follows: the loaded models, to show their weights and KV cache per device."""

    target: str
    drafter: str | None
    n_ctx: int
    kv_bytes_total: int
    gpu_offload: bool
    # The devices the layers went to, as the worker listed them after the load (an RPC server's memory can
    # be asked only by the worker that holds its connection, so its figures are those of the load).
    devices: tuple[BackendDevice, ...] = ()
    main_gpu: int | None = None
    n_gpu_layers: int = -1  # the target's layers on the GPUs, as llama.cpp was asked (-1: all)

    @classmethod
    def from_loaded(cls, loaded: Loaded) -> LoadedModels:
        return cls(loaded.target.path, loaded.drafter.path if loaded.drafter is not None else None,
                   loaded.n_ctx, loaded.kv_bytes_total, loaded.gpu_offload, loaded.devices, loaded.main_gpu,
                   loaded.n_gpu_layers)

    @property
    def placement(self) -> str:
        """Where the layers are, in words (the dashboard's memory chart says it)."""
        return placement(self.devices, self.main_gpu is not None)


class MemoryProbe:
    """Memory per device (``device_memory``) and system RAM (psutil). Poll at ~1 Hz, not per pass.

    ``probe_gpus`` replaces the whole device probe (tests); otherwise NVML is asked at each read and, while a
    model is offloaded to a GPU, llama.cpp's report is refreshed by ``llama_devices`` in a background thread at
    most every ``LLAMA_REFRESH_S``.
    """

    def __init__(self, probe_gpus: Callable[[], Sequence[GpuMemory]] | None = None, *,
                 llama_devices: Callable[[], Sequence[BackendDevice]] | None = llama_devices_isolated,
                 nvidia: Callable[[], Sequence[GPUInfo]] | None = None) -> None:
        self._probe_gpus = probe_gpus
        self._llama_devices = llama_devices
        self._nvidia = nvidia or _nvidia_gpus
        self._gpu_ok = True  # stop asking once the probe said there is nothing
        self._llama: tuple[BackendDevice, ...] = ()
        # Stop asking llama.cpp once it listed no device but the CPU (for every probe that asks the same way).
        self._llama_ok = llama_devices not in _ONLY_CPU
        self._llama_at = -LLAMA_REFRESH_S
        self._refreshing: threading.Thread | None = None
        self._lock = threading.Lock()
        self._models: LoadedModels | None = None
        self._placed: tuple[LoadedModels, tuple[str, ...], dict[str, int]] | None = None

    def follow(self, models: LoadedModels | None) -> None:
        """The models now loaded (None: none), whose weights and KV cache are shown per device."""
        self._models = models

    def refresh_llama(self, *, wait: bool = False) -> None:
        """Ask llama.cpp for its devices' memory again (in the background unless ``wait``)."""
        if self._llama_devices is None or not self._llama_ok:
            return
        with self._lock:
            if self._refreshing is not None and self._refreshing.is_alive():
                thread = self._refreshing
            else:
                self._llama_at = time.monotonic()
                thread = threading.Thread(target=self._ask_llama, name="llama-device-memory", daemon=True)
                self._refreshing = thread
                thread.start()
        if wait:
            thread.join()

    def _ask_llama(self) -> None:
        assert self._llama_devices is not None
        with contextlib.suppress(Exception):  # a failed probe keeps the last report
            devices = tuple(self._llama_devices())
            self._llama = devices
            self._llama_ok = any(d.type != "cpu" for d in devices)
            if not self._llama_ok:
                _ONLY_CPU.add(self._llama_devices)

    def devices(self) -> tuple[GpuMemory, ...]:
        """Every device's memory, the CPU device included, with the loaded models' share on it."""
        if self._probe_gpus is not None:
            return tuple(self._probe_gpus()) if self._gpu_ok else ()
        models = self._models
        if models is not None and models.gpu_offload and time.monotonic() - self._llama_at >= LLAMA_REFRESH_S:
            self.refresh_llama()  # only while a model is offloaded: a CPU-only load has no device to show
        nvidia: Sequence[GPUInfo] = ()
        if self._gpu_ok:
            nvidia = self._nvidia()
            self._gpu_ok = bool(nvidia)
        servers = tuple(d for d in models.devices if is_rpc(d)) if models is not None else ()
        found = device_memory(nvidia, (*self._llama, *servers))
        placed = self._placed_for(found)
        if not placed:
            return found
        return tuple(replace(g, placed=placed.get(g.device)) for g in found)

    def _placed_for(self, found: Sequence[GpuMemory]) -> dict[str, int]:
        models = self._models
        if models is None:
            return {}
        names = tuple(g.device for g in found if g.device)
        if self._placed is not None and self._placed[:2] == (models, names):
            return self._placed[2]
        try:
            placed = placed_bytes(models.target, models.drafter, models.n_ctx, models.kv_bytes_total,
                                  models.gpu_offload, found, [d.name for d in models.devices] or None,
                                  models.n_gpu_layers)
        except Exception:  # a model file gone or unreadable: no share shown, the rest still is
            placed = {}
        self._placed = (models, names, placed)
        return placed

    def read(self) -> MemoryReading:
        found = self.devices()
        if self._probe_gpus is not None:
            self._gpu_ok = bool(found)
        gpus = tuple(g for g in found if g.kind != "cpu")
        vm = psutil.virtual_memory()
        rss = int(psutil.Process(os.getpid()).memory_info().rss)
        return MemoryReading(gpus, int(vm.total), int(vm.total - vm.available), rss)


def _nvidia_gpus() -> tuple[GPUInfo, ...]:
    try:
        return probe_nvidia().gpus
    except Exception:
        return ()
