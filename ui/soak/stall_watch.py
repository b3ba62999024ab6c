"""Why the GUI thread was late: a watcher thread samples its Python stack while the event loop is stalled.

The GUI thread calls :meth:`StallWatch.beat` from a short timer. A daemon thread checks the last beat every
``SAMPLE_S``; once the loop is ``threshold_s`` late it takes the GUI thread's stack
(``sys._current_frames``) on every check until the next beat, and records the stall with its stack
samples and the threads' CPU clocks:

- ``gui_cpu``: the GUI thread's CPU time over the stall. Near 1: it was computing (a stack that ends in
  ``exec`` is then Qt's own C++ work: layout, painting). Near 0: it was waiting, for a lock, a pipe, the
  GIL, or a core on a busy machine.
- ``gui_runqueue``: the share of the stall the GUI thread was ready to run but got no core (Linux
  schedstat): high means the machine was busy, not that the thread was blocked.
- ``busy_threads``: other Python threads that used over a third of a core meanwhile, with their stacks (the
  GIL's holders when the GUI thread waited).
- ``watcher_late_ms``: the watcher itself woke late, so the GIL was held or the machine was busy.

Used by the autopilot for the soak's freeze report.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLE_S = 0.01
_REPO = str(Path(__file__).resolve().parents[2]) + os.sep  # frames in SpecDeck's own files show from here
STACK_FRAMES = 24  # innermost frames kept per sample: enough to see the blocking call and who made it


@dataclass
class Stall:
    """One stretch in which the GUI thread did not return to the event loop for longer than the threshold."""

    started: float  # wall clock (time.time) of the last beat before it
    lasted_s: float = 0.0
    samples: Counter[str] = field(default_factory=Counter)
    watcher_late_s: float = 0.0  # the watcher's own worst oversleep during the stall
    gui_cpu_share: float | None = None  # the GUI thread's CPU time over the sampled span: ~1 computing, ~0 waiting
    gui_runqueue_share: float | None = None  # of the span, the GUI thread was ready but had no core (busy machine)
    busy_threads: dict[str, str] = field(default_factory=dict)  # other threads that ran meanwhile: name -> stack


def format_stack(frame: Any) -> str:
    """The innermost STACK_FRAMES frames of ``frame``, innermost last, one ``file:line function`` a line."""
    frames = traceback.extract_stack(frame)[-STACK_FRAMES:]
    return "\n".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in frames)


def _short(filename: str) -> str:
    if "/site-packages/" in filename:
        return filename.split("/site-packages/", 1)[1]
    if filename.startswith(_REPO):
        return filename[len(_REPO):]
    if "/lib/python3" in filename:  # the standard library: lib/python3.N/threading.py -> threading.py
        return filename.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return filename


class StallWatch:
    """Start on the GUI thread; call :meth:`beat` there often (every 20 ms); :meth:`stop` before reporting."""

    def __init__(self, threshold_s: float = 0.1, beat_interval_s: float = 0.02) -> None:
        self.threshold_s = threshold_s
        self.beat_interval_s = beat_interval_s
        self.gui_thread = threading.get_ident()
        self.gui_native_id = threading.get_native_id()
        self.stalls: list[Stall] = []
        self._beat = time.monotonic()
        self._beat_wall = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self._beat_wall = time.time()
        self._beat = time.monotonic()  # last: the watcher reads it first

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)

    def _watch(self) -> None:
        current: Stall | None = None
        current_beat = 0.0
        first: tuple[float, dict[int, float]] = (0.0, {})  # when the stall was first seen; thread clocks then
        gui_tid = self.gui_native_id
        gui_prev = gui_first = _gui_clocks(gui_tid)  # read on every wake: a short stall has a baseline too
        last_wake = time.monotonic()
        while not self._stop.wait(SAMPLE_S):
            now = time.monotonic()
            overslept = max(0.0, now - last_wake - SAMPLE_S)
            last_wake = now
            beat = self._beat
            late = now - beat - self.beat_interval_s
            gui_now = _gui_clocks(gui_tid)
            if current is not None and beat != current_beat:  # the loop came back: the stall is over
                current = None
            if late < self.threshold_s:
                gui_prev = gui_now
                continue
            frames = sys._current_frames()
            clocks = _cpu_clocks(frames)
            if current is None:
                current = Stall(started=self._beat_wall)
                current_beat = beat
                first = (now, clocks)
                gui_first = gui_prev
                self.stalls.append(current)
            current.lasted_s = late
            current.watcher_late_s = max(current.watcher_late_s, overslept)
            frame = frames.get(self.gui_thread)
            current.samples[format_stack(frame) if frame is not None else "(no frame)"] += 1
            gui_span = gui_now[0] - gui_first[0]
            if gui_span > 0 and gui_now[1] is not None and gui_first[1] is not None:
                current.gui_cpu_share = (gui_now[1] - gui_first[1]) / gui_span
            if gui_span > 0 and gui_now[2] is not None and gui_first[2] is not None:
                current.gui_runqueue_share = (gui_now[2] - gui_first[2]) / gui_span
            span = now - first[0]
            if span > 0:
                names = {t.ident: t.name for t in threading.enumerate()}
                for ident, clock in clocks.items():
                    used = clock - first[1].get(ident, clock)
                    if ident not in (self.gui_thread, threading.get_ident()) and used > span / 3:
                        other = frames.get(ident)
                        current.busy_threads[names.get(ident, str(ident))] = (
                            format_stack(other) if other is not None else "(no frame)")

    def report(self, top: int = 8) -> dict[str, Any]:
        """The stalls' top stacks (by total stall time they were seen in), and every stall in short."""
        weight: dict[str, float] = {}
        seen: Counter[str] = Counter()
        for stall in self.stalls:
            total = sum(stall.samples.values()) or 1
            for stack, n in stall.samples.items():
                weight[stack] = weight.get(stack, 0.0) + stall.lasted_s * n / total
                seen[stack] += 1
        return {
            "stalls": len(self.stalls),
            "top_stacks": [{"stall_s": round(w, 3), "stalls": seen[s], "stack": s.splitlines()}
                           for s, w in sorted(weight.items(), key=lambda kv: -kv[1])[:top]],
            "each": [{"at": round(s.started, 3), "ms": round(1000 * s.lasted_s, 1),
                      "watcher_late_ms": round(1000 * s.watcher_late_s, 1),
                      "gui_cpu": None if s.gui_cpu_share is None else round(s.gui_cpu_share, 2),
                      "gui_runqueue": None if s.gui_runqueue_share is None else round(s.gui_runqueue_share, 2),
                      "busy_threads": {name: _innermost(stack) for name, stack in s.busy_threads.items()},
                      "where": _innermost(s.samples.most_common(1)[0][0]) if s.samples else ""}
                     for s in self.stalls],
        }


