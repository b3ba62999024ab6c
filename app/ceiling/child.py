"""Running a probe in a child process (`app.ceiling.probe`), so a llama.cpp build that traps (SIGILL) or
aborts, or a BLAS that spins up threads, cannot take the asking process down or skew it.

Only the standard library is imported here: the frozen app's entry point reads ``PROBE_FLAG`` before
anything else is loaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROBE_MODULE = "app.ceiling.probe"
PROBE_FLAG = "--ceiling-probe"  # the frozen executable's hidden switch to the probe entry point
SAFE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
SIGILL_MESSAGE = (
    "this llama.cpp build uses CPU instructions this machine cannot run; rebuild with "
    f"SPECDECK_CMAKE_ARGS='{SAFE_CMAKE_ARGS}' python3 bootstrap.py"
)
_WINDOWS_ILLEGAL_INSTRUCTION = 0xC000001D


class ProbeFailed(Exception):
    """The probe child gave no answer; the message says why in words."""


def probe_command(*args: str) -> list[str]:
    """The probe entry point as a command line: the frozen executable itself with ``PROBE_FLAG`` (see
    packaging/entry.py), or ``python -m app.ceiling.probe``."""
    if getattr(sys, "frozen", False):
        return [sys.executable, PROBE_FLAG, *args]
    return [sys.executable, "-m", PROBE_MODULE, *args]


def specdeck_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, with the project importable from any working directory, installed or not."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def describe_exit(returncode: int) -> str:
    """A child's exit status in words; SIGILL gets the rebuild advice."""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"killed by signal {-returncode}"
        if sig == signal.SIGILL:
            return SIGILL_MESSAGE
        return f"crashed with {sig.name}"
    if returncode & 0xFFFFFFFF == _WINDOWS_ILLEGAL_INSTRUCTION:
        return SIGILL_MESSAGE
    return f"exited with status {returncode}"


def run_probe(*args: str, timeout_s: float, what: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``probe_command(*args)`` and return the last JSON object it printed; raise ProbeFailed with one
    sentence ("probing llama.cpp crashed with SIGABRT (last stderr line)") when there is none."""
    try:
        done = subprocess.run(probe_command(*args), capture_output=True, text=True, timeout=timeout_s,
                              env=specdeck_env(env))
    except subprocess.TimeoutExpired as exc:
        raise ProbeFailed(f"{what} took longer than {timeout_s:g} s") from exc
    except OSError as exc:
        raise ProbeFailed(f"could not start {what}: {exc}") from exc
    if done.returncode != 0:
        why = describe_exit(done.returncode)
        if why == SIGILL_MESSAGE:  # the rebuild advice says it all
            raise ProbeFailed(why)
        tail = (done.stderr or "").strip().splitlines()[-1:]
        raise ProbeFailed(f"{what} {why}" + (f" ({tail[0]})" if tail else ""))
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict):
                return answer
    raise ProbeFailed(f"{what} gave no readable answer")
