"""Doctor's report: the machine, the models and their ceiling, as plain JSON values (`doctor --json`'s
schema; `app.cli.doctor` only parses arguments and prints it). Also the ceiling summary bench records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app import __version__
from app.ceiling.backend import probe_backend_isolated
from app.ceiling.builder import ceiling_model, probe_machine
from app.ceiling.fit import fit_estimate
from app.ceiling.hardware import HardwareReport
from app.ceiling.memory import device_memory
from app.ceiling.mtp_heads import mtp_kv_bytes, mtp_weight_bytes
from app.ceiling.roofline import (
    CeilingModel,
    Device,
    ModelShape,
    PassEstimate,
    kv_bytes_per_token,
    kv_bytes_read,
    kv_cache_bytes,
    recurrent_rollback,
)
from app.ceiling.speculation import expected_tokens_per_pass
from app.engine.decode_check import calibrate, decode_check, one_line
from app.engine_limits import DEPTH_CAP
from app.errors import AppError
from app.library.compat import VocabInfo, check_compatible
from app.library.gguf_reader import GGUFInfo
from app.library.heads import mtp_refusal
from app.library.model_file import check_model_file

SCHEMA = 1
DEFAULT_CTX = 4096
DEFAULT_DRAFT_K = 4
GB = 1e9


@dataclass(frozen=True)
class DoctorOptions:
    """What `specdeck doctor` was asked (its command-line flags)."""

    model: Path | None = None
    drafter: Path | None = None
    ctx: int | None = None  # None: DEFAULT_CTX, or the model's trained context if smaller
    kv_type: str = "f16"
    gpu_layers: int = -1
    draft_k: int = DEFAULT_DRAFT_K
    gpu_bandwidth: float | None = None  # GB/s; None: the saved setting, else NVML or the card table
    decode_check: bool = False
    refresh: bool = False
    k_max: int = 0  # the adaptive depth's cap at load: how many recurrent-state snapshots a load asks for


def model_block(info: GGUFInfo, shape: ModelShape, ctx: int, kv_type: str, k_max: int = 0) -> dict[str, Any]:
    rollback = recurrent_rollback(shape, info.architecture, k_max)
    return {
        "path": info.path,
        "name": info.name,
        "architecture": info.architecture,
        "quantization": info.quantization,
        "file_size": info.file_size,
        "weight_bytes": info.tensor_bytes,
        "n_params": info.n_params,
        "n_layer": info.n_layer,
        "n_ctx_train": info.context_length,
        "n_vocab": info.n_vocab,
        "sliding_window": info.sliding_window,
        "swa_layer_count": sum(1 for il in range(shape.n_layer) if shape.is_swa(il)),
        "kv_bytes_per_token": kv_bytes_per_token(shape, kv_type),
        "kv_bytes_at_context": kv_bytes_read(shape, ctx, kv_type),
        "kv_cache_bytes": kv_cache_bytes(shape, ctx, kv_type),
        "kv_layer_count": shape.n_kv_layers,
        "recurrent_layer_count": info.recurrent_layers,
        "recurrent_state_bytes": shape.state_bytes,  # one sequence, one copy
        "recurrent_rollback": rollback.mechanism if shape.state_bytes else None,
        "recurrent_snapshots": rollback.snapshots,
        "recurrent_state_allocated": rollback.allocated_bytes if shape.state_bytes else 0,
        # The model's own MTP heads: their weights (in weight_bytes; loaded only to draft with them) and the KV
        # cache of the second context that runs them.
        "mtp_heads": info.mtp_layers,
        "mtp_weight_bytes": mtp_weight_bytes(info),
        "mtp_kv_cache_bytes": mtp_kv_bytes(info, ctx, kv_type),
        "mtp_refusal": mtp_refusal(info) if info.mtp_layers else None,
    }


def pass_block(est: PassEstimate) -> dict[str, Any]:
    return {
        "tokens": est.tokens,
        "draft_steps": est.draft_steps,
        "context": est.context,
        "bytes_per_pass": est.bytes,
        "weight_bytes": est.target_weight_bytes,
        "kv_bytes": est.target_kv_bytes,
        "drafter_bytes": est.drafter_bytes,
        "flops_per_pass": est.flops,
        "seconds_per_pass": est.seconds,
        "network_seconds": est.network_seconds,
        "memory_seconds": est.memory_seconds,
        "compute_seconds": est.compute_seconds,
        "passes_per_second": est.passes_per_second,
        "tokens_per_second": est.tokens_per_second,
        "binding": est.binding,
        "binding_device": est.binding_device,
        "parts": [
            {"device": p.device, "phase": p.phase, "bytes": p.bytes, "flops": p.flops,
             "memory_seconds": p.memory_seconds, "compute_seconds": p.compute_seconds, "binding": p.binding}
            for p in est.parts
        ],
    }


def hardware_block(hw: HardwareReport, devices: Sequence[Device]) -> dict[str, Any]:
    cpu = hw.cpu
    return {
        "backend": hw.backend.to_dict() if hw.backend is not None else None,
        "cpu": {
            "model": cpu.model, "physical_cores": cpu.physical_cores, "logical_cores": cpu.logical_cores,
            "ram_total": cpu.ram_total, "ram_available": cpu.ram_available, "bandwidth": cpu.bandwidth,
            "bandwidth_source": cpu.bandwidth_source, "peak_flops": cpu.peak_flops,
            "probe_cached": cpu.cached, "probe_seconds": cpu.probe_seconds,
        },
        "nvml": {"status": hw.nvml_status, "driver_version": hw.driver_version},
        "gpus": [asdict(g) for g in hw.gpus],
        # Memory per device, the CPU device included (NVML for NVIDIA GPUs, llama.cpp's report for the rest).
        "memory": [asdict(m) for m in device_memory([g for g in hw.gpus if g.source == "nvml"],
                                                    hw.backend.devices if hw.backend is not None else ())],
        "devices": [asdict(d) for d in devices],
        "notes": list(hw.notes),
    }


def compatibility(target: GGUFInfo, drafter: GGUFInfo) -> dict[str, Any]:
    """llama.cpp's drafter checks on the two headers (vocab type, BOS/EOS, sizes, token texts)."""
    result = check_compatible(VocabInfo.from_gguf(target), VocabInfo.from_gguf(drafter))
    return {"checked": True, "compatible": result.ok, "check": result.check, "confirmed": result.confirmed,
            "message": one_line(result.reason)}


