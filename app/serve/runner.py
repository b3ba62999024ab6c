"""The engine side of `specdeck serve`: one thread owns the engine client, answers one request at a time.

The HTTP side submits a ``Job`` and reads its events from an asyncio queue; this thread sends the request to
the worker process, forwards every event, counts it into ``/metrics`` and writes the exchange to the history
database (marked as an API request). A cancelled job (the client went away) is cancelled in the worker
within one verify pass. When the worker dies the job gets ``EngineCrashed`` and the worker is restarted
and the model loaded again; ``/health`` answers 503 meanwhile.

The history is written as the window writes it: on its own writer thread (``HistoryThread``) over a
``BufferedHistory``, so an answer never waits for a save, and a database another program has locked keeps the
writes in memory, in order, until it is free (or, at exit, in a side file the next start writes in).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.client import EngineClient
from app.engine.stops import StopCut
from app.engine.supervisor import gave_up_sentence, may_restart, restart_worker
from app.engine.tool_calls import plain_history
from app.errors import AppError
from app.events import (
    EngineCrashed,
    EngineError,
    Event,
    Finished,
    Loaded,
    LoadProgress,
    MessageStats,
    PassStats,
    PromptProcessed,
    Token,
    TokensCounted,
)
from app.params import LoadSettings, SamplingSettings
from app.serve.metrics import ServeMetrics
from app.storage.measured import keep_loaded_answer

if TYPE_CHECKING:
    from app.storage.history_writer import HistoryThread

HISTORY_FLUSH_SECONDS = 1.0  # an answer's text is saved this often while it streams; waiting writes are retried
HISTORY_RETRY_SECONDS = 30.0
API_TITLE_CHARS = 60
# Loading times every draft width without a word to the client; on a busy machine that took over the
# client's default 120 s here, and a server that never comes up is worse than a hang noticed late.
WATCHDOG_SECONDS = 600.0


@dataclass(frozen=True)
class JobEnded:
    """The last item of a job's queue: nothing follows."""


@dataclass(frozen=True)
class _RestartIfDead:
    """Asks the engine thread to restart a worker that died while idle, before a client waits on it."""


