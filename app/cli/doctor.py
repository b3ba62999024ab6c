"""`specdeck doctor`: the backend, the devices and their bandwidth, and the ceiling for a model.

Argument parsing and printing only: the report is built by ``app.measure.doctor_report`` (llama.cpp runs in child
processes there, so a build that traps or aborts gives a sentence instead of killing doctor).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.ceiling.backend_modules import describe_modules
from app.cli.exit_codes import EXIT_BAD_OPTIONS, EXIT_ERROR
from app.cli.load_options import add_load_arguments, load_settings
from app.errors import AppError
from app.hub.efficiency import record_doctor_report
from app.measure.decode_check import one_line
from app.measure.doctor_report import DEFAULT_CTX, DEFAULT_DRAFT_K, DoctorOptions, build_report
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
    except AppError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"could not read a file: {exc}")
    try:
        record_doctor_report(report)  # what `specdeck search` and Find models predict plain speed from
    except (AppError, OSError, ValueError) as exc:
        print(f"specdeck doctor: the measured efficiency was not kept: {one_line(str(exc))}", file=sys.stderr)
    out = args.json
    if out is not None:
        text = json.dumps(report, indent=2, allow_nan=False)
        if out == "-":
            print(text)
        else:
            try:
                Path(out).write_text(text + "\n")
            except OSError as exc:
                return fail(f"could not write {out}: {exc.strerror or exc}")
            print(render_text(terminal_safe_values(report)))  # GGUF metadata is untrusted
    else:
        print(render_text(terminal_safe_values(report)))  # GGUF metadata is untrusted
    if not ok:
        check = report.get("decode_check") or {}
        reason = check.get("message") or "unknown reason"
        print(f"specdeck doctor: decode check failed: {terminal_safe(one_line(reason), one_line=True)}",
              file=sys.stderr)
        return EXIT_ERROR
    return 0


def _recurrent_line(m: dict[str, Any]) -> str:
    """One line on a recurrent or hybrid model's state: its size, the rollback copies, what a pass moves."""
    how = (f"{m['recurrent_snapshots']} snapshots + a checkpoint" if m["recurrent_rollback"] == "snapshots"
           and m["recurrent_state_allocated"] > m["recurrent_state_bytes"] * (1 + m["recurrent_snapshots"])
           else f"{m['recurrent_snapshots']} snapshots" if m["recurrent_rollback"] == "snapshots"
           else "a checkpoint per drafting pass")
    return (f"state        {m['recurrent_layer_count']} recurrent layers: {format_bytes(m['recurrent_state_bytes'])} "
            f"per sequence, read and written every pass; rollback by {how}: "
            f"{format_bytes(m['recurrent_state_allocated'])} allocated")


def _device_text(d: dict[str, Any]) -> str:
    """A llama.cpp device with the memory it reports: 'Vulkan0 (llvmpipe ...: 2.15 GB free of 2.15 GB)'."""
    memory = ""
    if d.get("memory_total"):
        memory = f": {format_bytes(d.get('memory_free') or 0)} free of {format_bytes(d['memory_total'])}"
    return f"{d['name']} ({d['description']}{memory})"


def backend_lines(b: dict[str, Any]) -> list[str]:
    """Doctor's lines on llama.cpp's build, its backend and devices, and why there is no GPU where there is none."""
    out: list[str] = []
    add = out.append
    if b.get("available"):
        add(f"llama.cpp    {b['llama_cpp'] or '?'} (ggml {b['ggml_version'] or '?'}, commit "
            f"{b['ggml_commit'] or '?'}), llama-cpp-python {b['llama_cpp_python']}")
        # A GPU build on a machine without the GPU: the "no GPU" line below says why, not the build.
        why_cpu = "" if b["gpu_offload"] else (" (no GPU found)" if b.get("gpu_fallback")
                                              else " (no GPU offload in this build)")
        add(f"backend      {b['backend']}{why_cpu}")
        add(f"CPU features {' '.join(b['cpu_features']) or '?'}")
        modules = describe_modules(tuple(b.get("modules") or ()), tuple(b.get("left_out_modules") or ()))
        if modules:
            add(f"modules      {modules}")
        add("devices      " + ", ".join(_device_text(d) for d in b["devices"]))
        if b.get("gpu_fallback"):
            add(f"no GPU       {b['gpu_fallback']}")
    else:
        add(f"llama.cpp    not usable: {b.get('error') or 'not probed'}")
    return out


