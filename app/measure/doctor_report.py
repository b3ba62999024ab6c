"""Doctor's report: the machine, the models and their ceiling, typed (``DoctorReport``), and written as
`doctor --json`'s schema in one place (``DoctorReport.as_json``); `app.cli.doctor` only parses arguments and
prints it. Also the ceiling summary bench records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__
from app.ceiling.backend import BackendInfo, probe_backend_isolated
from app.ceiling.builder import ceiling_model, probe_machine
from app.ceiling.device_fit import GpuLayers, available_ram, choose_gpu_layers, offload_gpus
from app.ceiling.fit import FitEstimate, fit_estimate
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
from app.ceiling.rpc import network_seconds_per_pass, probe_server
from app.ceiling.speculation import expected_tokens_per_pass
from app.engine_limits import DEPTH_CAP
from app.errors import AppError
from app.library.compat import CompatResult, VocabInfo, check_compatible
from app.library.gguf_reader import GGUFInfo
from app.library.heads import mtp_refusal
from app.library.model_file import check_model_file
from app.measure.decode_check import CHECK_CTX, calibrate, decode_check, one_line
from app.params import ALL_GPU_LAYERS, GPU_LAYER_WORDS, LoadSettings, fit_flash_attention

if TYPE_CHECKING:  # imported only when a target is given: it brings the chat-template renderer
    from app.engine.template_status import TemplateStatus

SCHEMA = 2  # 2: settings holds every load option; gpu_layers says what the fit chose
DEFAULT_CTX = 4096
DEFAULT_DRAFT_K = 4
GB = 1e9


@dataclass(frozen=True)
class DoctorOptions:
    """What `specdeck doctor` was asked (its command-line flags)."""

    model: Path | None = None
    drafter: Path | None = None
    ctx: int | None = None  # None: DEFAULT_CTX, or the model's trained context if smaller
    # The load options, as every command takes them (its n_ctx stands in where ``ctx`` is None).
    load: LoadSettings = field(default_factory=lambda: LoadSettings(target_path=""))
    draft_k: int = DEFAULT_DRAFT_K
    gpu_bandwidth: float | None = None  # GB/s; None: the saved setting, else NVML or the card table
    decode_check: bool = False
    refresh: bool = False
    k_max: int = 0  # the adaptive depth's cap at load: how many recurrent-state snapshots a load asks for


@dataclass(frozen=True)
class ModelFacts:
    """One model's facts at the report's context (`doctor --json`'s "target" and "drafter", field for field)."""

    path: str
    name: str
    architecture: str
    quantization: str
    file_size: int
    weight_bytes: int
    n_params: int
    n_layer: int
    n_ctx_train: int
    n_vocab: int
    sliding_window: int
    swa_layer_count: int
    kv_bytes_per_token: int
    kv_bytes_at_context: int
    kv_cache_bytes: int
    kv_layer_count: int
    recurrent_layer_count: int
    recurrent_state_bytes: int  # one sequence, one copy
    recurrent_rollback: str | None
    recurrent_snapshots: int
    recurrent_state_allocated: int
    # The model's own MTP heads: their weights (in weight_bytes; loaded only to draft with them) and the KV
    # cache of the second context that runs them.
    mtp_heads: int
    mtp_weight_bytes: int
    mtp_kv_cache_bytes: int
    mtp_refusal: str | None


def model_facts(info: GGUFInfo, shape: ModelShape, ctx: int, kv_type: str, k_max: int = 0,
                rollback_setting: str = "auto") -> ModelFacts:
    rollback = recurrent_rollback(shape, info.architecture, k_max, rollback_setting)
    return ModelFacts(
        path=info.path, name=info.name, architecture=info.architecture, quantization=info.quantization,
        file_size=info.file_size, weight_bytes=info.tensor_bytes, n_params=info.n_params, n_layer=info.n_layer,
        n_ctx_train=info.context_length, n_vocab=info.n_vocab, sliding_window=info.sliding_window,
        swa_layer_count=sum(1 for il in range(shape.n_layer) if shape.is_swa(il)),
        kv_bytes_per_token=kv_bytes_per_token(shape, kv_type), kv_bytes_at_context=kv_bytes_read(shape, ctx, kv_type),
        kv_cache_bytes=kv_cache_bytes(shape, ctx, kv_type), kv_layer_count=shape.n_kv_layers,
        recurrent_layer_count=info.recurrent_layers, recurrent_state_bytes=shape.state_bytes,
        recurrent_rollback=rollback.mechanism if shape.state_bytes else None,
        recurrent_snapshots=rollback.snapshots,
        recurrent_state_allocated=rollback.allocated_bytes if shape.state_bytes else 0,
        mtp_heads=info.mtp_layers, mtp_weight_bytes=mtp_weight_bytes(info),
        mtp_kv_cache_bytes=mtp_kv_bytes(info, ctx, kv_type),
        mtp_refusal=mtp_refusal(info) if info.mtp_layers else None,
    )


@dataclass(frozen=True)
class GpuLayersChoice:
    """What the load's GPU layers come to on these devices, as a load would choose them, and the line that
    says so (`doctor --json`'s "gpu_layers")."""

    asked: str | int  # GPU_LAYER_WORDS' word for auto or all, else the count
    chosen: int
    on_gpus: int
    total: int
    drafter_chosen: int
    message: str
    error: str | None


def gpu_layers_choice(layers: GpuLayers, asked: int, total: int, gpus: int, no_gpu: str = "no GPU",
                      ) -> GpuLayersChoice:
    """The choice, with auto's own line, "all on the CPU: no GPU", or the refusal of a count that does not
    fit. ``no_gpu``: why there is none to put layers on."""
    chosen = layers.n_gpu_layers
    on_gpus = 0 if not gpus else total if chosen == ALL_GPU_LAYERS else min(chosen, total)
    if layers.error:
        message = layers.error
    elif not gpus:
        message = f"{GPU_LAYER_WORDS.get(asked, asked)}: all on the CPU: {no_gpu}"
    elif layers.note:
        message = layers.note.removeprefix("GPU layers ")
    elif on_gpus == 0:
        message = "0: all on the CPU"
    else:
        message = f"{GPU_LAYER_WORDS.get(asked, asked)}: {on_gpus} of {total} on the GPU{'s' if gpus > 1 else ''}"
    return GpuLayersChoice(asked=GPU_LAYER_WORDS.get(asked, asked), chosen=chosen, on_gpus=on_gpus, total=total,
                           drafter_chosen=layers.drafter_gpu_layers, message=message, error=layers.error)


@dataclass(frozen=True)
class LeviathanRow:
    """Speculation's ceiling at one acceptance rate: E[tokens/pass] at the report's depth, and its rate."""

    alpha: float
    tokens_per_pass: float
    tokens_per_second: float


@dataclass(frozen=True)
class SpeculativeCeiling:
    draft_k: int
    pass_estimate: PassEstimate
    # Tokens a pass must emit on average for speculation to beat plain decoding's ceiling.
    break_even_tokens_per_pass: float
    leviathan: tuple[LeviathanRow, ...]


@dataclass(frozen=True)
class DoctorReport:
    """The machine, the settings, the models and their ceiling, the fit, and the decode check's reply."""

    hardware: HardwareReport
    devices: tuple[Device, ...]  # what the roofline sees
    load: LoadSettings
    ctx: int
    draft_k: int
    target: ModelFacts | None = None
    drafter: ModelFacts | None = None
    gpu_layers: GpuLayersChoice | None = None
    ceiling: PassEstimate | None = None
    speculative: SpeculativeCeiling | None = None
    fit: FitEstimate | None = None
    compatibility: CompatResult | None = None  # llama.cpp's drafter checks on the two headers
    chat_template: TemplateStatus | None = None  # the target's own template, or the fallback and why
    decode_check: Mapping[str, Any] | None = None  # the check child's JSON reply, calibrated against the ceiling

    def as_json(self) -> dict[str, Any]:
        """`doctor --json`'s document (SCHEMA): the one place its keys are written."""
        fit = self.fit
        spec = self.speculative
        compat = self.compatibility
        template = self.chat_template
        return {
            "schema": SCHEMA, "specdeck": __version__, **hardware_block(self.hardware, self.devices),
            "settings": settings_block(self.load, self.ctx, self.draft_k),
            "target": asdict(self.target) if self.target else None,
            "drafter": asdict(self.drafter) if self.drafter else None,
            "gpu_layers": asdict(self.gpu_layers) if self.gpu_layers else None,
            "ceiling": pass_block(self.ceiling) if self.ceiling else None,
            "speculative": None if spec is None else {
                "draft_k": spec.draft_k, "pass": pass_block(spec.pass_estimate),
                "break_even_tokens_per_pass": spec.break_even_tokens_per_pass,
                "leviathan": [asdict(row) for row in spec.leviathan]},
            "fit": None if fit is None else {
                "fits": fit.fits, "message": fit.message,
                "devices": [{"device": d.device, "name": d.name, "weights": d.weights, "kv": d.kv,
                             "compute": d.compute, "need": d.need, "free": d.free, "fits": d.fits,
                             "short_by": d.short_by} for d in fit.devices]},
            "compatibility": None if compat is None else {
                "checked": True, "compatible": compat.ok, "check": compat.check, "confirmed": compat.confirmed,
                "message": one_line(compat.reason)},
            "chat_template": None if template is None else {
                "ok": template.ok, "fallback": template.fallback, "message": one_line(template.message)},
            "decode_check": dict(self.decode_check) if self.decode_check is not None else None,
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


def settings_block(load: LoadSettings, ctx: int, draft_k: int) -> dict[str, Any]:
    return {"ctx": ctx, "batch": load.n_batch, "threads": load.n_threads, "gpu_layers": load.n_gpu_layers,
            "main_gpu": load.main_gpu, "kv_type": load.kv_type, "flash_attn": load.flash_attn,
            "rpc_servers": list(load.rpc_servers), "recurrent_rollback": load.recurrent_rollback,
            "draft_k": draft_k}


def build_report(args: DoctorOptions, check: Callable[[Path, LoadSettings], dict[str, Any]] | None = None, *,
                 backend: BackendInfo | None = None, ram_free: int | None = None) -> tuple[DoctorReport, bool]:
    """The whole report, and whether the decode check (if asked for) passed. Raises
    AppError (a ModelFileError for a bad file, an unusable RPC server) with one sentence. ``backend``:
    llama.cpp's build and devices (None: asked in a child); ``ram_free``: the RAM available (None: now)."""
    if args.ctx is not None and args.ctx < 16:
        raise AppError(f"--ctx must be at least 16, not {args.ctx}.")
    if args.draft_k < 0 or args.draft_k > DEPTH_CAP:
        raise AppError(f"--draft-k must be between 0 and {DEPTH_CAP}, not {args.draft_k}.")
    if args.gpu_bandwidth is not None and not args.gpu_bandwidth > 0:
        raise AppError(f"--gpu-bandwidth must be a positive number of GB/s, not {args.gpu_bandwidth}.")
    load = args.load
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

    # RPC servers: each probed here first (one sentence for one that cannot be used; ggml would abort), their
    # round trips the network's cost per pass, their devices listed by the child that asks llama.cpp.
    network = network_seconds_per_pass([probe_server(s) for s in load.rpc_servers])
    override = args.gpu_bandwidth * GB if args.gpu_bandwidth else None
    if backend is None:
        backend = probe_backend_isolated(rpc_servers=load.rpc_servers)
        if load.rpc_servers and not backend.available:
            raise AppError(backend.error or "llama.cpp could not list the RPC servers' devices.")
    hw, devices = probe_machine(backend=backend, gpu_bandwidth_override=override, refresh=args.refresh)
    ctx = args.ctx or min(DEFAULT_CTX, target.context_length if target and target.context_length else
                          DEFAULT_CTX)
    kv_type = load.kv_type
    report = DoctorReport(hardware=hw, devices=tuple(devices), load=load, ctx=ctx, draft_k=args.draft_k)
    model: CeilingModel | None = None
    if target is not None:
        shape = ModelShape.from_gguf(target)
        rollback = recurrent_rollback(shape, target.architecture, args.k_max, load.recurrent_rollback)
        copies = max(1, rollback.allocated_bytes // shape.state_bytes) if shape.state_bytes else 1
        mtp_kv = 0 if mtp_refusal(target) else mtp_kv_bytes(target, ctx, kv_type)
        # The layers a load of these settings puts on the GPUs, chosen as chat, bench and serve choose them.
        layers = choose_gpu_layers(target, load.n_gpu_layers, ctx, backend.devices, kv_type=kv_type,
                                   drafter=drafter, main_gpu=load.main_gpu, rpc_servers=load.rpc_servers,
                                   ram_free=ram_free if ram_free is not None else available_ram(),
                                   mtp=mtp_kv > 0, state_copies=copies, n_batch=load.n_batch)
        gpus = offload_gpus(backend.devices, load.main_gpu, load.rpc_servers)
        every = offload_gpus(backend.devices, None, load.rpc_servers)
        no_gpu = (f"llama.cpp has no GPU {load.main_gpu} (its GPUs: {', '.join(d.name for d in every)})"
                  if every and not gpus else "no GPU")
        n_gpu_layers = layers.n_gpu_layers if gpus else 0
        if load.main_gpu is not None:  # the roofline's GPUs: the one chosen
            names = {d.name for d in gpus}
            keys = {f"gpu{g.index}" for g in hw.gpus if g.backend_device in names}
            devices = [d for d in devices if d.kind == "cpu" or d.key in keys]
        model = ceiling_model(target, drafter_path=drafter, kv_type=kv_type, n_gpu_layers=n_gpu_layers,
                              devices=devices, network_seconds=network)
        plain = model.plain(ctx)
        fit = fit_estimate(model.target, devices, ctx, type_k=kv_type, n_gpu_layers=n_gpu_layers,
                           drafter=model.drafter, drafter_gpu_layers=layers.drafter_gpu_layers if gpus else 0,
                           n_ubatch=load.n_batch, state_copies=copies, mtp_kv_bytes=mtp_kv,
                           flash_attn=fit_flash_attention(load.flash_attn, backend.backend, n_gpu_layers,
                                                          kv_type))
        from app.engine.template_status import template_status

        report = replace(
            report, fit=fit, ceiling=plain, chat_template=template_status(target.path),
            target=model_facts(target, model.target, ctx, kv_type, args.k_max, load.recurrent_rollback),
            gpu_layers=gpu_layers_choice(layers, load.n_gpu_layers, shape.n_layer + 1, len(gpus), no_gpu))
        if drafter is not None and model.drafter is not None:
            k = args.draft_k
            spec = model.speculative(ctx, k)
            rows = tuple(LeviathanRow(a, expected_tokens_per_pass(a, k),
                                      spec.speculative_tokens_per_second(expected_tokens_per_pass(a, k)))
                         for a in (0.5, 0.7, 0.9))
            report = replace(
                report, drafter=model_facts(drafter, model.drafter, ctx, kv_type),
                compatibility=check_compatible(VocabInfo.from_gguf(target), VocabInfo.from_gguf(drafter)),
                speculative=SpeculativeCeiling(k, spec, plain.passes_per_second / spec.passes_per_second, rows))
    ok = True
    if args.decode_check:
        assert target_path is not None
        # The load options as given; the context the check's own unless one was asked for (it times decodes).
        checked = replace(load, target_path=str(target_path), n_ctx=args.ctx or CHECK_CTX)
        result = (check or decode_check)(target_path, checked)
        if model is not None:
            calibrate(result, model, kv_type=kv_type)
        report = replace(report, decode_check=result)
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
