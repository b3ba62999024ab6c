"""Runs untrusted chat templates in a child process with hard limits on time and memory.

The sandbox in ``template_sandbox`` stops Python-level loops, but one C-level operation (``c in b`` over
two huge lists, printing a list of millions of lists) runs to its end and can take hours or gigabytes.
Only a process can be stopped mid-operation, so templates render in one warm child that:

- imports only Jinja and the renderer (never llama.cpp, numpy or Qt), started with ``multiprocessing``'s
  spawn context, which also works in the frozen app (``packaging/entry.py`` calls ``freeze_support()``);
- has an address-space limit (``RLIMIT_AS``, where the OS enforces it) and a CPU-time limit per render,
  so an orphaned child dies on its own; the parent also watches its resident memory and CPU time (psutil)
  and kills it past the memory limit or once the render has spent its CPU time (wall time does not count:
  on a loaded machine a harmless template just takes longer).

A template stopped this way is remembered, so later messages fall back at once instead of each waiting
for the deadline. A killed child is replaced on the next render.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from app.engine.template_sandbox import TemplateLimitError, TemplateMemoryError, time_message
from app.errors import TemplateError

MEMORY_HEADROOM_BYTES = 512 * 1024 * 1024  # above the child's size at rest; real templates need a few MB
START_TIMEOUT_S = 60.0  # a cold interpreter on a busy machine; not counted against a render
GRACE_S = 0.5  # past the in-child deadline, which stops Python-level loops with a clearer message
# The render's bound is CPU time, so a busy machine does not refuse a harmless template; a child that gets no
# CPU at all for this long past the bound (a stalled machine) is stopped all the same.
STALL_S = 30.0
POLL_S = 0.05


def _memory_message(limit: int) -> str:
    return (f"The model's chat template used more than {limit // (1024 * 1024)} MB of memory while rendering "
            "and was stopped.")


# --- the child ----------------------------------------------------------------------------------


def _vm_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _limit_address_space(headroom: int) -> None:
    try:
        import resource
    except ImportError:  # Windows: the parent's memory watch is the limit
        return
    size = _vm_bytes()  # only Linux reports it; macOS does not enforce RLIMIT_AS anyway
    if size is None:
        return
    limit = size + headroom
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _limit_cpu(seconds: float) -> None:
    """SIGXCPU ends this process if one render spends more CPU than its deadline (the parent may be gone)."""
    try:
        import resource
    except ImportError:
        return
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(spent + seconds) + 2
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def serve(conn: Connection, headroom: int) -> None:
    """The child's loop: render each request in-process under the limits, answer, repeat until EOF."""
    _limit_address_space(headroom)
    from app.engine.template_sandbox import render_in_process

    with contextlib.suppress(TemplateError):
        render_in_process("{% for m in messages %}{{ m['content'] }}{% endfor %}", [])  # Jinja's compiler, warmed
    conn.send(("ready", None))
    while True:
        try:
            template, messages, options = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        _limit_cpu(float(options.get("time_limit", 2.0)) + GRACE_S + 1.0)
        try:
            reply: tuple[str, Any] = ("ok", render_in_process(template, messages, **options))
        except (TemplateMemoryError, MemoryError):
            reply = ("limit", _memory_message(headroom))
        except TemplateLimitError as exc:
            reply = ("limit", str(exc))
        except TemplateError as exc:
            reply = ("error", str(exc))
        conn.send(reply)
        if reply[0] == "limit":
            return  # a fresh child is cheaper than trusting a heap that just ran out


# --- the parent ---------------------------------------------------------------------------------


def _start_child(headroom: int) -> tuple[Any, Connection]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=serve, args=(child, headroom), name="specdeck-template", daemon=True)
    # The engine worker is itself a daemonic process, and multiprocessing refuses children there only
    # because it cannot clean them up: this child exits by itself at EOF or past its CPU limit.
    config: dict[str, Any] = getattr(mp.current_process(), "_config", {})
    was_daemon = config.get("daemon")
    config["daemon"] = False
    try:
        proc.start()
    finally:
        if was_daemon is not None:
            config["daemon"] = was_daemon
        else:
            config.pop("daemon", None)
    child.close()
    return proc, parent


