"""The one builder of a model's ceiling on this machine, for doctor, bench and the dashboard alike.

It reads the GGUF headers through the library's model-file check, probes the hardware (the CPU probe is
cached per machine), applies the user's GPU bandwidth override (``bandwidth_override_gbps`` in the settings,
or doctor's ``--gpu-bandwidth``), and hands back a ``CeilingModel`` to ask at any context.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.ceiling.backend import BackendInfo, probe_backend, probe_backend_isolated
from app.ceiling.calibration import Calibration
from app.ceiling.fit import FitEstimate, fit_estimate
from app.ceiling.hardware import HardwareReport, probe_hardware, roofline_devices
from app.ceiling.roofline import CeilingModel, Device, ModelShape
from app.errors import AppError
from app.events import Loaded
from app.library.gguf_reader import GGUFInfo
from app.library.model_file import check_model_file

GB = 1e9
log = logging.getLogger(__name__)


def saved_gpu_bandwidth() -> float | None:
    """The GPU bandwidth override from the saved settings, in bytes/s (None: use NVML or the card table)."""
    from app.storage.settings import load_settings

    try:
        settings, _ = load_settings()
    except (AppError, OSError):
        return None
    gbps = settings.bandwidth_override_gbps
    return gbps * GB if gbps else None


def probe_machine(*, backend: BackendInfo | None = None, gpu_bandwidth_override: float | None = None,
                  refresh: bool = False, nvml: Any = None, measure: bool = True, retake_busy: bool = True,
                  ) -> tuple[HardwareReport, list[Device]]:
    """The hardware report and the devices the roofline sees. Without an explicit override (bytes/s) the
    saved setting applies. ``backend`` None: llama.cpp was not asked, so every GPU with a known bandwidth
    counts. ``nvml``: the pynvml module (a recorded stand-in in tests of machines without a GPU). ``measure``
    False: nothing is measured, the CPU's rates are the cached probe's (or 0)."""
    override = gpu_bandwidth_override if gpu_bandwidth_override is not None else saved_gpu_bandwidth()
    report = probe_hardware(backend=backend, nvml=nvml, gpu_bandwidth_override=override, refresh=refresh,
                            measure=measure, retake_busy=retake_busy)
    return report, roofline_devices(report)


def pair_fit(target: GGUFInfo, drafter: GGUFInfo | None, n_ctx: int, *, kv_type: str = "f16",
             n_gpu_layers: int = -1, flash_attn: bool = True, devices: Sequence[Device] | None = None,
             ) -> FitEstimate:
    """Whether a pair fits this machine's free memory (weights + KV + compute buffers per device).

    Cheap enough to ask on every change of a setting: a fit needs free memory, not rates, so nothing is
    measured (``probe_machine(measure=False)``). Raises ValueError for a model the roofline cannot describe.
    """
    if devices is None:
        devices = probe_machine(measure=False)[1]
    if n_gpu_layers == 0:
        devices = [d for d in devices if d.kind == "cpu"] or list(devices)
    return fit_estimate(ModelShape.from_gguf(target), devices, n_ctx, type_k=kv_type, n_gpu_layers=n_gpu_layers,
                        drafter=ModelShape.from_gguf(drafter) if drafter is not None else None,
                        drafter_gpu_layers=n_gpu_layers, flash_attn=flash_attn)


def this_process_backend() -> BackendInfo:
    """llama.cpp's backend, asked here when this process already holds llama.cpp, else in a child."""
    return probe_backend(rpc_servers=()) if "llama_cpp" in sys.modules else probe_backend_isolated()


def _checked(model: str | Path | GGUFInfo, role: str) -> GGUFInfo:
    return model if isinstance(model, GGUFInfo) else check_model_file(model, role)


def ceiling_model(
    target_path: str | Path | GGUFInfo, *, drafter_path: str | Path | GGUFInfo | None = None,
    kv_type: str = "f16", n_gpu_layers: int = -1, gpu_bandwidth_override: float | None = None,
    backend: BackendInfo | None = None, devices: Sequence[Device] | None = None, network_seconds: float = 0.0,
) -> CeilingModel:
    """The ceiling of a model on this machine (or on ``devices``), ready to ask at any context. The models
    are files (checked here: ModelFileError for one llama.cpp must not be given) or headers already checked."""
    target = _checked(target_path, "target")
    drafter = _checked(drafter_path, "drafter") if drafter_path is not None else None
    if devices is None:
        _, devices = probe_machine(backend=backend or this_process_backend(),
                                   gpu_bandwidth_override=gpu_bandwidth_override)
    return CeilingModel(
        target=ModelShape.from_gguf(target), devices=tuple(devices), type_k=kv_type, n_gpu_layers=n_gpu_layers,
        drafter=ModelShape.from_gguf(drafter) if drafter is not None else None, network_seconds=network_seconds,
    )


