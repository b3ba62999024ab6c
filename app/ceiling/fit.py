"""Will it fit? Weights, KV caches, recurrent state and compute buffers per device, against each device's free
memory, placed as llama.cpp places the layers (``app.ceiling.roofline.place``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.ceiling.roofline import KV_PAD, Device, ModelShape, Share, compute_buffer_bytes, kv_cache_bytes, padded, place
from app.units import format_bytes


def share_weight_bytes(shape: ModelShape, share: Share) -> int:
    """The weights llama.cpp allocates on a share's device: its layers' tensors, and the output layer's (with
    its copy of tied token embeddings off the CPU). The input layer is not in any share: it stays in host
    memory (see ``fit_estimate``). Without the tensor table, weights are spread evenly over the layers."""
    if len(shape.layer_bytes) != shape.n_layer:
        return round(shape.weight_bytes * share.weight_fraction(shape.n_layer))
    weights = sum(shape.layer_bytes[i] for i in share.layers)
    if share.output:
        weights += shape.output_bytes + (shape.tied_output_bytes if share.device.kind != "cpu" else 0)
    return weights


@dataclass(frozen=True)
class DeviceFit:
    device: str  # Device.key
    name: str
    weights: int
    kv: int
    compute: int
    free: int | None

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def fits(self) -> bool:
        return self.free is None or self.need <= self.free

    @property
    def short_by(self) -> int:
        return 0 if self.free is None else max(0, self.need - self.free)


@dataclass(frozen=True)
class FitEstimate:
    devices: tuple[DeviceFit, ...]

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    @property
    def message(self) -> str:
        short = [d for d in self.devices if not d.fits]
        b = format_bytes
        if not short:
            return "Fits: " + "; ".join(
                f"{d.name} needs {b(d.need)}" + (f" of {b(d.free)} free" if d.free is not None else "")
                for d in self.devices
            ) + "."
        return " ".join(
            f"Does not fit on {d.name}: needs {b(d.need)} (weights {b(d.weights)}, KV {b(d.kv)}, "
            f"compute {b(d.compute)}) with {b(d.free or 0)} free, {b(d.short_by)} short."
            for d in short
        )


def fit_estimate(
    target: ModelShape,
    devices: Sequence[Device],
    n_ctx: int,
    *,
    type_k: str = "f16",
    type_v: str | None = None,
    n_gpu_layers: int = -1,
    drafter: ModelShape | None = None,
    drafter_n_ctx: int | None = None,
    drafter_gpu_layers: int = -1,
    swa_full: bool = True,
    n_ubatch: int = 512,
    flash_attn: bool = True,
    state_copies: int = 1,
    mtp_kv_bytes: int = 0,
) -> FitEstimate:
    """Weights + both KV caches + compute buffers per device, against each device's free memory.

    A recurrent state counts ``state_copies`` times for the target (the state, its snapshots, a checkpoint)
    and once for the drafter, spread over the devices as its layers are. ``mtp_kv_bytes``: the KV cache of the
    context that runs the target's own MTP heads, on the device of its last layers (the MTP blocks)."""
    need: dict[str, list[int]] = {d.key: [0, 0, 0] for d in devices}
    by_key = {d.key: d for d in devices}
    host = next((d.key for d in devices if d.kind == "cpu"), None)

    def add(shape: ModelShape, ctx: int, layers_on_gpu: int, copies: int = 1) -> None:
        shares = place(shape, devices, layers_on_gpu)
        per_cell = shape.kv_layer_bytes_per_cell(type_k, type_v)
        total_kv = kv_cache_bytes(shape, ctx, type_k, type_v, swa_full=swa_full, n_ubatch=n_ubatch)
        full_kv = padded(ctx, KV_PAD) * per_cell * shape.n_layer
        for share in shares:
            slot = need[share.device.key]
            slot[0] += share_weight_bytes(shape, share)
            layer_kv = padded(ctx, KV_PAD) * per_cell * len(share.layers)
            # SWA layers hold less: scale this device's share of the full-size cache down alike.
            slot[1] += round(layer_kv * (total_kv / full_kv)) if full_kv else 0
            if shape.n_layer:
                slot[1] += round(shape.state_bytes * copies * len(share.layers) / shape.n_layer)
        if host is not None:  # llama.cpp keeps the input layer (token embeddings) in host memory
            need[host][0] += shape.input_bytes
        # The compute buffer lives on the device that runs the output layer.
        main = next((s.device.key for s in shares if s.output), shares[-1].device.key)
        need[main][2] += compute_buffer_bytes(shape, ctx, n_ubatch=n_ubatch, flash_attn=flash_attn)

    add(target, n_ctx, n_gpu_layers, state_copies)
    if mtp_kv_bytes:
        last = place(target, devices, n_gpu_layers)[-1].device.key
        need[last][1] += mtp_kv_bytes
    if drafter is not None:
        add(drafter, drafter_n_ctx or n_ctx, drafter_gpu_layers)
    fits = tuple(
        DeviceFit(key, by_key[key].name, w, kv, comp, by_key[key].free_bytes)
        for key, (w, kv, comp) in need.items()
        if w or kv or comp
    )
    return FitEstimate(fits)
