"""The decode check: load a model in a child process, decode a few tokens, and time them; the delivered
rate calibrates the ceiling (what the card promises next to what it delivers).

llama.cpp never runs in the asking process: a trap (SIGILL), an abort or a load failure in the child
becomes one sentence, and the child's stderr (ggml's backtrace attempt included) never reaches a terminal.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.ceiling.child import describe_exit, probe_command, specdeck_env
from app.ceiling.roofline import Device, ModelShape, estimate_pass, make_calibration
from app.library.gguf_reader import GGUFInfo

CHECK_CTX = 512
CHECK_TOKENS = 16  # timed single-token decodes after the first, for the calibration
CHECK_BUDGET_S = 3.0  # a large model on a slow machine is timed on fewer tokens
CHECK_TIMEOUT_S = 300.0
CHECK_PROMPT = "The capital of France is"
QUIET_ABORT_ENV = {"GGML_NO_BACKTRACE": "1"}  # no gdb attach ("No stack.") when ggml aborts


def one_line(text: str) -> str:
    return " ".join(text.split())


def decode_check(path: Path, gpu_layers: int = -1, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """Load the model in a child process and decode; a trap, abort or error becomes one sentence."""
    cmd = probe_command("decode", str(path), "--gpu-layers", str(gpu_layers))
    base: dict[str, Any] = {"ok": False, "model": str(path), "message": "", "tokens": 0, "seconds": None,
                            "tokens_per_second": None}
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=specdeck_env(QUIET_ABORT_ENV))
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
        return {**base, "message": one_line(str(answer["message"]))}
    why = describe_exit(done.returncode)
    tail = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()][-2:]
    if done.returncode < 0 or "CPU instructions" in why:
        message = why if "CPU instructions" in why else f"llama.cpp {why} while loading or decoding"
    else:
        message = f"the decode check {why}"
    if tail and "CPU instructions" not in why:
        message += f" ({' / '.join(tail)})"
    return {**base, "message": one_line(message)}


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


def calibrate(result: dict[str, Any], target: GGUFInfo, devices: list[Device], gpu_layers: int) -> None:
    """Add the calibration (delivered bandwidth and FLOP/s, efficiency) to a passed check's result: the
    ceiling at the context the check decoded at (its cache is f16)."""
    if not result.get("ok") or not result.get("tokens_per_second"):
        return
    at = estimate_pass(ModelShape.from_gguf(target), devices, int(result.get("context") or 1),
                       n_gpu_layers=gpu_layers)
    cal = make_calibration(float(result["tokens_per_second"]), at.bytes, at.flops, at.passes_per_second)
    result["calibration"] = {**asdict(cal), "tokens_per_second": cal.tokens_per_second,
                             "efficiency": cal.efficiency}
