"""`specdeck doctor`: the backend, the devices and their bandwidth, and the ceiling for a model.

Argument parsing and printing only: the report is built by ``app.measure.doctor_report`` (llama.cpp runs in child
processes there, so a build that traps or aborts gives a sentence instead of killing doctor).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app import __version__
from app.ceiling.backend import BackendDevice, BackendInfo
from app.ceiling.backend_modules import describe_modules
from app.cli.exit_codes import EXIT_BAD_OPTIONS, EXIT_ERROR
from app.cli.load_options import add_load_arguments, load_settings
from app.errors import AppError
from app.hub.efficiency import record_doctor_report
from app.measure.decode_check import one_line
from app.measure.doctor_report import (
    DEFAULT_CTX,
    DEFAULT_DRAFT_K,
    DoctorOptions,
    DoctorReport,
    ModelFacts,
    build_report,
)
from app.params import K_MAX
from app.safe_text import terminal_safe, terminal_safe_values
from app.units import format_bytes, format_count, format_si


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, metavar="PATH",
                        help="the target model (GGUF) to work out the ceiling for")
    parser.add_argument("--drafter", type=Path, metavar="PATH", help="a drafter model (GGUF) to check and include")
    parser.add_argument("--draft-k", type=int, default=DEFAULT_DRAFT_K, metavar="K",
                        help=f"draft depth for the speculative pass estimate (default {DEFAULT_DRAFT_K})")
    parser.add_argument("--gpu-bandwidth", type=float, default=None, metavar="GB/S",
                        help="use this GPU memory bandwidth instead of the saved setting or the spec sheet's")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="write the report as JSON (to stdout, or to FILE)")
    parser.add_argument("--decode-check", action="store_true",
                        help="load the model (or the first demo model) in a child process and decode tokens")
    parser.add_argument("--refresh", action="store_true",
                        help="measure the CPU again instead of using the cached probe")
    add_load_arguments(parser, ctx_help=f"context length (default: {DEFAULT_CTX}, or the model's if smaller)")
    parser.set_defaults(ctx=None)  # None: the model's own context where it is shorter (doctor_report)


def options_from(args: argparse.Namespace) -> DoctorOptions:
    """The options as doctor's report takes them, every load option among them; SettingsError for a bad one
    (checked as every command checks them, with a stand-in path when no model is given: doctor runs without
    one)."""
    checked = argparse.Namespace(**{**vars(args), "ctx": DEFAULT_CTX if args.ctx is None else args.ctx})
    settings = load_settings(checked, str(args.model) if args.model else "(no model)")
    return DoctorOptions(model=args.model, drafter=args.drafter, ctx=None if args.ctx is None else settings.n_ctx,
                         load=settings, k_max=K_MAX, draft_k=args.draft_k, gpu_bandwidth=args.gpu_bandwidth,
                         decode_check=args.decode_check, refresh=args.refresh)


def fail(message: str) -> int:
    print(f"specdeck doctor: {terminal_safe(one_line(message), one_line=True)}", file=sys.stderr)
    return EXIT_BAD_OPTIONS


def run(args: argparse.Namespace) -> int:
    try:
        report, ok = build_report(options_from(args))
        document = report.as_json()
    except AppError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"could not read a file: {exc}")
    try:
        record_doctor_report(document)  # what `specdeck search` and Find models predict plain speed from
    except (AppError, OSError, ValueError) as exc:
        print(f"specdeck doctor: the measured efficiency was not kept: {one_line(str(exc))}", file=sys.stderr)
    out = args.json
    if out is not None:
        text = json.dumps(document, indent=2, allow_nan=False)
        if out == "-":
            print(text)
        else:
            try:
                Path(out).write_text(text + "\n")
            except OSError as exc:
                return fail(f"could not write {out}: {exc.strerror or exc}")
            print(render_text(report))
    else:
        print(render_text(report))
    if not ok:
        reason = (report.decode_check or {}).get("message") or "unknown reason"
        print(f"specdeck doctor: decode check failed: {terminal_safe(one_line(reason), one_line=True)}",
              file=sys.stderr)
        return EXIT_ERROR
    return 0


def _recurrent_line(m: ModelFacts) -> str:
    """One line on a recurrent or hybrid model's state: its size, the rollback copies, what a pass moves."""
    how = (f"{m.recurrent_snapshots} snapshots + a checkpoint" if m.recurrent_rollback == "snapshots"
           and m.recurrent_state_allocated > m.recurrent_state_bytes * (1 + m.recurrent_snapshots)
           else f"{m.recurrent_snapshots} snapshots" if m.recurrent_rollback == "snapshots"
           else "a checkpoint per drafting pass")
    return (f"state        {m.recurrent_layer_count} recurrent layers: {format_bytes(m.recurrent_state_bytes)} "
            f"per sequence, read and written every pass; rollback by {how}: "
            f"{format_bytes(m.recurrent_state_allocated)} allocated")


