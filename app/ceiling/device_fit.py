"""How many layers go on the GPUs, worked out before llama.cpp tries: the most that fit (``--gpu-layers auto``),
or a refusal of an explicit count that does not.

What llama.cpp does with an allocation beyond a device's memory depends on the driver: CUDA fails the load
cleanly, a Vulkan driver may abort the process, and Mesa's llvmpipe allocates system RAM well past the
memory it reports. So the engine places the weights, the KV cache (with the recurrent state, the MTP heads'
cache and the drafter's) and the compute buffers as llama.cpp will (``fit_estimate``), against the free
memory each device reports now (ggml_backend_dev_memory) and the RAM available, and says what it chose, or
why not, in one sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.ceiling.backend import BackendDevice
from app.ceiling.fit import FitEstimate, fit_estimate
from app.ceiling.memory import offload_devices
from app.ceiling.mtp_heads import mtp_kv_bytes
from app.ceiling.roofline import Device, ModelShape, recurrent_rollback
from app.library.gguf_reader import GGUFInfo
from app.params import ALL_GPU_LAYERS, AUTO_GPU_LAYERS, LoadSettings
from app.units import format_bytes

# What ``auto`` leaves free on each GPU: the estimate's error and what the driver allocates beside the model
# (llama.cpp's own --fit leaves 1 GiB); a tenth of a small card's memory at most, so a small card still counts.
AUTO_HEADROOM = 1 << 30
AUTO_HEADROOM_SHARE = 0.1


@dataclass(frozen=True)
class GpuLayers:
    """The layers a load asks llama.cpp to put on its GPUs (the target's and the drafter's), the line that says
    what ``auto`` chose ("" when nothing was chosen or there is no GPU), or why the load cannot go ahead."""

    n_gpu_layers: int
    drafter_gpu_layers: int
    note: str = ""
    error: str | None = None


def offload_gpus(devices: Sequence[BackendDevice], main_gpu: int | None,
                 rpc_servers: Sequence[str] | None) -> list[BackendDevice]:
    """The devices a load's layers go to: the one GPU chosen, or all of them (RPC servers first), each with
    its memory reported."""
    gpus = list(offload_devices(devices, rpc_servers))
    if main_gpu is not None:
        gpus = gpus[main_gpu:main_gpu + 1] if main_gpu >= 0 else []
    return [d for d in gpus if d.memory_total]


def _label(d: BackendDevice) -> str:
    return f"{d.name} ({d.description})" if d.description else d.name


def _free(d: BackendDevice) -> int:
    return d.memory_free if d.memory_free is not None else d.memory_total or 0


def _ram(devices: Sequence[BackendDevice], ram_free: int | None) -> int | None:
    """The RAM the CPU's share must fit in: ``ram_free``, else what llama.cpp's CPU device reports."""
    if ram_free is not None:
        return ram_free
    return next((d.memory_free for d in devices if d.type == "cpu" and d.memory_free), None)


def available_ram() -> int:
    """System RAM available now (psutil), which the CPU's share of a load must fit in."""
    import psutil

    return int(psutil.virtual_memory().available)


