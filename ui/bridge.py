"""The one bridge between the engine client and the GUI thread.

A dedicated reader thread owns the ``EngineClient`` (which is not thread-safe): every client call is a
command put on a queue and run by that thread, between short polls for events. Events are queued for the
GUI thread, which drains them on a ~30 Hz timer, merges consecutive tokens of one request into one
``Token`` and re-emits everything as typed signals. The GUI thread therefore never blocks on the engine,
and a flood of tiny passes costs one repaint per tick, not one per token.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.engine.client import EngineClient
from app.engine.supervisor import may_restart, restart_worker
from app.errors import SettingsError
from app.events import (
    Devices,
    EngineCrashed,
    EngineError,
    Event,
    Finished,
    Loaded,
    LoadProgress,
    Log,
    PassStats,
    PromptProcessed,
    PromptProgress,
    Token,
    Unloaded,
)
from app.params import LoadSettings, SamplingSettings
from app.paths import logs_dir
from ui.event_pump import EventPump

BUSY_TUNING = "The engine is busy tuning; send again when Tune has finished, or cancel it."

POLL_SECONDS = 0.02  # how long the reader waits for an event before looking at the command queue again
# The window's engine worker runs at the user's own priority: the answer the user waits for must not yield to
# a compile or a browser tab (at nice +10 it did, and its slowed passes misled the depth policy). The window stays
# responsive by costing little per token instead: tokens and stats are drained under a time budget and merged,
# and repaints are coalesced on timers (this module, the chat view and the dashboard).


@dataclass(frozen=True)
class _Started:
    request_id: int


@dataclass(frozen=True)
class _LoadCancelled:
    pass


@dataclass(frozen=True)
class _Restarting:
    pass


class EngineBridge(QObject):
    """Engine events as Qt signals; requests as non-blocking calls. Create and use on the GUI thread."""

    model_loaded = Signal(Loaded)
    load_progress = Signal(LoadProgress)
    load_cancelled = Signal()
    model_unloaded = Signal()
    generation_started = Signal(int)  # the request id the client gave the generation
    prompt_progress = Signal(PromptProgress)
    prompt_processed = Signal(PromptProcessed)
    token_received = Signal(Token)
    stats_updated = Signal(PassStats)
    generation_finished = Signal(Finished)
    engine_error = Signal(EngineError)
    engine_crashed = Signal(EngineCrashed)
    engine_restarting = Signal()  # an automatic restart (and reload) after a crash has begun
    log_received = Signal(Log)
    devices_listed = Signal(Devices)  # llama.cpp's devices as the worker lists them (list_devices)

    def __init__(
        self,
        client: EngineClient | None = None,
        parent: QObject | None = None,
        *,
        auto_restart: bool = True,
    ) -> None:
        super().__init__(parent)
        self._client = client if client is not None else EngineClient(log_dir=logs_dir())
        self.auto_restart = auto_restart
        self._commands: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.SimpleQueue()
        self._pump = EventPump(self._emit, self)  # reader thread → GUI thread
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_load: LoadSettings | None = None
        self._current_request: int | None = None  # reader thread only
        self.crashes_on_load = 0  # mirrored from the client by the reader thread
        self.loaded: Loaded | None = None
        self.generating = False
        self.tuning = False  # set by Tune while it measures on this engine (GUI thread): answers wait for it

    # --- lifecycle (GUI thread) ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="specdeck-engine-reader", daemon=True)
        self._thread.start()
        self._pump.start()
        self._submit(self._do_start)

    def close(self, timeout: float = 10.0) -> None:
        """Shut the worker down and stop the reader thread; safe to call twice."""
        self._pump.stop()
        if self._thread is None:
            return
        self._submit(self._do_close)
        self._stopping.set()
        self._thread.join(timeout)
        self._thread = None

    @property
    def worker_pid(self) -> int | None:
        return self._client.pid

    @property
    def engine_log_path(self) -> Path | None:
        """The engine worker's log file (llama.cpp's lines), for View → Log."""
        return self._client.log_path

    @property
    def last_load(self) -> LoadSettings | None:
        return self._last_load

    # --- requests (GUI thread; each returns at once) ------------------------------------------------

    def load(self, settings: LoadSettings) -> None:
        """Raises SettingsError at once for invalid settings; everything else arrives as signals."""
        settings.validate()
        self._last_load = settings
        self.loaded = None
        self._submit(self._do_load, settings)

    def cancel_load(self) -> None:
        """A load cannot be interrupted inside llama.cpp: end the worker and start a fresh one."""
        self._submit(self._do_cancel_load)

    def generate(self, messages: list[dict[str, str]], sampling: SamplingSettings, *,
                 continue_answer: bool = False, raw: bool = False) -> None:
        """Raises SettingsError at once; the request id comes with ``generation_started``. See ``Generate``
        for ``continue_answer`` and ``raw``."""
        sampling.validate()
        if self.tuning:
            raise SettingsError(BUSY_TUNING)
        self.generating = True
        self._submit(self._do_generate, list(messages), sampling, continue_answer, raw)

    def cancel(self) -> None:
        """Stop the current generation; it ends with ``generation_finished`` (reason "cancelled")."""
        self._submit(self._do_cancel)

    def unload(self) -> None:
        self._last_load = None
        self.loaded = None  # at once, as for load: nothing may be sent to the model being unloaded
        self._submit(self._do_unload)

    @property
    def restarts_after_crash(self) -> bool:
        """Whether the latest crash is followed by a restart and a reload (app.engine.supervisor's rule)."""
        return self.auto_restart and self._last_load is not None and may_restart(self.crashes_on_load)

    def restart(self) -> None:
        """A fresh worker, reloading the last models when there were any."""
        self._submit(self._do_restart, self._last_load)

    def list_devices(self, rpc_servers: tuple[str, ...] = ()) -> None:
        """Ask the worker for llama.cpp's devices (with these RPC servers); the answer is ``devices_listed``."""
        self._submit(self._do_list_devices, rpc_servers)

    @contextmanager
    def lend_client(self) -> Iterator[EngineClient]:
        """This engine's client for a measurement off the GUI thread (Tune): the reader thread waits until it
        comes back, so the measurement reads the worker's replies itself and the one worker (with its one copy
        of the models) stays the window's. Requests sent meanwhile run afterwards, in order. Call it off the GUI
        thread and the reader thread."""
        lent, back = threading.Event(), threading.Event()

        def hold() -> None:
            lent.set()
            back.wait()

        self._submit(hold)
        while not lent.wait(0.1):
            if self._thread is None or not self._thread.is_alive():
                raise SettingsError("The window's engine has stopped.")
        try:
            yield self._client
        finally:
            back.set()

    def _do_list_devices(self, rpc_servers: tuple[str, ...]) -> None:
        self._client.list_devices(rpc_servers)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._commands.put((fn, args))

    # --- reader thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._run_commands()
            if self._stopping.is_set() and self._commands.empty():
                return
            if self._client.state == "stopped":
                try:  # no worker: nothing to read, so wait for the next command
                    fn, args = self._commands.get(timeout=0.1)
                except queue.Empty:
                    continue
                self._call(fn, args)
                continue
            try:
                event = self._client.poll(POLL_SECONDS)
            except Exception as exc:  # a bug in the client must not kill the reader thread silently
                self._push(EngineError(f"Reading from the engine failed: {exc}", kind="bridge"))
                time.sleep(POLL_SECONDS)
                continue
            if event is not None:
                self._handle(event)

    def _run_commands(self) -> None:
        while True:
            try:
                fn, args = self._commands.get_nowait()
            except queue.Empty:
                return
            self._call(fn, args)

    def _call(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._push(EngineError(str(exc) or type(exc).__name__, kind=type(exc).__name__))

    def _handle(self, event: Event) -> None:
        if isinstance(event, Finished | EngineError) and (
            isinstance(event, Finished) or event.request_id == self._current_request
        ):
            self._current_request = None
        self.crashes_on_load = self._client.crashes_on_load
        self._push(event)
        if isinstance(event, EngineCrashed):
            self._current_request = None
            if self.restarts_after_crash:
                self._push(_Restarting())
                self._call(self._do_restart, (self._last_load,))

    def _push(self, item: Any) -> None:
        self._pump.push(item)

    def _do_start(self) -> None:
        self._client.start()

    def _do_close(self) -> None:
        self._client.close()

    def _do_load(self, settings: LoadSettings) -> None:
        self._client.load(settings)

    def _do_cancel_load(self) -> None:
        if self._client.state == "load":
            self._client.kill()
            self._client.start()
            self._push(_LoadCancelled())

    def _do_generate(self, messages: list[dict[str, str]], sampling: SamplingSettings, continue_answer: bool,
                     raw: bool) -> None:
        # A request that cannot be sent raises: _call reports it as an EngineError without a request id,
        # which ends the answer that is waiting to start.
        self._current_request = self._client.generate(messages, sampling, continue_answer=continue_answer,
                                                      raw=raw)
        self._push(_Started(self._current_request))

    def _do_cancel(self) -> None:
        if self._current_request is not None:
            self._client.cancel(self._current_request)

    def _do_unload(self) -> None:
        self._client.unload()

    def _do_restart(self, settings: LoadSettings | None) -> None:
        self._current_request = None
        restart_worker(self._client, settings)

    # --- GUI thread: drain and emit -----------------------------------------------------------------

    def drain(self) -> None:
        """Emit what the reader thread queued (normally called by the pump's timer)."""
        self._pump.drain()

    def _emit(self, item: Any) -> None:
        if isinstance(item, Token):
            self.token_received.emit(item)
        elif isinstance(item, PassStats):
            self.stats_updated.emit(item)
        elif isinstance(item, _Started):
            self.generation_started.emit(item.request_id)
        elif isinstance(item, Finished):
            self.generating = False
            self.generation_finished.emit(item)
        elif isinstance(item, PromptProgress):
            self.prompt_progress.emit(item)
        elif isinstance(item, PromptProcessed):
            self.prompt_processed.emit(item)
        elif isinstance(item, LoadProgress):
            self.load_progress.emit(item)
        elif isinstance(item, Loaded):
            self.loaded = item
            self.model_loaded.emit(item)
        elif isinstance(item, Unloaded):
            self.loaded = None
            self.model_unloaded.emit()
        elif isinstance(item, _LoadCancelled):
            self.load_cancelled.emit()
        elif isinstance(item, EngineError):
            if item.request_id is not None or self.generating:
                self.generating = False
            self.engine_error.emit(item)
        elif isinstance(item, EngineCrashed):
            self.generating = False
            self.loaded = None
            self.engine_crashed.emit(item)
        elif isinstance(item, _Restarting):
            self.engine_restarting.emit()
        elif isinstance(item, Log):
            self.log_received.emit(item)
        elif isinstance(item, Devices):
            self.devices_listed.emit(item)

