"""`specdeck doctor`: the backend, the devices and their bandwidth, and the ceiling for a model.

llama.cpp is never loaded in this process: the backend probe and the decode check run in child
processes, so a build that traps (SIGILL) or aborts gives a clear sentence instead of killing doctor.
A bad model file is refused by the bounded GGUF reader before llama.cpp sees it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app import __version__
from app.library.compat import VocabInfo, check_compatible
from app.engine.params import KV_TYPES
from app.errors import AppError, ModelFileError
from app.library.gguf_reader import GGUFInfo, read_gguf_info
from app.ceiling.hardware import (
    BackendInfo,
    HardwareReport,
    cpu_probe_worker,
    describe_exit,
    doctor_command,
    probe_backend,
    probe_backend_isolated,
    probe_hardware,
    roofline_devices,
    specdeck_env,
)
from app.ceiling.roofline import (
    CeilingModel,
    Device,
    ModelShape,
    PassEstimate,
    estimate_pass,
    expected_tokens_per_pass,
    fit_estimate,
    kv_bytes_per_token,
    kv_bytes_read,
    kv_cache_bytes,
    make_calibration,
)

SCHEMA = 1
DEFAULT_CTX = 4096
DEFAULT_DRAFT_K = 4
CHECK_CTX = 512
CHECK_TOKENS = 16  # timed single-token decodes after the first, for the calibration
CHECK_BUDGET_S = 3.0  # a large model on a slow machine is timed on fewer tokens
CHECK_TIMEOUT_S = 300.0
CHECK_PROMPT = "The capital of France is"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, metavar="PATH",
                        help="the target model (GGUF) to work out the ceiling for")
    parser.add_argument("--drafter", type=Path, metavar="PATH", help="a drafter model (GGUF) to check and include")
    parser.add_argument("--ctx", type=int, default=None, metavar="N",
                        help=f"context length (default: {DEFAULT_CTX}, or the model's if smaller)")
    parser.add_argument("--kv-type", choices=KV_TYPES, default="f16", metavar="T",
                        help=f"KV cache type: {', '.join(KV_TYPES)} (default f16)")
    parser.add_argument("--gpu-layers", type=int, default=-1, metavar="N",
                        help="layers offloaded to the GPU (default -1: all)")
    parser.add_argument("--draft-k", type=int, default=DEFAULT_DRAFT_K, metavar="K",
                        help=f"draft depth for the speculative pass estimate (default {DEFAULT_DRAFT_K})")
    parser.add_argument("--gpu-bandwidth", type=float, default=None, metavar="GB/S",
                        help="use this GPU memory bandwidth instead of the spec sheet's")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="write the report as JSON (to stdout, or to FILE)")
    parser.add_argument("--decode-check", action="store_true",
                        help="load the model (or the first demo model) in a child process and decode tokens")
    parser.add_argument("--refresh", action="store_true",
                        help="measure the CPU again instead of using the cached probe")
    # Child-process entry points (see app.ceiling.hardware); not for users.
    parser.add_argument("--backend-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-probe-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe-threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--probe-bytes", type=int, default=128 << 20, help=argparse.SUPPRESS)
    parser.add_argument("--decode-worker", type=Path, default=None, help=argparse.SUPPRESS)


def fail(message: str) -> int:
    print(f"specdeck doctor: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.backend_json:
        print(json.dumps(probe_backend().to_dict()), flush=True)
        return 0
    if args.cpu_probe_json:
        return cpu_probe_worker(args.probe_threads, args.probe_bytes)
    if args.decode_worker is not None:
        return decode_worker(args.decode_worker, args.gpu_layers)
    try:
        report, ok = build_report(args)
    except AppError as exc:
        return fail(_one_line(str(exc)))
    except OSError as exc:
        return fail(_one_line(f"could not read a file: {exc}"))
    out = args.json
    if out is not None:
        text = json.dumps(report, indent=2, allow_nan=False)
        if out == "-":
            print(text)
        else:
            try:
                Path(out).write_text(text + "\n")
            except OSError as exc:
                return fail(_one_line(f"could not write {out}: {exc.strerror or exc}"))
            print(render_text(report))
    else:
        print(render_text(report))
    if not ok:
        check = report.get("decode_check") or {}
        reason = check.get("message") or "unknown reason"
        print(f"specdeck doctor: decode check failed: {reason}", file=sys.stderr)
        return 1
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- the report ---------------------------------------------------------------------------------


def read_model(path: Path, role: str) -> GGUFInfo:
    """The header of a model file, or a ModelFileError saying in one sentence why it cannot be used."""
    if not path.exists():
        raise ModelFileError(f"the {role} model {path} does not exist.")
    if path.is_dir():
        raise ModelFileError(f"the {role} model {path} is a folder, not a GGUF file.")
    try:
        info = read_gguf_info(path)
    except (ValueError, OverflowError, UnicodeError, MemoryError) as exc:  # the reader's own errors are typed
        raise ModelFileError(f"{path.name} could not be read as a GGUF model ({exc}).") from exc
    if info.kind != "model":
        raise ModelFileError(f"{path.name} is a {info.kind} file, not a model: choose the model's own GGUF.")
    if info.missing_shards:
        raise ModelFileError(f"{path.name} is split and {len(info.missing_shards)} of its parts are missing "
                             f"(first: {info.missing_shards[0]}).")
    if info.n_layer <= 0 or info.tensor_bytes <= 0:
        raise ModelFileError(f"{path.name} has no layers or no tensor data; it is not a usable model.")
    return info


def model_block(info: GGUFInfo, shape: ModelShape, ctx: int, kv_type: str) -> dict[str, Any]:
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
        "devices": [asdict(d) for d in devices],
        "notes": list(hw.notes),
    }


def compatibility(target: GGUFInfo, drafter: GGUFInfo) -> dict[str, Any]:
    """llama.cpp's drafter checks on the two headers (vocab type, BOS/EOS, sizes, token texts)."""
    result = check_compatible(VocabInfo.from_gguf(target), VocabInfo.from_gguf(drafter))
    return {"checked": True, "compatible": result.ok, "check": result.check, "confirmed": result.confirmed,
            "message": _one_line(result.reason)}


