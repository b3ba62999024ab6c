"""The CPU: its model, cores and RAM, and its memory bandwidth and peak FLOP/s, measured once per machine
(in a child process with single-threaded BLAS, see ``app.ceiling.probe``) and cached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from app.ceiling.child import ProbeFailed, run_probe
from app.errors import StorageError
from app.paths import cache_dir
from app.storage.atomic import atomic_write_json, read_regular_bytes

PROBE_CACHE_FILE = "hardware_probe.json"
PROBE_SCHEMA = 2
MAX_PROBE_CACHE_BYTES = 1 << 16  # the file is a few hundred bytes; anything far larger is not SpecDeck's
# A machine's first probe is the best of this many, a moment apart (as STREAM reports its best of several
# trials): other programs only ever slow a probe down, and on a shared machine one probe read 11-33 GB/s.
PROBE_REPEATS = 3
PROBE_GAP_S = 0.2
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CPUInfo:
    model: str
    physical_cores: int
    logical_cores: int
    ram_total: int
    ram_available: int
    bandwidth: float  # bytes/s read, measured (or the user's override)
    peak_flops: float  # FLOP/s, measured
    bandwidth_source: str  # "measured" or "override"
    probe_seconds: float  # how long the measurement took (0 when it came from the cache)
    cached: bool


def cpu_model_name() -> str:
    if sys.platform.startswith("linux"):
        try:
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                 text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    elif sys.platform == "win32":
        try:
            import winreg

            with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE,
                                r"HARDWARE\DESCRIPTION\System\CentralProcessor\0") as key:
                return str(winreg.QueryValueEx(key, "ProcessorNameString")[0]).strip()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


# BLAS libraries read these before they start their threads; the CPU probe's child sets them all.
SINGLE_THREAD_ENV = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                            "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")}


def _filled(nbytes: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    buf = np.empty(max(nbytes // 4 // 16384 * 16384, 16384), np.float32)
    buf.fill(1.0)  # touch every page: untouched pages all map the one zero page, which is cached
    return buf


def measure_memory_bandwidth(nbytes: int = 128 << 20, budget_s: float = 0.3) -> float:
    """Read bandwidth in bytes/s with this process's BLAS threads: the best matrix-vector product over a
    buffer larger than the caches (the in-process fallback of :func:`measure_cpu_rates`)."""
    buf = _filled(nbytes)
    mat = buf.reshape(-1, 1024)
    vec = np.ones(1024, np.float32)
    mat @ vec
    best = 0.0
    end = time.perf_counter() + budget_s
    i = 0
    while time.perf_counter() < end or i < 4:
        t = time.perf_counter()
        mat @ vec
        best = max(best, buf.nbytes / (time.perf_counter() - t))
        i += 1
    return best


def _best_matmul(budget_s: float, sizes: Sequence[int]) -> float:
    rng = np.random.default_rng(0)
    best = 0.0
    for size in sizes:
        a = rng.standard_normal((size, size), dtype=np.float32)
        b = rng.standard_normal((size, size), dtype=np.float32)
        a @ b
        reps = 0
        stop = time.perf_counter() + budget_s / len(sizes)
        while reps < 3 or (time.perf_counter() < stop and reps < 200):
            t = time.perf_counter()
            a @ b
            best = max(best, 2.0 * size**3 / (time.perf_counter() - t))
            reps += 1
    return best


def measure_peak_flops(budget_s: float = 0.15) -> float:
    """Peak FLOP/s of this process's BLAS threads on float32 matrix products (the in-process fallback)."""
    return _best_matmul(budget_s, (256, 512, 1024))


SLICE_BYTES = 16 << 20


