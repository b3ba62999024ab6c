"""The app's side of the engine: starts the worker process, sends requests, yields typed events.

If the worker dies (a GGML abort, an out-of-memory kill, a signal), the next read reports
``EngineCrashed`` with the exit status and the last lines it logged; ``restart`` starts a new one.
A worker that stays silent past the watchdog while busy is killed and reported the same way.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from app.ceiling.rpc import rpc_failure
from app.events import (
    BenchResult,
    BenchRun,
    Cancel,
    ChatMessage,
    CountTokens,
    Devices,
    EngineCrashed,
    EngineError,
    Event,
    Finished,
    Generate,
    ListDevices,
    Load,
    Loaded,
    LoadProgress,
    RawDecode,
    RawDecoded,
    Request,
    Shutdown,
    TokensCounted,
    ToolSpec,
    Unload,
    Unloaded,
    WorkerReady,
)
from app.logs import engine_log_path_or_fallback
from app.params import LoadSettings, SamplingSettings

TAIL_LINES = 20


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class EngineClient:
    """One engine worker at a time. Not thread-safe: one thread sends and reads."""

    def __init__(self, log_dir: Path | None = None, watchdog_seconds: float = 120.0, nice: int = 0) -> None:
        self.log_dir = log_dir
        self.watchdog_seconds = watchdog_seconds
        self.nice = nice  # > 0: the worker runs at a lower CPU priority than this process (the window's choice)
        self._proc: BaseProcess | None = None
        self._conn: Connection[Request, Event] | None = None
        self._log_path: Path | None = None
        self._ids = itertools.count(1)
        self.state = "stopped"  # stopped, idle, load, generate
        self._last_heard = time.monotonic()
        self.crashes_on_load = 0
        self.gpu_offload = False  # from the last Loaded: crash advice mentions the GPU only when one is used
        self.build_gpu_offload: bool | None = None  # from the worker's WorkerReady: None until it has said
        self._load_gpu_layers = 0  # the layers the load in progress asked to put on a GPU

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self.alive:
            return
        from app.engine.worker import lower_priority, run_worker, worker_nice

        self._log_path = engine_log_path_or_fallback(self.log_dir)  # kept after exit: the last few survive a crash
        name = str(self._log_path)
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        nice = worker_nice(self.nice) if self.nice > 0 else 0
        proc = ctx.Process(target=run_worker, args=(child, name, nice), name="specdeck-engine", daemon=True)
        proc.start()
        self._proc = proc
        if nice > 0 and proc.pid is not None:
            lower_priority(nice, proc.pid)
        child.close()
        self._conn = parent
        self.state = "idle"
        self._last_heard = time.monotonic()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        pid = self._proc.pid if self._proc is not None else None  # None until a restarted worker runs
        return int(pid) if pid is not None else None

    def restart(self) -> None:
        self.kill()
        self.start()

    def kill(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.state = "stopped"

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has."""
        proc = self._proc
        if proc is not None and proc.is_alive() and self._conn is not None:
            try:
                self._conn.send(Shutdown())
                proc.join(5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()

    # --- requests -------------------------------------------------------------------------------

    def _send(self, request: Request) -> None:
        if not self.alive:
            self.start()
        assert self._conn is not None
        self._conn.send(request)
        self._last_heard = time.monotonic()

    def load(self, settings: LoadSettings) -> None:
        settings.validate()
        self.start()  # before the state is set: starting a worker resets it to "idle"
        self.state = "load"
        self._load_gpu_layers = settings.n_gpu_layers
        self._send(Load(settings))

    def generate(self, messages: list[ChatMessage], sampling: SamplingSettings, *,
                 continue_answer: bool = False, raw: bool = False, tools: Sequence[ToolSpec] = ()) -> int:
        sampling.validate()
        request_id = next(self._ids)
        self.start()
        self.state = "generate"
        self._send(Generate(request_id, tuple(messages), sampling, continue_answer=continue_answer, raw=raw,
                            tools=tuple(tools)))
        return request_id

    def bench_run(self, messages: list[dict[str, str]], sampling: SamplingSettings, plain: bool) -> int:
        """Time one answer inside the worker (`specdeck bench`); the reply is one ``BenchResult``."""
        sampling.validate()
        request_id = next(self._ids)
        self.start()
        self.state = "generate"
        self._send(BenchRun(request_id, tuple(messages), sampling, plain))
        return request_id

    def raw_decode(self, n_tokens: int, text: str = "",
                   messages: Sequence[dict[str, str]] = ()) -> int:
        """Bare greedy decodes on the loaded target (bench --raw, the decode check); the reply is one
        ``RawDecoded``."""
        request_id = next(self._ids)
        self.start()
        self.state = "generate"
        self._send(RawDecode(request_id, n_tokens, text, tuple(messages)))
        return request_id

    def count_tokens(self, messages: list[ChatMessage], tools: Sequence[ToolSpec] = ()) -> int:
        """Ask how many tokens the chat prompt takes (rendered and tokenized, not decoded); the reply is one
        ``TokensCounted``. Answered between answers, like ``list_devices``."""
        request_id = next(self._ids)
        self.start()
        self._send(CountTokens(request_id, tuple(messages), tuple(tools)))
        return request_id

    def list_devices(self, rpc_servers: Sequence[str] = ()) -> int:
        """Ask the worker for llama.cpp's devices (RPC servers probed and added first); the reply is one
        ``Devices``. Answered between requests, so the window may ask while a model is loaded."""
        request_id = next(self._ids)
        self.start()
        self._send(ListDevices(request_id, tuple(rpc_servers)))
        return request_id

    def cancel(self, request_id: int) -> None:
        if self.alive:
            self._send(Cancel(request_id))

    def unload(self) -> None:
        if self.alive:
            self._send(Unload())

    # --- events ---------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path | None:
        """The current worker's log file, where llama.cpp's own output goes; None before the first start."""
        return self._log_path

    def log_tail(self, lines: int = TAIL_LINES) -> tuple[str, ...]:
        if self._log_path is None or not self._log_path.exists():
            return ()
        with self._log_path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            text = fh.read().decode("utf-8", errors="replace")
        return tuple(line for line in text.splitlines() if line.strip())[-lines:]

    def _crashed(self, message: str = "") -> EngineCrashed:
        during = self.state
        code = None
        if self._proc is not None:
            self._proc.join(2)
            code = self._proc.exitcode
        sig = _signal_name(code)
        if during == "load":
            self.crashes_on_load += 1
        tail = self.log_tail()
        event = EngineCrashed(
            exit_code=code,
            signal_name=sig,
            during=during,
            last_log_lines=tail,
            message=message or rpc_failure(tail, during) or self._explain(code, sig, during,
                                                                          self._gpu_in_play(during)),
        )
        self.kill()
        return event

    def _gpu_in_play(self, during: str) -> bool:
        """Whether GPU advice fits: a load that asked for GPU layers on a build that can offload (known from
        the worker's first event, before any load), or an answer on a model that was offloaded."""
        if during == "load":
            return bool(self.build_gpu_offload) and self._load_gpu_layers != 0
        return self.gpu_offload

    @staticmethod
    def _explain(code: int | None, sig: str | None, during: str, gpu: bool = False) -> str:
        what = {"load": "while loading the model", "generate": "while generating", "idle": "while idle"}.get(
            during, ""
        )
        how = f"was killed by {sig}" if sig else f"exited with status {code}"
        advice = {
            "load": "The model may be damaged, or there was not enough memory: try "
            + ("fewer GPU layers, " if gpu else "") + "a smaller context or a smaller KV cache type.",
            "generate": "This is often the GPU running out of memory: try a smaller context, fewer GPU layers, "
            "or close other programs using the GPU." if gpu else "This is often the computer running out of "
            "memory: try a smaller context or model, or close other programs.",
        }.get(during, "")
        return f"The engine {how} {what}. {advice} Your chat is safe; restart the engine to go on.".replace(
            "  ", " "
        )

    def poll(self, timeout: float | None = 0.0) -> Event | None:
        """The next event, None if none came within ``timeout``, or ``EngineCrashed`` if the worker died."""
        if self._conn is None:
            return None
        try:
            ready = self._conn.poll(timeout)
        except (EOFError, OSError):
            return self._crashed()
        if not ready:
            if not self.alive:
                return self._crashed()
            busy = self.state in ("load", "generate")
            if busy and time.monotonic() - self._last_heard > self.watchdog_seconds:
                return self._crashed(
                    f"The engine stopped answering for {self.watchdog_seconds:.0f} s and was stopped. "
                    "Your chat is safe; restart the engine to go on."
                )
            return None
        try:
            event: Event = self._conn.recv()
        except (EOFError, OSError):
            return self._crashed()
        self._last_heard = time.monotonic()
        if isinstance(event, WorkerReady):  # the client's own business: read on to the next event, if any
            self.build_gpu_offload = event.gpu_offload
            return self.poll(0.0)
        if isinstance(event, Loaded):
            self.state = "idle"
            self.crashes_on_load = 0
            self.gpu_offload = event.gpu_offload
        elif isinstance(event, Finished | BenchResult | RawDecoded | Unloaded) or (
            isinstance(event, EngineError) and self.state != "idle"
        ):
            self.state = "idle"
        return event

    def events(self, timeout: float = 600.0) -> Iterator[Event]:
        """Events until the current request ends (Loaded, Finished, BenchResult, RawDecoded, TokensCounted,
        EngineError, EngineCrashed, Unloaded, Devices)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self.poll(0.1)
            if event is None:
                continue
            yield event
            if isinstance(event, Loaded | Finished | BenchResult | RawDecoded | TokensCounted | EngineError
                          | EngineCrashed | Unloaded | Devices):
                return
        raise TimeoutError(f"no answer from the engine within {timeout:.0f} s")


__all__ = ["EngineClient", "LoadProgress"]