def build_report(args: argparse.Namespace,
                 check: Callable[[Path, int], dict[str, Any]] | None = None) -> tuple[dict[str, Any], bool]:
    """The whole report as plain JSON values, and whether the decode check (if asked for) passed."""
    if args.ctx is not None and args.ctx < 16:
        raise AppError(f"--ctx must be at least 16, not {args.ctx}.")
    if args.draft_k < 0 or args.draft_k > 32:
        raise AppError(f"--draft-k must be between 0 and 32, not {args.draft_k}.")
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
    target = read_model(target_path, "target") if target_path is not None else None
    drafter = read_model(args.drafter, "drafter") if args.drafter is not None else None

    backend = probe_backend_isolated()
    override = args.gpu_bandwidth * 1e9 if args.gpu_bandwidth else None
    hw = probe_hardware(backend=backend, gpu_bandwidth_override=override, refresh=args.refresh)
    devices = roofline_devices(hw)
    report: dict[str, Any] = {"schema": SCHEMA, "specdeck": __version__, **hardware_block(hw, devices)}
    ctx = args.ctx or min(DEFAULT_CTX, target.context_length if target and target.context_length else
                          DEFAULT_CTX)
    report["settings"] = {"ctx": ctx, "kv_type": args.kv_type, "gpu_layers": args.gpu_layers,
                          "draft_k": args.draft_k}
    report.update({"target": None, "drafter": None, "ceiling": None, "speculative": None, "fit": None,
                   "compatibility": None, "decode_check": None})
    plain: PassEstimate | None = None
    if target is not None:
        shape = ModelShape.from_gguf(target)
        report["target"] = model_block(target, shape, ctx, args.kv_type)
        plain = estimate_pass(shape, devices, ctx, type_k=args.kv_type, n_gpu_layers=args.gpu_layers)
        report["ceiling"] = pass_block(plain)
        d_shape = ModelShape.from_gguf(drafter) if drafter is not None else None
        fit = fit_estimate(shape, devices, ctx, type_k=args.kv_type, n_gpu_layers=args.gpu_layers,
                           drafter=d_shape)
        report["fit"] = {
            "fits": fit.fits, "message": fit.message,
            "devices": [{"device": d.device, "name": d.name, "weights": d.weights, "kv": d.kv,
                         "compute": d.compute, "need": d.need, "free": d.free, "fits": d.fits,
                         "short_by": d.short_by} for d in fit.devices],
        }
        if drafter is not None and d_shape is not None:
            report["drafter"] = model_block(drafter, d_shape, ctx, args.kv_type)
            report["compatibility"] = compatibility(target, drafter)
            k = args.draft_k
            spec = estimate_pass(shape, devices, ctx, tokens=k + 1, type_k=args.kv_type,
                                 n_gpu_layers=args.gpu_layers, drafter=d_shape, draft_steps=k)
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
        if result.get("ok") and target is not None and result.get("tokens_per_second"):
            # The ceiling at the context the check decoded at (its cache is f16), not at --ctx.
            at = estimate_pass(ModelShape.from_gguf(target), devices, int(result.get("context") or 1),
                               n_gpu_layers=args.gpu_layers)
            cal = make_calibration(float(result["tokens_per_second"]), at.bytes, at.flops,
                                   at.passes_per_second)
            result["calibration"] = {**asdict(cal), "tokens_per_second": cal.tokens_per_second,
                                     "efficiency": cal.efficiency}
        report["decode_check"] = result
        ok = bool(result.get("ok"))
    return report, ok


