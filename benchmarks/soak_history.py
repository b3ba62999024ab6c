"""Soak: several real windows chat into one history database while their engines are killed and the database
is locked, and afterwards every turn that was sent is in the history.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/soak_history.py --minutes 10 --windows 3 \\
        --kill-every 30 --lock-seconds 8 [--start-gap S] [--model PATH] [--worker-nice N] [--json report.json]

Each window is ``specdeck`` driven by the autopilot (``SPECDECK_AUTOPILOT``), with its own numbered prompts.
A killer SIGKILLs one window's engine worker in turn every ``--kill-every`` seconds (the window restarts it
and reloads); a locker holds the database's write lock for ``--lock-seconds`` at random moments. At the end
the history is read (with what the windows had to leave in side files) and checked: every prompt a window
sent is a user message, followed by an answer. The windows report the event loop's worst lateness, and each
stall over 100 ms with the GUI thread's stack during it, its kind (the GUI thread computing, blocked, or
ready but waiting for a core on a busy machine) and what else happened then (the window's start, a kill of
its worker, a lock, an idle probe thread here waking late too); ``top_stall_stacks`` sums the stacks.
``--worker-nice N`` puts every thread of each window's engine worker at nice N (checked twice a second, so a
restarted worker and llama.cpp's threads are caught too): the A/B of the window's responsiveness against the
worker's priority (the window runs it at the user's own, nice 0 for a normal start).
Exit status 0 when no turn was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.paths import models_dir  # noqa: E402
from app.storage.buffered_history import BufferedHistory  # noqa: E402


def _default_model() -> Path:
    found = sorted(models_dir().glob("SmolLM2-135M-Instruct*.gguf"))
    if not found:
        raise SystemExit("no demo model: run `specdeck demo-models`, or pass --model")
    return found[0]


def _engine_worker(window: subprocess.Popen[bytes]) -> psutil.Process | None:
    try:
        kids = psutil.Process(window.pid).children()
    except psutil.NoSuchProcess:
        return None
    workers = [k for k in kids if k.is_running() and "spawn_main" in " ".join(k.cmdline())]
    return workers[0] if workers else None


class Chaos:
    """The killer and the locker, on threads, with a log of what they did."""

    def __init__(self, windows: list[subprocess.Popen[bytes]], db: Path, args: argparse.Namespace) -> None:
        self.windows, self.db, self.args = windows, db, args
        self.stop = threading.Event()
        self.kills: list[tuple[float, int]] = []  # (when, which window's worker)
        self.locks: list[tuple[float, float]] = []
        self.probe_lags: list[tuple[float, float]] = []  # (when, how late) of this process's own 20 ms sleeps

    def killer(self) -> None:
        n = 0
        while not self.stop.wait(self.args.kill_every):
            window = n % len(self.windows)
            worker = _engine_worker(self.windows[window])
            n += 1
            if worker is not None:
                try:
                    worker.send_signal(signal.SIGKILL)
                    self.kills.append((time.time(), window))
                except psutil.NoSuchProcess:
                    pass

    def renice(self) -> None:
        """Every thread of every window's engine worker at --worker-nice (Linux sets priority per thread)."""
        while not self.stop.wait(0.5):
            for window in self.windows:
                worker = _engine_worker(window)
                if worker is None:
                    continue
                try:
                    for thread in worker.threads():
                        if os.getpriority(os.PRIO_PROCESS, thread.id) != self.args.worker_nice:
                            os.setpriority(os.PRIO_PROCESS, thread.id, self.args.worker_nice)
                except (psutil.Error, OSError):
                    pass  # it exited (killed, restarting): caught again next time

    def probe(self) -> None:
        """How late a thread that does nothing else wakes: the machine's share of a window's lag."""
        while not self.stop.is_set():
            before = time.monotonic()
            time.sleep(0.02)
            late = time.monotonic() - before - 0.02
            if late > 0.05:
                self.probe_lags.append((time.time(), late))

    def cause(self, window: int, at: float, lasted: float, loaded_at: float | None) -> list[str]:
        """What else happened while a window's loop stalled from ``at`` for ``lasted`` seconds."""
        end = at + lasted + 0.02
        why = []
        if loaded_at is None or at < loaded_at:
            why.append("starting (before the first load)")
        if any(w == window and at - 15 <= t <= end for t, w in self.kills):
            why.append("own worker killed <15 s before")
        if any(start <= end and at <= start + length for start, length in self.locks):
            why.append("database locked")
        if any(at - 0.05 <= t <= end + 0.05 and late > 0.05 for t, late in self.probe_lags):
            why.append("machine busy (probe late too)")
        return why

    @staticmethod
    def kind(stall: dict[str, Any]) -> str:
        """What held the GUI thread, from its CPU and run-queue shares over the stall (ui/soak/stall_watch.py)."""
        cpu, queued = stall.get("gui_cpu"), stall.get("gui_runqueue")
        if cpu is None or queued is None:
            return "too short to tell"
        if queued >= 0.5:
            return "machine busy: ready, waiting for a core"
        if cpu >= 0.5:
            return "GUI thread computing"
        return "GUI thread blocked (a lock, I/O, the GIL)" if cpu + queued < 0.5 else "mixed"

    def locker(self) -> None:
        rng = random.Random(self.args.seed)
        while not self.stop.wait(rng.uniform(10, 40)):
            try:
                conn = sqlite3.connect(self.db, isolation_level=None, timeout=10)
                conn.execute("BEGIN EXCLUSIVE")
            except sqlite3.Error:
                continue
            start = time.time()
            self.stop.wait(self.args.lock_seconds)
            conn.execute("ROLLBACK")
            conn.close()
            self.locks.append((start, time.time() - start))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=30.0)
    parser.add_argument("--lock-seconds", type=float, default=8.0)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--start-gap", type=float, default=0.0,
                        help="seconds between window starts (0: all at once, each window's first paint then "
                        "competes with the others' start on a small machine)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker-nice", type=int, default=None,
                        help="run each window's engine worker at this nice value (default: as the window starts it)")
    args = parser.parse_args()
    model = (args.model or _default_model()).resolve()
    home = Path(tempfile.mkdtemp(prefix="specdeck-soak-"))
    db = home / "data" / "history.sqlite3"
    duration = args.minutes * 60
    env = {**os.environ, "SPECDECK_HOME": str(home), "SPECDECK_MODELS_DIR": str(model.parent), "PYTHONUNBUFFERED": "1",
           "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    windows: list[subprocess.Popen[bytes]] = []
    reports = [home / f"window-{n}.json" for n in range(args.windows)]
    for n, report in enumerate(reports):
        if n and args.start_gap > 0:
            time.sleep(args.start_gap)
        spec = {"target": str(model), "ngram": 3, "threads": 1, "n_ctx": 1024, "max_tokens": args.max_tokens,
                "prompts": [f"Window {n}, turn {i}: name a colour and a fruit." for i in range(1500)],
                "duration_s": duration, "new_chat_every": 6, "report": str(report), "quit": True,
                "hide_dashboard": False}
        windows.append(subprocess.Popen(
            [sys.executable, "-c", "import sys; from ui.launch import main; sys.exit(main([]))"],
            env={**env, "SPECDECK_AUTOPILOT": json.dumps(spec)}, cwd=REPO,
            stdout=(home / f"window-{n}.out").open("wb"), stderr=(home / f"window-{n}.err").open("wb")))
    chaos = Chaos(windows, db, args)
    threads = [threading.Thread(target=chaos.killer, daemon=True), threading.Thread(target=chaos.locker, daemon=True),
               threading.Thread(target=chaos.probe, daemon=True)]
    if args.worker_nice is not None:
        threads.append(threading.Thread(target=chaos.renice, daemon=True))
    started = time.time()
    for t in threads:
        t.start()
    codes = []
    for w in windows:
        try:
            codes.append(w.wait(max(60.0, duration + 180 - (time.time() - started))))
        except subprocess.TimeoutExpired:
            w.kill()
            codes.append(w.wait())
    chaos.stop.set()
    for t in threads:
        t.join(args.lock_seconds + 15)

    with BufferedHistory(db, busy_timeout=5.0) as history:  # also takes what the windows left in side files
        saved: dict[str, list[str]] = {}
        for chat in history.list_chats():
            messages = history.messages(chat.id)
            for i, m in enumerate(messages):
                if m.role == "user":
                    after = messages[i + 1] if i + 1 < len(messages) else None
                    saved[m.text] = [after.status if after is not None and after.role == "assistant" else "none"]
    result: dict[str, Any] = {"model": str(model), "minutes": args.minutes, "windows": [], "kills": len(chaos.kills),
                              "locks": [round(d, 1) for _, d in chaos.locks], "exit_codes": codes,
                              "worker_nice": args.worker_nice}
    lost_total = 0
    stacks: dict[str, dict[str, Any]] = {}
    for index, report in enumerate(reports):
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError):
            doc = {"sent": [], "results": [], "max_lag_s": None}
        sent = doc.get("sent", [])
        loaded_at = doc.get("first_loaded_at")
        stalls = doc.get("stall_watch", {}).get("each", [])
        lost = [p for p in sent if p not in saved]
        unanswered = [p for p in sent if p in saved and saved[p] == ["none"]]
        lost_total += len(lost)
        result["windows"].append({
            "sent": len(sent), "answered": len(doc.get("results", [])), "lost": len(lost),
            "without_answer_row": len(unanswered), "max_lag_ms": round(1000 * (doc.get("max_lag_s") or 0), 1),
            "p99_lag_ms": round(1000 * (doc.get("p99_lag_s") or 0), 1),
            "lags_over_100ms": doc.get("lags_over_100ms"), "ticks": doc.get("ticks"),
            "max_lag_after_load_ms": round(1000 * (doc.get("max_lag_after_load_s") or 0), 1),
            "stall_kinds": dict(Counter(chaos.kind(stall) for stall in stalls).most_common()),
            "stalls": [{**stall, "kind": chaos.kind(stall), "with": chaos.cause(index, stall["at"], stall["ms"] / 1000,
                                                                                  loaded_at)} for stall in stalls]})
        for top in doc.get("stall_watch", {}).get("top_stacks", []):
            merged = stacks.setdefault("\n".join(top["stack"]), {"stall_s": 0.0, "stalls": 0, "stack": top["stack"]})
            merged["stall_s"] = round(merged["stall_s"] + top["stall_s"], 3)
            merged["stalls"] += top["stalls"]
    probe = sorted(late for _, late in chaos.probe_lags)
    result["machine_probe"] = {"wakes_over_50ms": len(probe), "over_100ms": sum(1 for p in probe if p > 0.1),
                               "max_ms": round(1000 * probe[-1], 1) if probe else 0.0}
    # Why the loops were late: the GUI threads' stacks while stalled, most stall time first.
    result["top_stall_stacks"] = sorted(stacks.values(), key=lambda t: -t["stall_s"])[:8]
    result["lost_total"] = lost_total
    result["home"] = str(home)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if lost_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