class TemplateRunner:
    """One warm renderer child, shared by the threads of this process (one render at a time)."""

    def __init__(self, headroom: int = MEMORY_HEADROOM_BYTES) -> None:
        self.headroom = headroom
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Connection | None = None
        self._rest_rss = 0
        self._ready = False  # the child said it is ready (it has imported the renderer)
        # template -> (the size of the smallest chat it was stopped on, why): a template too slow for one long
        # chat is refused at once for chats as large or larger, and still tried on smaller ones, so one client's
        # huge request does not switch every later client to the fallback format.
        self._refused: dict[str, tuple[int, str]] = {}

    @property
    def pid(self) -> int | None:
        return int(self._proc.pid) if self._proc is not None and self._proc.is_alive() else None

    def _ensure_child(self) -> Connection:
        try:
            if not (self._proc is not None and self._proc.is_alive() and self._conn is not None):
                self._stop_child()
                self._proc, self._conn = _start_child(self.headroom)
                self._ready = False
            if not self._ready:
                if not self._conn.poll(START_TIMEOUT_S):
                    raise TimeoutError
                self._conn.recv()
                self._ready = True
                self._rest_rss = self._usage()[0] or 0
        except (OSError, EOFError, TimeoutError, RuntimeError) as exc:
            self._stop_child()
            raise TemplateError(
                f"The chat template renderer could not be started ({type(exc).__name__}), so the model's "
                "template was not used."
            ) from None
        return self._conn

    def warm(self) -> None:
        """Start the child now (it imports Jinja while the model loads), so the first message does not wait."""
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._stop_child()
                try:
                    self._proc, self._conn = _start_child(self.headroom)
                except (OSError, RuntimeError):
                    self._stop_child()  # the first render tries again and says why
                    return
                self._ready = False

    def _usage(self) -> tuple[int | None, float | None]:
        """The child's resident memory and CPU time so far (user and system), read together; None where they
        cannot be read (gone already, or no permission: the stall bound still holds)."""
        try:
            import psutil

            proc = psutil.Process(self._proc.pid)
            with proc.oneshot():
                times = proc.cpu_times()
                return int(proc.memory_info().rss), float(times.user + times.system)
        except Exception:
            return None, None

    def _stop_child(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        with self._lock:
            self._stop_child()

    def render(self, template: str, messages: list[dict[str, str]], options: dict[str, Any]) -> str:
        """The rendered text, or TemplateError (TemplateLimitError when it was stopped for time or memory)."""
        time_limit = float(options.get("time_limit", 2.0))
        size = chat_size(messages)
        with self._lock:
            refused = self._refused.get(template)
            if refused is not None and size >= refused[0]:
                raise TemplateLimitError(refused[1])
            conn = self._ensure_child()
            try:
                conn.send((template, messages, options))
            except (OSError, ValueError) as exc:
                self._stop_child()
                raise TemplateError(f"The chat template could not be sent to its renderer: {exc}.") from None
            cpu_at_start = self._usage()[1]
            stalled_at = time.monotonic() + time_limit + GRACE_S + STALL_S
            while True:
                try:
                    if conn.poll(POLL_S):
                        kind, value = conn.recv()
                        break
                except (EOFError, OSError):  # it died: the address-space or CPU limit, or a crash
                    self._proc.join(1)
                    out_of_cpu = self._proc.exitcode == -getattr(signal, "SIGXCPU", -1)
                    self._stop_child()
                    return self._refuse(template, size, time_message(time_limit) if out_of_cpu
                                        else _memory_message(self.headroom))
                rss, cpu = self._usage()
                if rss is not None and rss - self._rest_rss > self.headroom:
                    self._stop_child()
                    return self._refuse(template, size, _memory_message(self.headroom))
                over_cpu = cpu is not None and cpu_at_start is not None and cpu - cpu_at_start > time_limit + GRACE_S
                if over_cpu or time.monotonic() > stalled_at:
                    self._stop_child()
                    return self._refuse(template, size, time_message(time_limit))
            if kind == "ok":
                return str(value)
            if kind == "limit":
                self._stop_child()
                return self._refuse(template, size, str(value))
            raise TemplateError(str(value))

    def _refuse(self, template: str, size: int, message: str) -> str:
        known = self._refused.get(template)
        self._refused[template] = (min(size, known[0]) if known else size, message)
        raise TemplateLimitError(message)


def chat_size(messages: list[dict[str, str]]) -> int:
    """How much a template has to render: the characters of every field, and one per message for its frame."""
    return sum(1 + sum(len(str(value)) for value in m.values()) for m in messages)


_shared: TemplateRunner | None = None
_shared_lock = threading.Lock()


def shared_runner() -> TemplateRunner:
    """The process's renderer (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TemplateRunner()
        return _shared