# --- for the engine and the dashboard -----------------------------------------------------------


def ceiling_model(
    target_path: str | Path, *, drafter_path: str | Path | None = None, kv_type: str = "f16",
    n_gpu_layers: int = -1, gpu_bandwidth_override: float | None = None,
    backend: BackendInfo | None = None,
) -> CeilingModel:
    """The ceiling of a model on this machine, ready to ask at any context. Reads the GGUF headers and
    probes the hardware (the CPU probe is cached; llama.cpp is probed in this process only when it is
    already loaded here, else in a child). Raises ModelFileError for a bad file."""
    target = read_model(Path(target_path), "target")
    drafter = read_model(Path(drafter_path), "drafter") if drafter_path is not None else None
    if backend is None:
        backend = probe_backend() if "llama_cpp" in sys.modules else probe_backend_isolated()
    hw = probe_hardware(backend=backend, gpu_bandwidth_override=gpu_bandwidth_override)
    return CeilingModel(
        target=ModelShape.from_gguf(target), devices=tuple(roofline_devices(hw)), type_k=kv_type,
        n_gpu_layers=n_gpu_layers, drafter=ModelShape.from_gguf(drafter) if drafter is not None else None,
    )


def ceiling_summary(target_path: str | Path, n_ctx: int, *, kv_type: str = "f16",
                    n_gpu_layers: int = -1) -> dict[str, Any]:
    """Plain decoding's ceiling at this context as JSON values (the pass fields of `doctor --json`'s
    "ceiling", plus the devices), for `specdeck bench`."""
    model = ceiling_model(target_path, kv_type=kv_type, n_gpu_layers=n_gpu_layers)
    return {**pass_block(model.plain(n_ctx)), "devices": [asdict(d) for d in model.devices]}


# --- the decode check ---------------------------------------------------------------------------


def decode_check(path: Path, gpu_layers: int = -1, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """Load the model in a child process and decode; a trap, abort or error becomes one sentence."""
    cmd = doctor_command("--decode-worker", str(path), "--gpu-layers", str(gpu_layers))
    base: dict[str, Any] = {"ok": False, "model": str(path), "message": "", "tokens": 0, "seconds": None,
                            "tokens_per_second": None}
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=specdeck_env())
    except subprocess.TimeoutExpired:
        return {**base, "message": f"loading and decoding took longer than {timeout_s:g} s"}
    except OSError as exc:
        return {**base, "message": f"could not start the decode check: {exc}"}
    wall = time.perf_counter() - t
    answer: dict[str, Any] = {}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            break
    if done.returncode == 0 and answer.get("ok"):
        return {**base, **answer, "ok": True, "model": str(path),
                "message": f"loaded and decoded {answer.get('tokens', 0)} tokens in {wall:.1f} s"}
    if answer.get("message"):
        return {**base, "message": _one_line(str(answer["message"]))}
    why = describe_exit(done.returncode)
    tail = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()][-2:]
    if done.returncode < 0 or "CPU instructions" in why:
        message = why if "CPU instructions" in why else f"llama.cpp {why} while loading or decoding"
    else:
        message = f"the decode check {why}"
    if tail and "CPU instructions" not in why:
        message += f" ({' / '.join(tail)})"
    return {**base, "message": _one_line(message)}