def measure_cpu_rates(threads: int, nbytes: int = 128 << 20, budget_s: float = 0.35) -> dict[str, float]:
    """The CPU probe proper; run it where BLAS is single-threaded (SINGLE_THREAD_ENV, a child process).

    Bandwidth: matrix-vector products read 16 MB slices of a buffer larger than the caches, in turn, so
    each slice read has been evicted since its last read; by one thread, and by `threads` threads at
    once (llama.cpp streams its weights from all cores). A slice takes well under a scheduler tick, so
    among a few hundred runs some finish untouched by other programs, which only ever slow a run down:
    the best is kept.

    Peak FLOP/s: one core's best float32 matrix product, times the cores. This is an honest upper bound
    for decoding: cores never scale better than linearly, and llama.cpp's quantized kernels unpack the
    weights before they multiply, so they run below a float32 GEMM (from cache, 100-200 GFLOP/s on two
    cores of the test VM against 2 × 125 for this product). Decoding is a matrix-vector product per
    token and reaches less still. A cores × clock × SIMD × FMA figure would be higher again, but clocks
    cannot be read reliably (VMs, boost), and multi-threaded BLAS measures far too low when another
    program holds a core for a scheduler tick.
    """
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, threads)
    buf = _filled(nbytes)
    cols = 1024
    rows = max(1, min(SLICE_BYTES, buf.nbytes // (2 * threads)) // (4 * cols))
    mats = buf[: buf.size // (rows * cols) * rows * cols].reshape(-1, rows, cols)  # slices, in memory order
    vec = np.ones(cols, np.float32)
    n = len(mats)
    slice_bytes = float(mats[0].nbytes)
    single = multi = 0.0
    with ThreadPoolExecutor(threads) as pool:
        end = time.perf_counter() + budget_s * 0.7
        i = 0
        while time.perf_counter() < end or i < 3 * n:
            t = time.perf_counter()
            mats[i % n] @ vec
            single = max(single, slice_bytes / (time.perf_counter() - t))
            if threads > 1 and n >= 2 * threads:
                # Thread j reads slice (i + j * n / threads) mod n: all far apart, all cold.
                picks = [mats[(i + j * n // threads) % n] for j in range(threads)]
                t = time.perf_counter()
                list(pool.map(lambda m: m @ vec, picks))
                multi = max(multi, threads * slice_bytes / (time.perf_counter() - t))
            i += 1
    peak_one = _best_matmul(budget_s * 0.3, (256, 512))
    return {"bandwidth_single": single, "bandwidth_threads": multi, "peak_flops_core": peak_one,
            "threads": float(threads)}



def measure_cpu(physical_cores: int, nbytes: int = 128 << 20, timeout_s: float = 60.0) -> tuple[float, float]:
    """(read bandwidth bytes/s, peak FLOP/s) of the CPU, measured in a child with single-threaded BLAS;
    in this process if the child cannot run."""
    try:
        r = run_probe("cpu", "--threads", str(physical_cores), "--bytes", str(nbytes), timeout_s=timeout_s,
                      what="the CPU probe", env=SINGLE_THREAD_ENV)
        bandwidth = max(float(r["bandwidth_single"]), float(r["bandwidth_threads"]))
        peak = float(r["peak_flops_core"]) * physical_cores
        if bandwidth > 0 and peak > 0:
            return bandwidth, peak
    except (ProbeFailed, KeyError, TypeError, ValueError) as exc:
        log.warning("the CPU probe child failed (%s); measuring in this process instead", exc)
    return measure_memory_bandwidth(nbytes), measure_peak_flops()


def machine_fingerprint(model: str, physical: int, logical: int, ram_total: int) -> str:
    # A cached probe is reused only on the same machine and BLAS (numpy ships its own).
    return "|".join([model, str(physical), str(logical), str(round(ram_total / 2**30)), platform.machine(),
                     platform.node(), np.__version__])


def _busy() -> bool:
    """Whether other programs were using much of the CPU just now (a probe then reads low)."""
    try:
        return float(psutil.cpu_percent(interval=0.05)) > 25.0
    except (OSError, psutil.Error):
        return False


def _rate(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def cached_probe(path: Path, machine: str) -> dict[str, Any] | None:
    """This machine's cached probe, or None where there is none. The cache is read bounded, as every file
    SpecDeck keeps: a FIFO or a device in its place, a file far too large, invalid JSON, JSON nested thousands
    deep or fields of the wrong kind count as no cache (logged), so the CPU is measured again and the cache
    replaced atomically; a probe of another machine or schema is simply not this one's."""
    try:
        data = json.loads(read_regular_bytes(path, MAX_PROBE_CACHE_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        log.warning("the CPU probe cache %s cannot be read (%s); it is measured again", path,
                    type(exc).__name__ if isinstance(exc, RecursionError) else exc)
        return None
    if not isinstance(data, dict):
        log.warning("the CPU probe cache %s holds no probe; it is measured again", path)
        return None
    if data.get("schema") != PROBE_SCHEMA or data.get("machine") != machine:
        return None
    runs = data.get("runs", 1)
    counted = isinstance(runs, int) and not isinstance(runs, bool) and 0 < runs < 1 << 31
    if not (_rate(data.get("bandwidth")) and _rate(data.get("peak_flops"))
            and isinstance(data.get("quiet", False), bool) and counted):
        log.warning("the CPU probe cache %s is damaged (a rate or count of the wrong kind); it is measured again",
                    path)
        return None
    return data


def probe_cpu(*, refresh: bool = False, cache_path: Path | None = None,
              bandwidth_override: float | None = None, measure: bool = True, retake_busy: bool = True) -> CPUInfo:
    """The CPU, its RAM, and its measured bandwidth and peak, cached per machine.

    The first probe is the best of PROBE_REPEATS. A probe taken while the machine was busy is kept but taken
    again on the next call (unless ``retake_busy`` is False: the window, whose roof must not move from one
    start to the next), and the cache holds the best of all probes: load only ever lowers a measurement, and
    the ceiling must be an upper bound. `refresh` starts over (after a hardware change). `measure` False never
    measures (a fit estimate needs only the RAM): the cached rates, or 0 where there are none."""
    model = cpu_model_name()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    vm = psutil.virtual_memory()
    key = machine_fingerprint(model, physical, logical, int(vm.total))
    path = cache_path or cache_dir() / PROBE_CACHE_FILE
    previous = None if refresh else cached_probe(path, key)
    measured = previous
    seconds = 0.0
    if not measure and previous is None:
        measured = {"bandwidth": 0.0, "peak_flops": 0.0}
    elif measure and (previous is None or (retake_busy and not previous.get("quiet", False))):
        t = time.perf_counter()
        # Keep the buffer well within free memory on small machines.
        nbytes = int(min(128 << 20, max(32 << 20, vm.available // 8)))
        bandwidth = peak = 0.0
        busy = True
        for attempt in range(PROBE_REPEATS if previous is None else 1):
            if attempt:
                time.sleep(PROBE_GAP_S)
            was_busy = _busy()
            one_bandwidth, one_peak = measure_cpu(int(physical), nbytes)
            busy = busy and (was_busy or _busy())  # quiet when any of the probes was
            bandwidth, peak = max(bandwidth, one_bandwidth), max(peak, one_peak)
        seconds = time.perf_counter() - t
        runs = int(previous.get("runs", 1)) + 1 if previous else 1
        measured = {
            "schema": PROBE_SCHEMA, "machine": key,
            "bandwidth": max(bandwidth, float(previous["bandwidth"])) if previous else bandwidth,
            "peak_flops": max(peak, float(previous["peak_flops"])) if previous else peak,
            "quiet": not busy, "runs": runs, "probe_seconds": seconds, "measured_at": time.time(),
        }
        with contextlib.suppress(StorageError):  # a read-only cache only costs re-measuring next time
            atomic_write_json(path, measured)
    assert measured is not None
    return CPUInfo(
        model=model, physical_cores=int(physical), logical_cores=int(logical),
        ram_total=int(vm.total), ram_available=int(vm.available),
        bandwidth=float(bandwidth_override or measured["bandwidth"]),
        peak_flops=float(measured["peak_flops"]),
        bandwidth_source="override" if bandwidth_override else "measured" if measured["bandwidth"] else "not measured",
        probe_seconds=seconds, cached=seconds == 0.0,
    )