def choose_gpu_layers(target: GGUFInfo, n_gpu_layers: int, n_ctx: int, devices: Sequence[BackendDevice], *,
                      kv_type: str = "f16", drafter: GGUFInfo | None = None, main_gpu: int | None = None,
                      rpc_servers: Sequence[str] | None = None, ram_free: int | None = None, mtp: bool = False,
                      state_copies: int = 1, n_batch: int = 512) -> GpuLayers:
    """The GPU layers for a load of ``target`` (and ``drafter``) on llama.cpp's ``devices``.

    ``n_gpu_layers``: AUTO_GPU_LAYERS chooses the most layers whose weights, KV cache and buffers fit in each
    GPU's free memory less a headroom (the drafter all on the GPUs, or none when no target layer fits); -1
    (all) or N is kept, or refused naming the count that fits. ``main_gpu``: the one GPU chosen (an index into
    llama.cpp's GPUs), else all of them share the layers. ``rpc_servers``: the RPC servers of this load (their
    devices come first, as llama.cpp orders them). ``ram_free``: the RAM available (None: the CPU device's
    report). A load whose CPU share does not fit in that RAM is refused."""
    gpus = offload_gpus(devices, main_gpu, rpc_servers)
    auto = n_gpu_layers == AUTO_GPU_LAYERS
    shape = ModelShape.from_gguf(target)
    drafter_shape = ModelShape.from_gguf(drafter) if drafter is not None else None
    total_layers = shape.n_layer + 1  # llama.cpp counts the output layer as one more
    ram = _ram(devices, ram_free)
    roof = [Device("cpu", "CPU", "cpu", 1.0, free_bytes=ram)] + [
        Device(f"gpu{i}", _label(d), "gpu", 1.0, free_bytes=_free(d)) for i, d in enumerate(gpus)]
    extra_kv = mtp_kv_bytes(target, n_ctx, kv_type) if mtp else 0

    def estimate(layers: int, drafter_layers: int) -> FitEstimate:
        return fit_estimate(shape, roof if gpus else roof[:1], n_ctx, type_k=kv_type, n_gpu_layers=layers,
                            drafter=drafter_shape, drafter_gpu_layers=drafter_layers, n_ubatch=n_batch,
                            state_copies=state_copies, mtp_kv_bytes=extra_kv)

    def gpus_fit(fit: FitEstimate, headroom: bool) -> bool:
        for d in fit.devices:
            if d.device == "cpu" or d.free is None:
                continue
            spare = min(AUTO_HEADROOM, round(AUTO_HEADROOM_SHARE * d.free)) if headroom else 0
            if d.need + spare > d.free:
                return False
        return True

    def most_that_fit(headroom: bool, same_for_drafter: bool) -> int:
        """The largest layer count whose GPU shares fit: the GPU's need grows with the count."""
        lo, hi = 0, total_layers
        while lo < hi:
            mid = (lo + hi + 1) // 2
            drafter_layers = mid if same_for_drafter else ALL_GPU_LAYERS
            if gpus_fit(estimate(mid, drafter_layers), headroom):
                lo = mid
            else:
                hi = mid - 1
        return lo

    if auto and not gpus and main_gpu is not None:
        # A GPU index llama.cpp does not have: all layers asked, so the load names the GPUs it has.
        chosen, drafter_layers = ALL_GPU_LAYERS, ALL_GPU_LAYERS
    elif not gpus or n_gpu_layers == 0:
        chosen, drafter_layers = 0, 0
    elif auto:
        chosen = most_that_fit(headroom=True, same_for_drafter=False)
        drafter_layers = ALL_GPU_LAYERS if chosen else 0
        if chosen == total_layers:
            chosen = ALL_GPU_LAYERS
    else:
        chosen, drafter_layers = n_gpu_layers, n_gpu_layers
        fit = estimate(chosen, drafter_layers)
        if not gpus_fit(fit, headroom=False):
            return GpuLayers(chosen, drafter_layers,
                             error=_too_many(target, fit, gpus, most_that_fit(headroom=True, same_for_drafter=True)))
    fit = estimate(chosen, drafter_layers)
    cpu = next((d for d in fit.devices if d.device == "cpu"), None)
    if cpu is not None and not cpu.fits:
        return GpuLayers(chosen, drafter_layers, error=(
            f"{Path(target.path).name} needs {format_bytes(cpu.need)} of system memory "
            f"({format_bytes(cpu.weights)} of weights, {format_bytes(cpu.kv + cpu.compute)} of KV cache and "
            f"buffers) with {_count(chosen, total_layers)} layers on the GPU, and {format_bytes(cpu.free or 0)} "
            "is available: choose a smaller model, a shorter context or a quantized KV cache."))
    note = _chosen_line(fit, chosen, total_layers, gpus) if auto and gpus else ""
    return GpuLayers(chosen, drafter_layers, note)


def _count(layers: int, total: int) -> int:
    return total if layers < 0 else min(layers, total)