@dataclass
class Job:
    messages: tuple[dict[str, Any], ...]
    sampling: SamplingSettings
    loop: asyncio.AbstractEventLoop
    raw: bool = False  # /v1/completions: the prompt as it is, no chat template (the engine's completion mode)
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    stops: tuple[str, ...] = ()  # the answer ends before the first of these; cut on the engine thread
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI function tools for the chat template
    count_only: bool = False  # count the prompt's tokens (Anthropic's count_tokens); nothing is generated
    saved: bool = True  # False: the client saves the exchange itself (the window chatting through its own server)

    def cancel(self) -> None:
        self.cancelled.set()

    def put(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is going down
            self.cancel()


class EngineRunner:
    """Loads ``settings`` in a worker process and answers ``Job``s in order, one at a time."""

    def __init__(self, settings: LoadSettings, metrics: ServeMetrics, *, history_path: Path | None = None,
                 log: Callable[[str], None] | None = None, log_dir: Path | None = None,
                 on_unusable: Callable[[str], None] | None = None) -> None:
        self.settings = settings.validate()
        self.metrics = metrics
        self.history_path = history_path
        self.log = log or (lambda line: None)
        self.log_dir = log_dir
        # Called once, on the engine thread, when the model cannot be loaded at start (`specdeck serve` exits).
        self.on_unusable = on_unusable
        self.state = "loading"  # loading, ready, error, stopped
        self.message = ""
        self.loaded: Loaded | None = None
        self.load_fraction = 0.0
        self.restarts = 0
        self._jobs: queue.Queue[Job | _RestartIfDead | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="specdeck-serve-engine", daemon=True)
        self._history: HistoryThread | None = None
        self._history_retry_at = 0.0  # monotonic time of the next try to open a history that would not open
        self._client: EngineClient | None = None
        self._restart_asked = False
        self._warned: set[str] = set()  # template warnings already logged
        # What answers teach the drafter ranking, saved off the engine thread (a file write and its fsync).
        self._measurements = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdeck-serve-measured")

    # --- public, any thread -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    @property
    def worker_dead(self) -> bool:
        """The model was loaded but its worker process is gone (killed, out of memory) and not yet restarted."""
        client = self._client
        return self.state == "ready" and client is not None and client.pid is not None and not client.alive

    @property
    def worker_stopped(self) -> bool:
        """The worker process exists but cannot run: stopped (SIGSTOP, a debugger) or a zombie not yet reaped."""
        pid = self.worker_pid
        if pid is None:
            return False
        import psutil

        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return True
        except (psutil.Error, OSError):
            return False  # not ours to read, or no descriptor left to read it with: nothing is known against it
        return status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE,
                          psutil.STATUS_DEAD)

    def restart_if_dead(self) -> None:
        """Have the engine thread restart a dead idle worker now rather than at the next request."""
        if not self._restart_asked:
            self._restart_asked = True
            self._jobs.put(_RestartIfDead())

    def stop(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)
        self._measurements.shutdown(wait=False)

    def sync_history(self) -> None:
        """Wait until the history writes queued so far have run (those a locked database keeps waiting stay)."""
        history = self._history
        if history is not None:
            history.sync()

    @property
    def worker_pid(self) -> int | None:
        return self._client.pid if self._client is not None and self._client.alive else None

    @property
    def model_id(self) -> str:
        return Path(self.settings.target_path).name

    @property
    def drafter_name(self) -> str | None:
        path = self.settings.draft.drafter_path
        return Path(path).name if path else None

    # --- engine thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            client = self._client = EngineClient(log_dir=self.log_dir, watchdog_seconds=WATCHDOG_SECONDS)
            self._open_history()
            self._load(client)
        except Exception as exc:  # the thread must not die silently with the process still answering
            self.state, self.message = "error", f"the engine could not start: {type(exc).__name__}: {exc}"
            self.log(self.message)
        if self.state == "error" and self.on_unusable is not None:
            self.on_unusable(self.message)
        if self._client is None:
            return
        client = self._client
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=HISTORY_FLUSH_SECONDS)
                except queue.Empty:
                    if self._history is not None:
                        self._history.flush_pending()  # writes a locked database kept waiting, once it is free
                    continue
                if job is None:
                    break
                if isinstance(job, _RestartIfDead):
                    self._restart_asked = False
                    if self.worker_dead:
                        self._restart(client, "the engine was gone while idle; restarting it and loading the "
                                      "model again")
                    continue
                if job.cancelled.is_set():
                    job.put(JobEnded())
                    continue
                if self.state == "ready" and not client.alive:  # died while idle (killed, out of memory)
                    self._restart(client, "the engine was gone while idle; restarting it and loading the model "
                                  "again")
                if self.state != "ready":
                    job.put(EngineError(self._not_ready_message(), kind="not_loaded"))
                    job.put(JobEnded())
                    continue
                try:
                    (self._count_tokens if job.count_only else self._answer)(client, job)
                finally:
                    job.put(JobEnded())
        finally:
            self.state = "stopped"
            client.close()
            if self._history is not None:
                self._history.close()

    def _restart(self, client: EngineClient, why: str) -> None:
        # Not ready from now: starting a worker takes seconds, and /health must not say "ok" meanwhile.
        self.state, self.loaded = "loading", None
        self.log(why)
        self.restarts += 1
        restart_worker(client, None)
        self._load(client)

    def _not_ready_message(self) -> str:
        if self.state == "loading":
            return "The model is still loading; try again in a moment."
        return f"The model is not loaded: {self.message}"

    def _load(self, client: EngineClient) -> None:
        for attempt in itertools.count(1):
            self.state, self.loaded, self.load_fraction = "loading", None, 0.0
            try:
                client.load(self.settings)
            except AppError as exc:
                self.state, self.message = "error", str(exc)
                return
            for event in client.events(timeout=3600):
                if isinstance(event, LoadProgress):
                    if event.stage != "timing":  # the pass timing after the load has its own 0-1
                        self.load_fraction = event.fraction
                elif isinstance(event, Loaded):
                    self.loaded = event
                    self.metrics.on_loaded(event)
                    self.state, self.message = "ready", ""
                    self.log(f"loaded {event.target.name} (context {event.n_ctx}, "
                             f"{event.plain_tps:.1f} tok/s plain)")
                    if event.gpu_layers_note:
                        self.log(event.gpu_layers_note)
                    return
                elif isinstance(event, EngineError):
                    self.state, self.message = "error", event.message
                    self.log(f"could not load the model: {event.message}")
                    return
                elif isinstance(event, EngineCrashed):
                    self.log(f"the engine died while loading (attempt {attempt}): {event.message}")
                    if not may_restart(client.crashes_on_load):
                        self.state = "error"
                        self.message = f"{event.message} {gave_up_sentence(client.crashes_on_load)}"
                        return
                    restart_worker(client, None)
                    break
            else:  # the events ended with no answer to the load
                self.state, self.message = "error", "The engine did not answer the load."
                return

    def _answer(self, client: EngineClient, job: Job) -> None:
        request_id = client.generate(list(job.messages), job.sampling, raw=job.raw, tools=job.tools)
        self.metrics.requests_processing.set(1)
        # The exchange is saved once the prompt is in the context: a prompt refused as too long (100k messages)
        # writes nothing, and the user's turn is still saved before the first token.
        answer_id: int | None = None
        # The stop sequences are matched here, on the thread that writes the history, so that the client and
        # the history get the same cut answer whatever the HTTP side is doing.
        cut = StopCut(job.stops)
        text: list[str] = []
        last_flush = time.monotonic()
        sent_cancel = False
        try:
            while True:
                if (job.cancelled.is_set() or cut.stopped) and not sent_cancel:
                    client.cancel(request_id)
                    sent_cancel = True
                event = client.poll(0.05)
                if event is None:
                    continue
                if getattr(event, "request_id", request_id) not in (request_id, None):
                    continue  # a late event of an earlier request
                if isinstance(event, PromptProcessed):
                    answer_id = self._history_begin(job)
                    if event.warning and event.warning not in self._warned:
                        self._warned.add(event.warning)
                        self.log(event.warning)
                if isinstance(event, Token):
                    event = cut.token(event)
                elif isinstance(event, Finished):
                    tail = cut.tail()
                    if tail:
                        job.put(Token(request_id, tail, (), ()))
                        text.append(tail)
                    event = cut.finished(event, "".join(text))
                self._observe(event)
                # An answer's last save is queued before the client hears the end (it does not wait for it), so
                # whoever waits for the history's queued writes after the answer finds the turn saved.
                if isinstance(event, Finished):
                    status = "cancelled" if event.reason == "cancelled" else "complete"
                    self._history_finish(answer_id, event.text, status, event.stats, event.reason)
                    job.put(event)
                    self._keep_measured(event.stats)
                    return
                if isinstance(event, EngineError):
                    self.metrics.on_ended("error")
                    self._history_finish(answer_id, "".join(text) + cut.tail(), "error", None, "error")
                    job.put(event)
                    return
                if isinstance(event, EngineCrashed):
                    self.metrics.on_ended("crashed")
                    self._history_finish(answer_id, "".join(text) + cut.tail(), "error", None, "crashed")
                    job.put(event)
                    self._restart(client, f"the engine died: {event.message}; restarting it")
                    return
                job.put(event)
                if isinstance(event, Token):
                    text.append(event.text)
                    if (answer_id is not None and self._history is not None
                            and time.monotonic() - last_flush >= HISTORY_FLUSH_SECONDS):
                        self._history.update_answer(answer_id, "".join(text))
                        last_flush = time.monotonic()
        finally:
            self.metrics.requests_processing.set(0)

    def _count_tokens(self, client: EngineClient, job: Job) -> None:
        """The prompt's size alone: rendered and tokenized in the worker, as an answer's would be."""
        request_id = client.count_tokens(list(job.messages), job.tools)
        while True:
            event = client.poll(0.05)
            if event is None or getattr(event, "request_id", request_id) not in (request_id, None):
                continue  # nothing yet, or a late event of an earlier request
            if isinstance(event, TokensCounted | EngineError | EngineCrashed):
                job.put(event)
                if isinstance(event, EngineCrashed):
                    self._restart(client, f"the engine died: {event.message}; restarting it")
                return

    def _observe(self, event: Event) -> None:
        if isinstance(event, PassStats):
            self.metrics.on_pass(event, self.loaded.n_ctx if self.loaded else 0)
        elif isinstance(event, PromptProcessed):
            self.metrics.on_prompt(event)
        elif isinstance(event, Finished):
            self.metrics.on_finished(event)

    # --- history (engine thread only: a HistoryStore belongs to the thread that opened it) ------------

    def _open_history(self) -> None:
        if self.history_path is None or self._history is not None or time.monotonic() < self._history_retry_at:
            return
        from app.storage.buffered_history import BufferedHistory
        from app.storage.history_writer import HistoryThread

        path = self.history_path
        try:
            self._history = HistoryThread(lambda: BufferedHistory(path), on_error=self._history_failed)
        except AppError as exc:
            retrying = self._history_retry_at == 0.0
            self._history_retry_at = time.monotonic() + HISTORY_RETRY_SECONDS
            if retrying:
                self.log(f"API requests are not saved to the history for now (tried again every "
                         f"{HISTORY_RETRY_SECONDS:.0f} s): {exc}")
            return
        if self._history_retry_at:
            self.log("the history opened; API requests are saved again")

    def _history_failed(self, exc: Exception) -> None:
        """A write that failed on the writer thread (a full disk; a lock only delays a write): said in the log."""
        self.log(f"history: {exc}")

    def _history_begin(self, job: Job) -> int | None:
        if not job.saved:
            return None
        self._open_history()  # one that could not open at start (full disk) is tried again
        history = self._history
        if history is None:
            return None
        messages = plain_history(job.messages)  # tool turns as the text a model without tools would read
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
        title = " ".join(first_user.split())[:API_TITLE_CHARS] or "API request"
        # Handles, not ids: the writes are queued on the writer thread, which puts the real ids in their place.
        chat_id = history.new_chat_later(title, system, origin="api")
        for message in messages:
            if message["role"] != "system":
                history.add_message_later(chat_id, message["role"], message["content"])
        return history.begin_answer_later(chat_id, model=self.settings.target_path,
                                          drafter=self.settings.draft.drafter_path, sampling=job.sampling)

    def _keep_measured(self, stats: MessageStats) -> None:
        loaded = self.loaded
        if loaded is not None:
            self._measurements.submit(keep_loaded_answer, loaded, stats)

    def _history_finish(self, answer_id: int | None, text: str, status: str, stats: object, reason: str) -> None:
        if answer_id is not None and self._history is not None:
            self._history.finish_answer(answer_id, text, status, stats, stop_reason=reason)
