"""`specdeck serve` under load and faults: what it answers, what it refuses, and what it leaks.

    .venv/bin/python benchmarks/serve_under_attack.py --target MODEL.gguf [--clients 50] [--slowloris 200]
                                                      [--disconnects 10] [--max-tokens 64]

Runs the real `specdeck serve` command (its own process, its own SPECDECK_HOME in a scratch folder) and, while
/health is polled every 0.1 s from its own thread:

1. ``--clients`` concurrent chat requests: how many are answered, how many get 429 (with Retry-After);
2. ``--slowloris`` connections that send a request head one byte at a time and never finish it;
3. ``--disconnects`` streaming clients that read two chunks and hang up (their generation must be cancelled);
4. a SIGKILL of the engine worker in the middle of a streamed answer (the client must get an error chunk, and
   the server must answer again);
5. counts the history's rows: every answered request has its user turn and its answer (turns lost = 0).

Prints one JSON report: requests answered, 429s, other statuses, /health p50/p99/max latency and failures,
open file descriptors and threads of the server process before and after, the slowloris sockets still open at
the end, the cancel delay, the restart time and turns lost. Figures depend on the machine and on what else runs
on it: quote them with that said.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Count: one two three, one two three, one two three, one two"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HealthProbe:
    """Polls /health every ``period`` seconds; keeps each latency (a failure counts as the timeout)."""

    def __init__(self, url: str, period: float = 0.1, timeout: float = 5.0) -> None:
        self.url, self.period, self.timeout = url, period, timeout
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    client.get(self.url + "/health")  # 200 or 503 (restarting): an answer either way
                    self.latencies.append(time.perf_counter() - t0)
                except httpx.HTTPError:
                    self.failures += 1
                    self.latencies.append(self.timeout)
                self._stop.wait(self.period)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        if not lat:
            return {"polls": 0}
        return {"polls": len(lat), "failures": self.failures, "p50_ms": round(1000 * statistics.median(lat), 1),
                "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
                "max_ms": round(1000 * lat[-1], 1)}


def process_counts(pid: int) -> dict[str, int]:
    proc = psutil.Process(pid)
    return {"fds": proc.num_fds(), "threads": proc.num_threads()}


def concurrent_clients(url: str, n: int, max_tokens: int) -> dict[str, int]:
    def one(i: int) -> int:
        try:
            r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
                "messages": [{"role": "user", "content": f"{PROMPT} ({i})"}], "max_tokens": max_tokens,
                "temperature": 0})
            return r.status_code
        except httpx.HTTPError:
            return -1

    with ThreadPoolExecutor(n) as pool:
        codes = list(pool.map(one, range(n)))
    return {"answered": codes.count(200), "busy_429": codes.count(429),
            "other": len(codes) - codes.count(200) - codes.count(429)}


def slowloris(port: int, n: int, seconds: float) -> dict[str, int]:
    """``n`` sockets dripping a request head for ``seconds``; how many the server closed meanwhile."""
    socks: list[socket.socket] = []
    refused = 0
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\n")
            socks.append(s)
        except OSError:
            refused += 1
    closed = 0
    deadline = time.monotonic() + seconds
    alive = list(socks)
    while alive and time.monotonic() < deadline:
        still = []
        for s in alive:
            try:
                s.sendall(b"X")
                still.append(s)
            except OSError:
                closed += 1
        alive = still
        time.sleep(1.0)
    for s in socks:
        s.close()
    return {"opened": len(socks), "refused_at_connect": refused, "closed_by_server": closed,
            "still_open_at_end": len(alive)}


def processing(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("specdeck:requests_processing"):
            return float(line.split()[-1])
    return 0.0


def disconnects(url: str, n: int, max_tokens: int) -> dict[str, Any]:
    cut = 0
    cancel_delays = []
    for _ in range(n):
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=300, json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "stream": True,
                "temperature": 1.0}) as r:
            for i, _line in enumerate(r.iter_lines()):
                if i >= 2:
                    cut += 1
                    break
        t_gone = time.perf_counter()
        while processing(url) > 0:  # the engine stops the abandoned answer
            time.sleep(0.02)
        cancel_delays.append(time.perf_counter() - t_gone)
    t0 = time.perf_counter()
    while True:  # the next request is answered once the abandoned generation is cancelled
        r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "temperature": 0})
        if r.status_code == 200:
            break
        time.sleep(0.05)
    return {"cut_mid_stream": cut, "cancel_delay_max_s": round(max(cancel_delays, default=0.0), 3),
            "cancel_delay_median_s": round(statistics.median(cancel_delays), 3) if cancel_delays else None,
            "next_answered_after_s": round(time.perf_counter() - t0, 3)}


def kill_worker(url: str, server_pid: int, max_tokens: int) -> dict[str, Any]:
    # The engine worker is the child holding the model: the largest one (not multiprocessing's helpers).
    children = psutil.Process(server_pid).children(recursive=True)
    worker = max(children, key=lambda c: c.memory_info().rss)
    rss = worker.memory_info().rss
    error_chunk = False
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "stream": True,
            "temperature": 1.0}) as r:
        for i, line in enumerate(r.iter_lines()):
            if i == 2:
                os.kill(worker.pid, signal.SIGKILL)
            if line.startswith("data: {") and '"error"' in line:
                error_chunk = True
    t0 = time.perf_counter()
    while httpx.get(url + "/health", timeout=5).status_code != 200:
        time.sleep(0.1)
    return {"killed_worker_rss_mb": round(rss / 1e6),
            "error_chunk_in_stream": error_chunk,
            "ready_again_s": round(time.perf_counter() - t0, 2)}


def turns_lost(history: Path, answered: int) -> int:
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT role, status FROM messages").fetchall()
    answers = sum(1 for role, status in rows if role == "assistant" and status == "complete")
    return max(0, answered - answers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--slowloris", type=int, default=200)
    parser.add_argument("--slowloris-seconds", type=float, default=15.0)
    parser.add_argument("--disconnects", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="specdeck-attack-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, SPECDECK_HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--target", str(args.target), "--port",
                             str(port), "--ctx", "2048", "--ngram", "3", "--queue", "4"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    report: dict[str, Any] = {"target": args.target.name}
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("serve did not become ready")
            time.sleep(0.2)
        warm = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "temperature": 0})
        assert warm.status_code == 200, warm.text
        report["before"] = process_counts(proc.pid)
        with HealthProbe(url) as probe:
            report["concurrent"] = concurrent_clients(url, args.clients, args.max_tokens)
            slow = threading.Thread(target=lambda: report.update(
                slowloris=slowloris(port, args.slowloris, args.slowloris_seconds)))
            slow.start()
            time.sleep(1.0)
            report["during_slowloris"] = concurrent_clients(url, 5, args.max_tokens)
            slow.join()
            report["disconnects"] = disconnects(url, args.disconnects, 4 * args.max_tokens)
            report["kill_worker"] = kill_worker(url, proc.pid, 4 * args.max_tokens)
        report["health"] = probe.summary()
        time.sleep(2.0)  # the server closes what the clients left
        report["after"] = process_counts(proc.pid)
        answered = 1 + report["concurrent"]["answered"] + report["during_slowloris"]["answered"] + 1
        report["turns_lost"] = turns_lost(home / "data" / "history.sqlite3", answered) \
            if (home / "data" / "history.sqlite3").exists() else None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
        report["stderr"] = err.splitlines()[-12:]
        report["tracebacks_in_stderr"] = err.count("Traceback")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