def _device_text(d: BackendDevice) -> str:
    """A llama.cpp device with the memory it reports: 'Vulkan0 (llvmpipe ...: 2.15 GB free of 2.15 GB)'."""
    memory = ""
    if d.memory_total:
        memory = f": {format_bytes(d.memory_free or 0)} free of {format_bytes(d.memory_total)}"
    return f"{d.name} ({d.description}{memory})"


def backend_lines(b: BackendInfo | None) -> list[str]:
    """Doctor's lines on llama.cpp's build, its backend and devices, and why there is no GPU where there is none."""
    if b is None or not b.available:
        return [f"llama.cpp    not usable: {(b.error if b else None) or 'not probed'}"]
    # A GPU build on a machine without the GPU: the "no GPU" line below says why, not the build.
    why_cpu = "" if b.gpu_offload else " (no GPU found)" if b.gpu_fallback else " (no GPU offload in this build)"
    out = [f"llama.cpp    {b.llama_cpp or '?'} (ggml {b.ggml_version or '?'}, commit {b.ggml_commit or '?'}), "
           f"llama-cpp-python {b.llama_cpp_python}",
           f"backend      {b.backend}{why_cpu}",
           f"CPU features {' '.join(b.cpu_features) or '?'}"]
    modules = describe_modules(b.modules, b.left_out_modules)
    if modules:
        out.append(f"modules      {modules}")
    out.append("devices      " + ", ".join(_device_text(d) for d in b.devices))
    if b.gpu_fallback:
        out.append(f"no GPU       {b.gpu_fallback}")
    return out


def _model_lines(role: str, m: ModelFacts, kv_type: str, ctx: int) -> list[str]:
    out = [f"{role:<12} {m.name} ({m.architecture}, {m.quantization}): {format_bytes(m.weight_bytes)} of weights, "
           f"{format_count(m.n_params)} parameters, trained context {m.n_ctx_train}"]
    swa = f", {m.swa_layer_count} sliding-window layers" if m.swa_layer_count else ""
    if m.recurrent_layer_count:
        out.append(_recurrent_line(m))
    if m.kv_layer_count:
        out.append(f"KV cache     {kv_type}: {m.kv_bytes_per_token:,} B/token{swa}; at {ctx} tokens "
                   f"{format_bytes(m.kv_bytes_at_context)} read per pass, {format_bytes(m.kv_cache_bytes)} allocated"
                   + (f" ({m.kv_layer_count} attention layers)" if m.recurrent_layer_count else ""))
    else:
        out.append("KV cache     none (no attention layers): the memory does not grow with the context")
    if m.mtp_heads:
        out.append(f"MTP heads: {m.mtp_heads} ({format_bytes(m.mtp_weight_bytes)} of weights, "
                   f"{format_bytes(m.mtp_kv_cache_bytes)} of KV in their own context at {ctx} tokens, both in "
                   "the memory fit); " + (m.mtp_refusal or "draft with them with --mtp"))
    return out