def decode_worker(path: Path, gpu_layers: int) -> int:
    """Child process: load the model, decode a short prompt, then up to CHECK_TOKENS single tokens
    (greedy), and print one JSON line. Exit 0 on success, 3 on a failure llama.cpp reported."""
    import ctypes

    import llama_cpp
    import numpy as np
    import psutil

    logs: list[str] = []

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def on_log(level: int, text: bytes, user: Any) -> None:
        logs.append(text.decode(errors="replace"))
        del logs[:-40]

    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))

    def failed(stage: str) -> int:
        last = [ln.strip() for ln in "".join(logs).splitlines() if ln.strip()][-2:]
        detail = f" ({' / '.join(last)})" if last else ""
        print(json.dumps({"ok": False, "stage": stage,
                          "message": f"llama.cpp could not {stage}{detail}"}), flush=True)
        return 3

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = gpu_layers
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        return failed("load the model")
    threads = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = CHECK_CTX
    cp.n_batch = CHECK_CTX
    cp.n_ubatch = CHECK_CTX
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        return failed("create a context")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = CHECK_PROMPT.encode()
    buf = (llama_cpp.llama_token * 64)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, 64, True, False)
    if n <= 0:
        return failed("tokenize the check prompt")
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(buf, n)) != 0:
        return failed("decode the prompt")

    def next_token() -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    one = (llama_cpp.llama_token * 1)()
    one[0] = next_token()
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) != 0:
        return failed("decode a token")
    done = 0
    t = time.perf_counter()
    while done < CHECK_TOKENS and time.perf_counter() - t < CHECK_BUDGET_S:
        one[0] = next_token()
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) != 0:
            return failed("decode a token")
        llama_cpp.llama_synchronize(ctx)
        done += 1
    seconds = time.perf_counter() - t
    print(json.dumps({"ok": True, "tokens": done + 1, "seconds": seconds, "context": n + 1,
                      "tokens_per_second": done / seconds if seconds > 0 else None,
                      "threads": threads}), flush=True)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return 0


# --- text ---------------------------------------------------------------------------------------


def _bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _rate(n: float | None, unit: str) -> str:
    if n is None:
        return "?"
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.1f} {prefix}{unit}"
    return f"{n:.0f} {unit}"


def render_text(r: dict[str, Any]) -> str:
    out: list[str] = [f"SpecDeck {r['specdeck']} doctor"]
    add = out.append
    b = r.get("backend") or {}
    if b.get("available"):
        add(f"llama.cpp    {b['llama_cpp'] or '?'} (ggml {b['ggml_version'] or '?'}, commit "
            f"{b['ggml_commit'] or '?'}), llama-cpp-python {b['llama_cpp_python']}")
        add(f"backend      {b['backend']}" + ("" if b["gpu_offload"] else " (no GPU offload in this build)"))
        add(f"CPU features {' '.join(b['cpu_features']) or '?'}")
        add("devices      " + ", ".join(f"{d['name']} ({d['description']})" for d in b["devices"]))
    else:
        add(f"llama.cpp    not usable: {b.get('error') or 'not probed'}")
    c = r["cpu"]
    add(f"CPU          {c['model']}: {c['physical_cores']} cores, {c['logical_cores']} threads; RAM "
        f"{_bytes(c['ram_total'])} ({_bytes(c['ram_available'])} available)")
    add(f"             memory {_rate(c['bandwidth'], 'B/s')} ({c['bandwidth_source']}), compute "
        f"{_rate(c['peak_flops'], 'FLOP/s')} (measured peak)"
        + (" [cached probe]" if c["probe_cached"] else ""))
    if r["gpus"]:
        for g in r["gpus"]:
            add(f"GPU {g['index']}        {g['name']}: {_bytes(g['memory_free'])} free of "
                f"{_bytes(g['memory_total'])}, memory {_rate(g['bandwidth'], 'B/s')} "
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
            f"{_bytes(m['weight_bytes'])} of weights, {m['n_params'] / 1e6:.1f} M parameters, "
            f"trained context {m['n_ctx_train']}")
        swa = f", {m['swa_layer_count']} sliding-window layers" if m["swa_layer_count"] else ""
        add(f"KV cache     {s['kv_type']}: {m['kv_bytes_per_token']:,} B/token{swa}; at {s['ctx']} tokens "
            f"{_bytes(m['kv_bytes_at_context'])} read per pass, {_bytes(m['kv_cache_bytes'])} allocated")
    ceil = r.get("ceiling")
    if ceil:
        add(f"per pass     {_bytes(ceil['bytes_per_pass'])} read, {_rate(ceil['flops_per_pass'], 'FLOP')}")
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
    compat = r.get("compatibility")
    if compat:
        verdict = "yes" if compat["compatible"] else ("no" if compat["checked"] else "not checked")
        add(f"drafter fits {verdict}: {compat['message']}")
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
                add(f"delivered    {_rate(cal['delivered_bandwidth'], 'B/s')}, "
                    f"{_rate(cal['delivered_flops'], 'FLOP/s')}{eff}")
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