def chat_template_block(info: GGUFInfo) -> dict[str, Any]:
    """Whether the target's own chat template is used, or refused for a fallback format (and why)."""
    from app.engine.template_status import template_status

    status = template_status(info.path)
    return {"ok": status.ok, "fallback": status.fallback, "message": one_line(status.message)}


def build_report(args: DoctorOptions,
                 check: Callable[[Path, int], dict[str, Any]] | None = None) -> tuple[dict[str, Any], bool]:
    """The whole report as plain JSON values, and whether the decode check (if asked for) passed. Raises
    AppError (a ModelFileError for a bad file) with one sentence."""
    if args.ctx is not None and args.ctx < 16:
        raise AppError(f"--ctx must be at least 16, not {args.ctx}.")
    if args.draft_k < 0 or args.draft_k > DEPTH_CAP:
        raise AppError(f"--draft-k must be between 0 and {DEPTH_CAP}, not {args.draft_k}.")
    if args.gpu_bandwidth is not None and not args.gpu_bandwidth > 0:
        raise AppError(f"--gpu-bandwidth must be a positive number of GB/s, not {args.gpu_bandwidth}.")
    target_path: Path | None = args.model
    if target_path is None and args.decode_check:
        from app.library.demo_install import installed_demo_models

        demos = installed_demo_models()
        if not demos:
            raise AppError("no model to check: pass --model PATH or install the demo models with "
                           "`specdeck demo-models`.")
        target_path = demos[0]
    target = check_model_file(target_path, "target") if target_path is not None else None
    drafter = check_model_file(args.drafter, "drafter") if args.drafter is not None else None

    override = args.gpu_bandwidth * GB if args.gpu_bandwidth else None
    hw, devices = probe_machine(backend=probe_backend_isolated(), gpu_bandwidth_override=override,
                                refresh=args.refresh)
    report: dict[str, Any] = {"schema": SCHEMA, "specdeck": __version__, **hardware_block(hw, devices)}
    ctx = args.ctx or min(DEFAULT_CTX, target.context_length if target and target.context_length else
                          DEFAULT_CTX)
    report["settings"] = {"ctx": ctx, "kv_type": args.kv_type, "gpu_layers": args.gpu_layers,
                          "draft_k": args.draft_k}
    report.update({"target": None, "drafter": None, "ceiling": None, "speculative": None, "fit": None,
                   "compatibility": None, "chat_template": None, "decode_check": None})
    model: CeilingModel | None = None
    if target is not None:
        model = ceiling_model(target, drafter_path=drafter, kv_type=args.kv_type, n_gpu_layers=args.gpu_layers,
                              devices=devices)
        report["target"] = model_block(target, model.target, ctx, args.kv_type, args.k_max)
        report["chat_template"] = chat_template_block(target)
        plain = model.plain(ctx)
        report["ceiling"] = pass_block(plain)
        copies = recurrent_rollback(model.target, target.architecture, args.k_max).allocated_bytes // max(
            model.target.state_bytes, 1)
        fit = fit_estimate(model.target, devices, ctx, type_k=args.kv_type, n_gpu_layers=args.gpu_layers,
                           drafter=model.drafter, state_copies=max(copies, 1),
                           mtp_kv_bytes=0 if mtp_refusal(target) else mtp_kv_bytes(target, ctx, args.kv_type))
        report["fit"] = {
            "fits": fit.fits, "message": fit.message,
            "devices": [{"device": d.device, "name": d.name, "weights": d.weights, "kv": d.kv,
                         "compute": d.compute, "need": d.need, "free": d.free, "fits": d.fits,
                         "short_by": d.short_by} for d in fit.devices],
        }
        if drafter is not None and model.drafter is not None:
            report["drafter"] = model_block(drafter, model.drafter, ctx, args.kv_type)
            report["compatibility"] = compatibility(target, drafter)
            k = args.draft_k
            spec = model.speculative(ctx, k)
            report["speculative"] = {
                "draft_k": k,
                "pass": pass_block(spec),
                # Tokens a pass must emit on average for speculation to beat plain decoding's ceiling.
                "break_even_tokens_per_pass": plain.passes_per_second / spec.passes_per_second,
                "leviathan": [
                    {"alpha": a, "tokens_per_pass": expected_tokens_per_pass(a, k),
                     "tokens_per_second": spec.speculative_tokens_per_second(expected_tokens_per_pass(a, k))}
                    for a in (0.5, 0.7, 0.9)
                ],
            }
    ok = True
    if args.decode_check:
        assert target_path is not None
        result = (check or decode_check)(target_path, args.gpu_layers)
        if model is not None:
            calibrate(result, model)
        report["decode_check"] = result
        ok = bool(result.get("ok"))
    return report, ok


# --- for bench ---------------------------------------------------------------------------------


def ceiling_summary(target_path: str | Path, n_ctx: int, *, kv_type: str = "f16",
                    n_gpu_layers: int = -1, network_seconds: float = 0.0) -> dict[str, Any]:
    """Plain decoding's ceiling at this context as JSON values (the pass fields of `doctor --json`'s
    "ceiling", plus the devices), for `specdeck bench`. Probes llama.cpp in this process when it is
    loaded here (the engine worker), else in a child. ``network_seconds``: RPC round trips per pass."""
    model = ceiling_model(target_path, kv_type=kv_type, n_gpu_layers=n_gpu_layers,
                          network_seconds=network_seconds)
    return {**pass_block(model.plain(n_ctx)), "devices": [asdict(d) for d in model.devices]}