def _gui_clocks(tid: int) -> tuple[float, float | None, float | None]:
    """Now, the thread's CPU seconds, and its seconds waiting for a core (None where not known)."""
    return time.monotonic(), _thread_cpu(tid), _runqueue_wait(tid)


def _thread_cpu(tid: int) -> float | None:
    """CPU seconds used by thread ``tid`` (a native id) of this process (Linux only).

    The kernel's per-thread CPU clock is named from the thread's id (what glibc's pthread_getcpuclockid
    does), so a thread that has just ended gives an error here, never a read of freed memory.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        return time.clock_gettime((~tid << 3) | 6)  # CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD
    except OSError:
        return None


def _cpu_clocks(frames: dict[int, Any]) -> dict[int, float]:
    """CPU seconds each live Python thread in ``frames`` has used (Linux only: empty elsewhere)."""
    out: dict[int, float] = {}
    for thread in threading.enumerate():
        if thread.ident in frames and thread.native_id is not None:
            cpu = _thread_cpu(thread.native_id)
            if cpu is not None:
                out[thread.ident] = cpu
    return out


def _runqueue_wait(tid: int) -> float | None:
    """Seconds thread ``tid`` of this process has spent ready to run but waiting for a core (Linux only)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _innermost(stack: str, frames: int = 3) -> str:
    return " < ".join(reversed(stack.splitlines()[-frames:]))
