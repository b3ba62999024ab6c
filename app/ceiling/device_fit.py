"""Refuse, before llama.cpp tries, to put more weights on a GPU than the memory that GPU reports in all.

What llama.cpp does with an allocation beyond a device's memory depends on the driver: CUDA fails the load
cleanly, a Vulkan driver may abort the process, and Mesa's llvmpipe allocates system RAM well past the
memory it reports. So the engine compares the roofline's weights per device with each device's total memory
(ggml_backend_dev_memory) first, and names the numbers and the way out in one sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.ceiling.backend import BackendDevice
from app.ceiling.fit import fit_estimate
from app.ceiling.memory import offload_devices
from app.ceiling.roofline import Device, ModelShape
from app.library.gguf_reader import GGUFInfo
from app.units import format_bytes


def device_fit_error(target: GGUFInfo, n_gpu_layers: int, n_ctx: int, devices: Sequence[BackendDevice],
                     *, kv_type: str = "f16", drafter: GGUFInfo | None = None,
                     main_gpu: int | None = None, rpc_servers: Sequence[str] | None = None) -> str | None:
    """Why these weights cannot go on these GPUs (one sentence), or None when they can or there is no GPU.
    ``main_gpu``: the one GPU chosen (an index into llama.cpp's GPUs), else all of them share the layers.
    ``rpc_servers``: the RPC servers of this load (their devices come first, as llama.cpp orders them)."""
    gpus = list(offload_devices(devices, rpc_servers))
    if main_gpu is not None:
        gpus = gpus[main_gpu:main_gpu + 1] if main_gpu >= 0 else []
    gpus = [d for d in gpus if d.memory_total]
    if not gpus or n_gpu_layers == 0:
        return None
    roof = [Device("cpu", "CPU", "cpu", 1.0)] + [
        Device(f"gpu{i}", f"{d.name} ({d.description})" if d.description else d.name, "gpu", 1.0,
               free_bytes=d.memory_free) for i, d in enumerate(gpus)
    ]
    shape = ModelShape.from_gguf(target)
    fit = fit_estimate(shape, roof, n_ctx, type_k=kv_type, n_gpu_layers=n_gpu_layers,
                       drafter=ModelShape.from_gguf(drafter) if drafter is not None else None,
                       drafter_gpu_layers=n_gpu_layers)
    total = {f"gpu{i}": d.memory_total or 0 for i, d in enumerate(gpus)}
    for d in fit.devices:
        if d.device in total and d.weights > total[d.device]:
            per_layer = shape.weight_bytes / (shape.n_layer + 1)
            layers = max(0, int(total[d.device] * 0.8 // per_layer)) if per_layer else 0
            return (f"{Path(target.path).name} needs {format_bytes(d.weights)} of weights on {d.name}, which has "
                    f"{format_bytes(total[d.device])} of memory in all: load at most about {layers} GPU layers, "
                    "or a smaller model.")
    return None


def fit_devices(devices: Sequence[BackendDevice], main_gpu: int | None = None,
                rpc_servers: Sequence[str] | None = None) -> list[Device]:
    """The fit estimate's devices for a load on llama.cpp's devices as the engine worker listed them: the CPU
    (system RAM available now) and the devices the layers would go to (``offload_devices``; the one GPU chosen,
    or all of them, RPC servers first), each with the free memory llama.cpp reports (bandwidths do not matter
    to a fit)."""
    import psutil

    chosen = offload_devices(devices, rpc_servers)
    if main_gpu is not None:
        chosen = chosen[main_gpu:main_gpu + 1]
    return [Device("cpu", "CPU", "cpu", 1.0, free_bytes=int(psutil.virtual_memory().available))] + [
        Device(d.name, f"{d.name} ({d.description})" if d.description else d.name, "gpu", 1.0,
               free_bytes=d.memory_free) for d in chosen
    ]