def render_text(r: dict[str, Any]) -> str:
    out: list[str] = [f"SpecDeck {r['specdeck']} doctor"]
    add = out.append
    out.extend(backend_lines(r.get("backend") or {}))
    c = r["cpu"]
    add(f"CPU          {c['model']}: {c['physical_cores']} cores, {c['logical_cores']} threads; RAM "
        f"{format_bytes(c['ram_total'])} ({format_bytes(c['ram_available'])} available)")
    add(f"             memory {format_si(c['bandwidth'], 'B/s')} ({c['bandwidth_source']}), compute "
        f"{format_si(c['peak_flops'], 'FLOP/s')} (measured peak)"
        + (" [cached probe]" if c["probe_cached"] else ""))
    if r["gpus"]:
        for g in r["gpus"]:
            add(f"GPU {g['index']}        {g['name']}: {format_bytes(g['memory_free'])} free of "
                f"{format_bytes(g['memory_total'])}, memory {format_si(g['bandwidth'], 'B/s')} "
                f"({g['bandwidth_source']})"
                + (f", driver {g['driver_version']}" if g["driver_version"] else ""))
    else:
        add(f"GPU          none ({r['nvml']['status']})")
    for note in r["notes"]:
        add(f"note         {note}")
    s = r["settings"]
    for role in ("target", "drafter"):
        m = r.get(role)
        if not m:
            continue
        add("")
        add(f"{role:<12} {m['name']} ({m['architecture']}, {m['quantization']}): "
            f"{format_bytes(m['weight_bytes'])} of weights, {format_count(m['n_params'])} parameters, "
            f"trained context {m['n_ctx_train']}")
        swa = f", {m['swa_layer_count']} sliding-window layers" if m["swa_layer_count"] else ""
        if m["recurrent_layer_count"]:
            add(_recurrent_line(m))
        if m["kv_layer_count"]:
            add(f"KV cache     {s['kv_type']}: {m['kv_bytes_per_token']:,} B/token{swa}; at {s['ctx']} tokens "
                f"{format_bytes(m['kv_bytes_at_context'])} read per pass, {format_bytes(m['kv_cache_bytes'])} "
                "allocated" + (f" ({m['kv_layer_count']} attention layers)" if m["recurrent_layer_count"] else ""))
        else:
            add("KV cache     none (no attention layers): the memory does not grow with the context")
        if m.get("mtp_heads"):
            add(f"MTP heads: {m['mtp_heads']} ({format_bytes(m['mtp_weight_bytes'])} of weights, "
                f"{format_bytes(m['mtp_kv_cache_bytes'])} of KV in their own context at {s['ctx']} tokens, both in "
                "the memory fit); " + (m["mtp_refusal"] or "draft with them with --mtp"))
    ceil = r.get("ceiling")
    if ceil:
        add(f"per pass     {format_bytes(ceil['bytes_per_pass'])} read, {format_si(ceil['flops_per_pass'], 'FLOP')}")
        add(f"ceiling      {ceil['tokens_per_second']:.1f} tok/s at context {ceil['context']}: "
            f"{ceil['binding']} binds on {ceil['binding_device']} (memory "
            f"{ceil['memory_seconds'] * 1e3:.2f} ms, compute {ceil['compute_seconds'] * 1e3:.2f} ms "
            "per pass)")
    spec = r.get("speculative")
    if spec:
        p = spec["pass"]
        add(f"speculative  k={spec['draft_k']}: {p['passes_per_second']:.1f} passes/s; beats plain decoding "
            f"above {spec['break_even_tokens_per_pass']:.2f} tokens per pass; " + ", ".join(
                f"α {x['alpha']}: {x['tokens_per_second']:.0f} tok/s" for x in spec["leviathan"]))
    template = r.get("chat_template")
    if template:
        add(f"chat template {template['message']}")
    compat = r.get("compatibility")
    if compat:
        verdict = "yes" if compat["compatible"] else ("no" if compat["checked"] else "not checked")
        add(f"drafter fits {verdict}: {compat['message']}")
    layers = r.get("gpu_layers")
    if layers:
        add(f"GPU layers   {layers['message']}")
    fit = r.get("fit")
    if fit:
        add(f"memory fit   {fit['message']}")
    chk = r.get("decode_check")
    if chk:
        add("")
        if chk["ok"]:
            line = f"decode check OK: {Path(chk['model']).name}, {chk['message']}"
            if chk.get("tokens_per_second"):
                line += f"; plain decode {chk['tokens_per_second']:.1f} tok/s"
            add(line)
            cal = chk.get("calibration")
            if cal:
                eff = f", {cal['efficiency'] * 100:.0f} % of the ceiling" if cal.get("efficiency") else ""
                add(f"delivered    {format_si(cal['delivered_bandwidth'], 'B/s')}, "
                    f"{format_si(cal['delivered_flops'], 'FLOP/s')}{eff}")
        else:
            add(f"decode check FAILED: {Path(chk['model']).name}: {chk['message']}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdeck doctor",
                                     description="backend, devices, bandwidth and the ceiling for a model")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
