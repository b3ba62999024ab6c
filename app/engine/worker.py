"""The engine worker process: owns llama.cpp, so an abort in it never takes the window down.

It reads requests from a pipe and answers with events. Its C-level stderr (where llama.cpp and GGML
asserts write) goes to a log file that the client reads back when the worker dies.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from app.errors import AppError
from app.events import (
    BenchRun,
    Cancel,
    CountTokens,
    Devices,
    EngineError,
    Event,
    Generate,
    ListDevices,
    Load,
    LoadProgress,
    Log,
    RawDecode,
    Request,
    Shutdown,
    TokensCounted,
    Unload,
    Unloaded,
    WorkerReady,
)

if TYPE_CHECKING:
    from app.engine.session import EngineSession


def _redirect_stderr(log_path: str) -> None:
    """Send fd 2 (llama.cpp's logs and abort messages) to the log file the client tails."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


class Worker:
    def __init__(self, conn: Connection[Event, Request]) -> None:
        self.conn = conn
        self.session: EngineSession | None = None
        self.pending: list[Request] = []  # requests that arrived during a generation

    def send(self, event: Event) -> None:
        self.conn.send(event)

    def log(self, line: str) -> None:
        line = line.rstrip()
        if line:
            print(line, file=sys.stderr, flush=True)

    def next_request(self) -> Request:
        if self.pending:
            return self.pending.pop(0)
        request: Request = self.conn.recv()  # only the client writes to this pipe
        return request

    def serve(self) -> None:
        while True:
            try:
                request = self.next_request()
            except (EOFError, OSError):
                return  # the app went away
            if isinstance(request, Shutdown):
                self.unload()
                return
            try:
                if isinstance(request, Load):
                    self.load(request)
                elif isinstance(request, Generate):
                    self.generate(request)
                elif isinstance(request, BenchRun | RawDecode):
                    self.measure(request)
                elif isinstance(request, CountTokens):
                    self.count_tokens(request)
                elif isinstance(request, ListDevices):
                    self.list_devices(request)
                elif isinstance(request, Unload):
                    self.unload()
                    self.send(Unloaded())
                elif isinstance(request, Cancel):
                    pass  # nothing running: a late cancel is harmless
            except AppError as exc:
                request_id = getattr(request, "request_id", None)
                self.send(EngineError(str(exc), kind=type(exc).__name__, request_id=request_id))
            except Exception as exc:  # keep serving; the message says what failed
                self.log(traceback.format_exc())
                request_id = getattr(request, "request_id", None)
                self.send(EngineError(f"Unexpected engine error: {exc!r}", kind="internal", request_id=request_id))

    def load(self, request: Load) -> None:
        from app.engine.session import EngineSession

        if (self.session is not None and self.session.settings == request.settings
                and self.session.files_unchanged()):
            # The same load of the same files again (Tune's first setting is the loaded one): they are here already.
            self.send(self.session.loaded_event())
            return
        self.unload()

        last_stage, last_fraction = [""], [-1.0]

        def progress(stage: str, fraction: float) -> bool:
            # llama.cpp reports per tensor; a few dozen updates are plenty for a progress bar.
            if stage != last_stage[0] or fraction - last_fraction[0] >= 0.02 or fraction >= 1.0:
                last_stage[0], last_fraction[0] = stage, fraction
                self.send(LoadProgress(stage, fraction))
            return True

        self.session = EngineSession(request.settings, log=self.log, progress=progress)
        self.send(self.session.loaded_event())

    def list_devices(self, request: ListDevices) -> None:
        """llama.cpp's devices, the RPC servers asked for included (probed, then registered). A server the
        loaded model uses is not probed again: it serves this worker's own connection, which answers."""
        from app.ceiling.backend import probe_backend
        from app.ceiling.rpc import connect_servers, registered_servers, rpc_available

        in_use = set(self.session.settings.rpc_servers) if self.session is not None else set()
        error = None
        try:
            connect_servers([s for s in request.rpc_servers if s not in in_use])
        except AppError as exc:
            error = str(exc)
        listed = [s for s in request.rpc_servers if s in registered_servers()]
        info = probe_backend(listed)
        self.send(Devices(request.request_id, info.devices, info.backend, info.gpu_offload,
                          rpc_available(), error))

    def unload(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def measure(self, request: BenchRun | RawDecode) -> None:
        """A timed run for `specdeck bench` or a decode check: one request, one reply, no chatter."""
        from app.engine.bench_run import bench_run, raw_decode

        if self.session is None:
            self.send_not_loaded(request.request_id)
        elif isinstance(request, BenchRun):
            self.send(bench_run(self.session, request))
        else:
            self.send(raw_decode(self.session, request))

    def send_not_loaded(self, request_id: int) -> None:
        self.send(EngineError("No model is loaded; load a model first.", kind="not_loaded", request_id=request_id))

    def count_tokens(self, request: CountTokens) -> None:
        if self.session is None:
            self.send_not_loaded(request.request_id)
            return
        from app.engine.session import chat_prompt

        prompt = chat_prompt(self.session.target, list(request.messages), request.tools)
        self.send(TokensCounted(request.request_id, len(prompt.tokens), prompt.warning))

    def generate(self, request: Generate) -> None:
        if self.session is None:
            self.send_not_loaded(request.request_id)
            return
        cancelled = False

        def is_cancelled() -> bool:
            nonlocal cancelled
            while not cancelled and self.conn.poll():
                try:
                    incoming: Request = self.conn.recv()
                except (EOFError, OSError):  # the app is gone: stop now, then exit
                    self.pending.append(Shutdown())
                    cancelled = True
                    break
                if isinstance(incoming, Cancel) and incoming.request_id == request.request_id:
                    cancelled = True
                elif isinstance(incoming, Cancel):
                    continue
                else:
                    self.pending.append(incoming)
                    if isinstance(incoming, Load | Unload | Shutdown | Generate):
                        cancelled = True  # a new request supersedes this answer
            return cancelled

        for event in self.session.generate(request.request_id, request.messages, request.sampling,
                                           cancelled=is_cancelled, continue_answer=request.continue_answer,
                                           raw=request.raw, tools=request.tools):
            try:
                self.send(event)
            except (BrokenPipeError, OSError):
                self.pending.append(Shutdown())
                cancelled = True


def worker_nice(lower_by: int) -> int:
    """The nice value ``lower_by`` steps below this process's own priority (POSIX caps it at 19)."""
    own = os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0
    return min(19, own + lower_by)


def lower_priority(nice: int, pid: int = 0) -> None:
    """Run process ``pid`` (0: this one) at nice ``nice`` at least, so other programs (the window's GUI thread)
    get the CPU first. An absolute value (``worker_nice``): the client sets it right after the spawn (the
    interpreter's start and imports otherwise compete with the window at full priority) and the worker again
    before any thread starts (llama.cpp's threads inherit it). Best effort: a system that refuses leaves the
    priority as it was."""
    if hasattr(os, "setpriority"):
        try:
            if os.getpriority(os.PRIO_PROCESS, pid) < nice:
                os.setpriority(os.PRIO_PROCESS, pid, nice)
        except OSError:
            pass
        return
    try:  # Windows
        import psutil
    except ImportError:
        return
    with contextlib.suppress(psutil.Error, OSError, AttributeError):
        psutil.Process(pid or None).nice(psutil.BELOW_NORMAL_PRIORITY_CLASS)


def run_worker(conn: Connection[Event, Request], log_path: str, nice: int = 0) -> None:
    """Entry point of the worker process (spawned by ``EngineClient``); ``nice`` > 0: the nice value to run at."""
    if nice > 0:
        lower_priority(nice)
    _redirect_stderr(log_path)
    # On an abort GGML otherwise attaches gdb and logs a backtrace of ~100 lines, which pushes the abort
    # message itself out of the tail that EngineCrashed reports (and takes seconds).
    os.environ["GGML_NO_BACKTRACE"] = "1"
    from app.engine.llama import init_backend

    worker = Worker(conn)
    init_backend(worker.log)
    import llama_cpp

    worker.send(WorkerReady(gpu_offload=bool(llama_cpp.llama_supports_gpu_offload())))
    worker.send(Log("engine worker ready"))
    worker.serve()