def _decode_check_lines(chk: Mapping[str, Any]) -> list[str]:
    if not chk["ok"]:
        return [f"decode check FAILED: {Path(chk['model']).name}: {chk['message']}"]
    line = f"decode check OK: {Path(chk['model']).name}, {chk['message']}"
    if chk.get("tokens_per_second"):
        line += f"; plain decode {chk['tokens_per_second']:.1f} tok/s"
    out = [line]
    cal = chk.get("calibration")
    if cal:
        eff = f", {cal['efficiency'] * 100:.0f} % of the ceiling" if cal.get("efficiency") else ""
        out.append(f"delivered    {format_si(cal['delivered_bandwidth'], 'B/s')}, "
                   f"{format_si(cal['delivered_flops'], 'FLOP/s')}{eff}")
    return out


def render_text(r: DoctorReport) -> str:
    """The report as doctor prints it; every string in ``r`` is untrusted (GGUF metadata, device names), so
    it is made terminal-safe first."""
    r = terminal_safe_values(r)
    hw = r.hardware
    out: list[str] = [f"SpecDeck {__version__} doctor", *backend_lines(hw.backend)]
    add = out.append
    c = hw.cpu
    add(f"CPU          {c.model}: {c.physical_cores} cores, {c.logical_cores} threads; RAM "
        f"{format_bytes(c.ram_total)} ({format_bytes(c.ram_available)} available)")
    add(f"             memory {format_si(c.bandwidth, 'B/s')} ({c.bandwidth_source}), compute "
        f"{format_si(c.peak_flops, 'FLOP/s')} (measured peak)" + (" [cached probe]" if c.cached else ""))
    for g in hw.gpus:
        add(f"GPU {g.index}        {g.name}: {format_bytes(g.memory_free)} free of {format_bytes(g.memory_total)}, "
            f"memory {format_si(g.bandwidth, 'B/s')} ({g.bandwidth_source})"
            + (f", driver {g.driver_version}" if g.driver_version else ""))
    if not hw.gpus:
        add(f"GPU          none ({hw.nvml_status})")
    for note in hw.notes:
        add(f"note         {note}")
    for role, m in (("target", r.target), ("drafter", r.drafter)):
        if m is not None:
            out += ["", *_model_lines(role, m, r.load.kv_type, r.ctx)]
    ceil = r.ceiling
    if ceil is not None:
        add(f"per pass     {format_bytes(ceil.bytes)} read, {format_si(ceil.flops, 'FLOP')}")
        add(f"ceiling      {ceil.tokens_per_second:.1f} tok/s at context {ceil.context}: {ceil.binding} binds on "
            f"{ceil.binding_device} (memory {ceil.memory_seconds * 1e3:.2f} ms, compute "
            f"{ceil.compute_seconds * 1e3:.2f} ms per pass)")
    spec = r.speculative
    if spec is not None:
        add(f"speculative  k={spec.draft_k}: {spec.pass_estimate.passes_per_second:.1f} passes/s; beats plain "
            f"decoding above {spec.break_even_tokens_per_pass:.2f} tokens per pass; "
            + ", ".join(f"α {x.alpha}: {x.tokens_per_second:.0f} tok/s" for x in spec.leviathan))
    if r.chat_template is not None:
        add(f"chat template {one_line(r.chat_template.message)}")
    if r.compatibility is not None:
        add(f"drafter fits {'yes' if r.compatibility.ok else 'no'}: {one_line(r.compatibility.reason)}")
    if r.gpu_layers is not None:
        add(f"GPU layers   {r.gpu_layers.message}")
    if r.fit is not None:
        add(f"memory fit   {r.fit.message}")
    if r.decode_check is not None:
        out += ["", *_decode_check_lines(r.decode_check)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdeck doctor",
                                     description="backend, devices, bandwidth and the ceiling for a model")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