def _chosen_line(fit: FitEstimate, chosen: int, total: int, gpus: Sequence[BackendDevice]) -> str:
    """What auto chose, in one line: "GPU layers auto: 31 of 49 on CUDA0 (...) with their KV cache, the rest
    on the CPU; 2.10 GB left on CUDA0"."""
    used = [d for d in fit.devices if d.device != "cpu"]
    if not chosen:
        free = ", ".join(f"{format_bytes(_free(d))} free on {d.name}" for d in gpus)
        return f"GPU layers auto: none fit ({free}), so the model runs on the CPU"
    n = _count(chosen, total)
    where = " and ".join(d.name for d in used)
    rest = ", the rest on the CPU" if n < total else ""
    left = ", ".join(f"{format_bytes(max(0, (d.free or 0) - d.need))} left on {d.name.split(' (')[0]}"
                     for d in used)
    return f"GPU layers auto: {n} of {total} on {where} with their KV cache{rest}; {left}"


def _too_many(target: GGUFInfo, fit: FitEstimate, gpus: Sequence[BackendDevice], fitting: int) -> str:
    """The refusal of an explicit layer count that does not fit, naming the one that does."""
    d = next(d for d in fit.devices if d.device != "cpu" and not d.fits)
    total = gpus[int(d.device.removeprefix("gpu"))].memory_total or 0
    way_out = (f"choose at most {fitting} GPU layers (--gpu-layers {fitting}) or --gpu-layers auto" if fitting
               else "choose --gpu-layers 0 (no GPU layers, the CPU alone) or a smaller model")
    return (f"{Path(target.path).name} needs {format_bytes(d.weights)} of weights on {d.name} and "
            f"{format_bytes(d.kv + d.compute)} of KV cache and buffers, which has {format_bytes(d.free or 0)} "
            f"free of {format_bytes(total)} of memory in all: {way_out}.")


def load_gpu_layers(target: GGUFInfo, settings: LoadSettings, devices: Sequence[BackendDevice], *,
                    drafter: GGUFInfo | None = None, ram_free: int | None = None) -> GpuLayers:
    """``choose_gpu_layers`` for a load's settings: its context, KV cache type, batch, GPU choice, RPC servers,
    MTP heads and the recurrent state's rollback copies at the deepest draft."""
    shape = ModelShape.from_gguf(target)
    k_max = min(settings.draft.k_max, settings.n_batch - 1) if settings.draft.speculative else 0
    plan = recurrent_rollback(shape, target.architecture, k_max, settings.recurrent_rollback)
    copies = max(1, plan.allocated_bytes // shape.state_bytes) if shape.state_bytes else 1
    return choose_gpu_layers(target, settings.n_gpu_layers, settings.n_ctx, devices, kv_type=settings.kv_type,
                             drafter=drafter, main_gpu=settings.main_gpu, rpc_servers=settings.rpc_servers,
                             ram_free=ram_free, mtp=settings.draft.mtp, state_copies=copies,
                             n_batch=settings.n_batch)


def device_fit_error(target: GGUFInfo, n_gpu_layers: int, n_ctx: int, devices: Sequence[BackendDevice],
                     *, kv_type: str = "f16", drafter: GGUFInfo | None = None,
                     main_gpu: int | None = None, rpc_servers: Sequence[str] | None = None) -> str | None:
    """Why this layer count cannot go on these devices (one sentence), or None when it can."""
    return choose_gpu_layers(target, n_gpu_layers, n_ctx, devices, kv_type=kv_type, drafter=drafter,
                             main_gpu=main_gpu, rpc_servers=rpc_servers).error


def fit_devices(devices: Sequence[BackendDevice], main_gpu: int | None = None,
                rpc_servers: Sequence[str] | None = None) -> list[Device]:
    """The fit estimate's devices for a load on llama.cpp's devices as the engine worker listed them: the CPU
    (system RAM available now) and the devices the layers would go to (``offload_devices``; the one GPU chosen,
    or all of them, RPC servers first), each with the free memory llama.cpp reports (bandwidths do not matter
    to a fit)."""
    chosen = offload_devices(devices, rpc_servers)
    if main_gpu is not None:
        chosen = chosen[main_gpu:main_gpu + 1]
    return [Device("cpu", "CPU", "cpu", 1.0, free_bytes=available_ram())] + [
        Device(d.name, _label(d), "gpu", 1.0, free_bytes=d.memory_free) for d in chosen
    ]