# --- for the dashboard --------------------------------------------------------------------------


@dataclass(frozen=True)
class CeilingInfo:
    """Roofline ceilings for the loaded target, as a function of the context length.

    The spec-sheet ceiling (one token per pass) is sampled on a grid of contexts and interpolated, since the
    KV cache a pass reads grows with the context. The measured ceiling is the spec one scaled by the
    calibration's efficiency (delivered / promised), or a flat measured rate when only that is known.
    """

    contexts: tuple[int, ...] = ()
    spec_tps: tuple[float, ...] = ()  # ceiling at one token per pass, per context in `contexts`
    efficiency: float | None = None  # measured / spec, from a calibration
    measured_tps: float | None = None  # flat measured plain-decode rate when there is no spec curve
    device: str = ""  # what the roof was computed for, e.g. "NVIDIA RTX 4090 (1008 GB/s)"
    # Where that bandwidth comes from: "probed" (a CPU's, measured on this machine: it moves between runs) or
    # "spec sheet" (a GPU's, from its specifications or the user's override).
    bandwidth_source: str = ""
    binding: str = ""  # "memory" or "compute"

    def spec_at(self, context: int) -> float | None:
        if not self.contexts:
            return None
        return float(np.interp(context, self.contexts, self.spec_tps))

    def measured_at(self, context: int) -> float | None:
        spec = self.spec_at(context)
        if spec is not None and self.efficiency is not None:
            return spec * self.efficiency
        return self.measured_tps


def _find_devices(loaded: Loaded) -> Sequence[Device] | None:
    """The machine's devices as the roofline sees them. For a model on a GPU, llama.cpp's own device list
    (asked in a child: the GUI never loads llama.cpp) decides which GPUs count, so a Vulkan or Metal GPU
    that NVML cannot see is one of them."""
    try:
        # The cached probe as it is: a roof that moved from one start to the next (a busy probe taken again)
        # read as a change in the model; doctor takes a busy probe again.
        return probe_machine(backend=probe_backend_isolated() if loaded.gpu_offload else None,
                             retake_busy=False)[1]
    except Exception:  # a probe failure means no ceiling, never a broken dashboard
        log.exception("the hardware probe failed; the dashboard shows no ceiling")
        return None


def ceiling_for_loaded(
    loaded: Loaded,
    devices: Sequence[Device] | None = None,
    *,
    kv_type: str = "f16",
    n_gpu_layers: int = -1,
    calibration: Calibration | None = None,
    grid: int = 9,
    find_devices: Callable[[Loaded], Sequence[Device] | None] = _find_devices,
) -> CeilingInfo | None:
    """The ceilings for a loaded target (None when the model or the devices cannot be described).

    Reads the GGUF header (milliseconds) and, without `devices`, probes the hardware: call it off the GUI
    thread.
    """
    if devices is None:
        devices = find_devices(loaded)
    if not devices:
        if calibration is not None:
            return CeilingInfo(measured_tps=calibration.tokens_per_second)
        return None
    if not loaded.gpu_offload:
        n_gpu_layers = 0
        devices = [d for d in devices if d.kind == "cpu"] or devices
    try:
        # Layers on RPC servers: their memory's speed is not known here, so the roof counts them as this
        # machine's devices, plus the round trips every pass makes to them (measured at load).
        model = ceiling_model(loaded.target.path, kv_type=kv_type, n_gpu_layers=n_gpu_layers, devices=devices,
                              network_seconds=loaded.network_seconds)
    except (AppError, OSError):
        return None
    contexts = tuple(int(c) for c in np.linspace(0, max(loaded.n_ctx, 1), max(grid, 2)).round())
    try:
        estimates = [model.plain(c) for c in contexts]
    except ValueError:
        return None
    first = estimates[0]
    binding_dev = next((d for d in devices if d.key == first.binding_device), devices[0])
    efficiency = calibration.efficiency if calibration is not None else None
    return CeilingInfo(
        contexts=contexts,
        spec_tps=tuple(e.tokens_per_second for e in estimates),
        efficiency=efficiency,
        measured_tps=calibration.tokens_per_second if calibration is not None else None,
        device=f"{binding_dev.name} ({binding_dev.bandwidth / GB:.0f} GB/s)",
        binding=first.binding,
        bandwidth_source="probed" if binding_dev.kind == "cpu" else "spec sheet",
    )
