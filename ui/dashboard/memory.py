"""The dashboard's memory chart: what is read (off the GUI thread) and the bars it makes."""

from __future__ import annotations

import contextlib

import psutil

from app.ceiling.memory import MemoryProbe, MemoryReading
from app.events import Loaded


def read_memory(probe: MemoryProbe, engine_pid: int | None) -> tuple[MemoryReading | None, int | None]:
    """Memory per device and RAM, and the engine worker's resident memory (None: could not be read)."""
    reading: MemoryReading | None = None
    rss: int | None = None
    with contextlib.suppress(Exception):
        reading = probe.read()
    if engine_pid is not None:
        with contextlib.suppress(psutil.Error):
            rss = int(psutil.Process(engine_pid).memory_info().rss)
    return reading, rss


def memory_rows(ld: Loaded | None, kv_used: float, reading: MemoryReading | None,
                engine_rss: int | None) -> list[tuple[str, float]]:
    """The memory chart's bars, top to bottom: (label, bytes). The engine process holds the weights and
    the KV cache; the window's own process is listed apart."""
    rows: list[tuple[str, float]] = []
    if ld is not None:
        rows.append(("target weights", float(ld.target.size_bytes)))
        if ld.drafter is not None:
            rows.append(("drafter weights", float(ld.drafter.size_bytes)))
        rows.append(("KV allocated", float(ld.kv_bytes_total)))
        rows.append(("KV used", float(kv_used)))
    for g in reading.gpus if reading is not None else ():
        # Per GPU: the device's memory in use, and the loaded models' weights + KV placed on it.
        name = g.device or f"GPU{g.index}"
        if g.used is not None:  # a device that does not report its use gets no bar, not a zero
            rows.append((f"{name} in use", float(g.used)))
        if g.placed is not None:
            rows.append((f"{name} weights+KV", float(g.placed)))
    if engine_rss is not None:
        rows.append(("engine process", float(engine_rss)))
    if reading is not None:
        rows.append(("window process", float(reading.process_rss)))
    return rows
