"""The decode check: load a model in the engine worker, decode a few tokens, and time them; the delivered
rate calibrates the ceiling (what the card promises next to what it delivers).

llama.cpp never runs in the asking process: the worker (``app.engine.worker``) owns it, with ggml's
backtrace off and its stderr in the engine log, so a trap (SIGILL), an abort or a load failure becomes one
sentence here and nothing else reaches the terminal.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from app.ceiling.calibration import make_calibration
from app.ceiling.child import describe_exit
from app.ceiling.roofline import CeilingModel
from app.params import LoadSettings

CHECK_CTX = 512
CHECK_TOKENS = 16  # timed single-token decodes after the prompt, for the calibration
CHECK_TIMEOUT_S = 300.0
CHECK_PROMPT = "The capital of France is"
PHASES = {"load": "while loading the model", "generate": "at its first decodes"}
_SOURCE_PATH = re.compile(r"(?:[^\s/\\]*[/\\])+([^\s/\\]+:\d+)")  # a build folder's path before "ops.cpp:5422"


def one_line(text: str) -> str:
    return " ".join(text.split())


def crash_message(exit_code: int | None, during: str, last_lines: tuple[str, ...]) -> str:
    """One sentence for a worker that died: how, in which phase, and llama.cpp's last words."""
    how = describe_exit(exit_code) if exit_code is not None else "stopped"
    if "CPU instructions" in how:
        return how  # the rebuild advice says it all
    said = [_SOURCE_PATH.sub(r"\1", line.strip()) for line in last_lines if line.strip()][-2:]
    last = f" ({' / '.join(said)})" if said else ""
    return one_line(f"llama.cpp {how} {PHASES.get(during, 'while idle')}{last}")


def decode_check(path: Path, settings: LoadSettings | None = None,
                 timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """Load the model in the engine worker with ``settings`` (its load options; None: the defaults at
    CHECK_CTX) and time CHECK_TOKENS greedy one-token decodes after a short prompt. Never raises for the
    model's sake: a refusal, an error or a crash is the result's message."""
    from app.engine.client import EngineClient
    from app.errors import AppError
    from app.events import EngineCrashed, EngineError, Loaded, RawDecoded
    from app.params import DraftSettings

    base: dict[str, Any] = {"ok": False, "model": str(path), "message": "", "tokens": 0, "seconds": None,
                            "tokens_per_second": None}
    plain = DraftSettings(adaptive=False, k=0, k_max=0)  # only width-1 passes are timed at load
    load = replace(settings or LoadSettings(target_path=str(path), n_ctx=CHECK_CTX), target_path=str(path),
                   draft=plain)
    client = EngineClient(watchdog_seconds=timeout_s)
    t = time.perf_counter()
    try:
        client.load(load)
        reply: Any = None
        for phase in ("load", "generate"):
            if phase == "generate":
                client.raw_decode(CHECK_TOKENS, CHECK_PROMPT)
            for event in client.events(timeout=timeout_s):
                if isinstance(event, EngineCrashed):
                    return {**base, "message": crash_message(event.exit_code, event.during,
                                                             event.last_log_lines)}
                if isinstance(event, EngineError):
                    return {**base, "message": one_line(event.message)}
                if isinstance(event, Loaded | RawDecoded):
                    reply = event
                    break
            else:
                return {**base, "message": f"loading and decoding took longer than {timeout_s:g} s"}
    except AppError as exc:
        return {**base, "message": one_line(str(exc))}
    except OSError as exc:
        return {**base, "message": f"could not start the engine: {exc}"}
    finally:
        client.close()
    assert isinstance(reply, RawDecoded)
    wall = time.perf_counter() - t
    return {**base, "ok": True, "tokens": reply.tokens, "seconds": reply.seconds,
            "context": reply.prompt_tokens + 1, "tokens_per_second": reply.tokens_per_second or None,
            "message": f"loaded and decoded {reply.tokens} tokens in {wall:.1f} s"}


def calibrate(result: dict[str, Any], model: CeilingModel, kv_type: str = "f16") -> None:
    """Add the calibration (delivered bandwidth and FLOP/s, efficiency) to a passed check's result: the
    plain ceiling at the context the check decoded at, with the KV cache type it used."""
    if not result.get("ok") or not result.get("tokens_per_second"):
        return
    at = replace(model, type_k=kv_type, type_v=None, drafter=None).plain(int(result.get("context") or 1))
    cal = make_calibration(float(result["tokens_per_second"]), at.bytes, at.flops, at.passes_per_second)
    result["calibration"] = {**asdict(cal), "tokens_per_second": cal.tokens_per_second,
                             "efficiency": cal.efficiency}
