"""What `specdeck serve` refuses before a route runs, and what it refuses to hold open.

A web page the user visits can make the browser talk to 127.0.0.1 in two ways that need no CORS preflight:

- a "simple" cross-origin POST (``text/plain``, a form, or from a sandboxed frame with ``Origin: null``): the
  page cannot read the answer, but the model runs and the text lands in the history. Every POST must be
  ``application/json`` (which a page can only send after a preflight this server never grants), and any
  request that carries an ``Origin`` other than the server's own is refused.
- DNS rebinding: a name the attacker controls resolves to 127.0.0.1, and the page then reads the answers.
  The ``Host`` header gives it away; on a loopback address only loopback names are taken. Starlette's
  TrustedHostMiddleware cut ``[::1]:8642`` at the first colon, so it could not be used on IPv6; the host is
  parsed here for both families.

``GuardedH11Protocol`` bounds the connections themselves: at most ``max_connections`` open at once (more are
closed at once with a 503, before the process runs out of file descriptors), a request head must arrive
within ``head_timeout`` seconds of the connection opening or of the last answer (slowloris), and its body within
``body_timeout`` seconds of the head (a body that never comes is answered 408 and the connection closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEAD_TIMEOUT = 10.0  # seconds for a request line and headers; a real client sends them at once
OUT_OF_DESCRIPTORS_NOTE_SECONDS = 10.0  # at most one line this often while the process is out of descriptors
DEFAULT_BODY_TIMEOUT = 30.0  # seconds for a whole request body after its head; 4 MB at 1 Mbit/s takes 32 s
DEFAULT_SEND_TIMEOUT = 30.0  # seconds a streamed chunk may wait for a client that stopped reading
CONNECTIONS_PER_FD = 0.5  # of the process's file limit, the rest left to models, logs, the history, the worker
MAX_CONNECTIONS = 1024
# The kernel's send buffer per connection: Linux grows it to 4 MB on loopback, so a client that stops reading
# pinned 4 MB of kernel memory per socket and took minutes of tokens to notice. 256 kB is many seconds of
# tokens on any link.
SEND_BUFFER_BYTES = 256 << 10

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
         b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
_LATE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` or ``[v6]:port`` as (host, port); None if it is not one of those."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    elif value.count(":") == 1:
        host, port = value.split(":")
    elif ":" in value:
        return None  # a bare IPv6 address is not a Host header
    else:
        host, port = value, ""
    if not host or (port and not port.isdigit()):
        return None
    return host.lower(), int(port) if port else None


def default_max_connections() -> int:
    try:
        import resource  # not on Windows, whose event loop has no such descriptor limit
    except ImportError:
        return MAX_CONNECTIONS // 4
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return MAX_CONNECTIONS // 4
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, int(soft * CONNECTIONS_PER_FD)))


def error_body(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()


class RequestGuard:
    """ASGI middleware: the Host, Origin and Content-Type checks above."""

    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, code = refusal
        body = error_body(message, code)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = split_host(headers.get("host", ""))
        if self.loopback_only and (host is None or not is_loopback(host[0])):
            return 400, ("The Host header must name this computer (localhost, 127.0.0.1 or [::1]); a page "
                         "elsewhere that resolves to this address is refused."), "invalid_host"
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, host, scope):
            return 403, (f"Requests from web pages ({origin[:80]}) are refused: this server answers programs, "
                         "not browsers."), "cross_origin"
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return 415, (f"The request body must be sent as application/json, not "
                             f"{media[:60] or 'without a Content-Type'}."), "unsupported_media_type"
        return None

    @staticmethod
    def _same_origin(origin: str, host: tuple[str, int | None] | None, scope: Scope) -> bool:
        if host is None:
            return False
        try:
            parts = urlsplit(origin)
            origin_port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        host_port = host[1] or (scope.get("server") or ("", 80))[1]
        return (parts.scheme == scope.get("scheme", "http") and (parts.hostname or "") == host[0].strip("[]")
                and origin_port == host_port)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and deadlines for each request head and body."""

    max_connections = MAX_CONNECTIONS
    head_timeout = DEFAULT_HEAD_TIMEOUT
    body_timeout = DEFAULT_BODY_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            body = error_body(f"The server has {self.max_connections} connections open, the most it keeps; "
                              "retry in 5 s.", "too_many_connections")
            transport.write(_BUSY % (len(body), body))
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._await_head()

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_late, self.cycle)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self, waiting_cycle: Any) -> None:
        self._head_timer = None
        if self.cycle is waiting_cycle and not self.transport.is_closing():
            self.transport.close()  # no request head in time: the socket and its descriptor are freed

    def _await_body(self) -> None:
        self._cancel_body_timer()
        if self.cycle is not None and self.cycle.more_body:
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_late, self.cycle)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_late(self, waiting_cycle: Any) -> None:
        self._body_timer = None
        if self.cycle is not waiting_cycle or not waiting_cycle.more_body or self.transport.is_closing():
            return
        if not waiting_cycle.response_started:
            body = error_body(f"The request body did not arrive within {self.body_timeout:g} s of its headers.",
                              "request_timeout")
            self.transport.write(_LATE % (len(body), body))
        # Closing tells the route waiting for the body that the client is gone (uvicorn's disconnect), so its
        # slot and the socket's descriptor are freed.
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:
            self._cancel_head_timer()  # a request head arrived
            self._await_body()
        elif self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._await_head()  # bytes of a next request after a keep-alive answer
        if self._body_timer is not None and (self.cycle is None or not self.cycle.more_body):
            self._cancel_body_timer()  # the whole body is in

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)


def guarded_protocol(max_connections: int, head_timeout: float,
                     body_timeout: float = DEFAULT_BODY_TIMEOUT) -> type[GuardedH11Protocol]:
    return type("SpecDeckH11Protocol", (GuardedH11Protocol,),
                {"max_connections": max_connections, "head_timeout": head_timeout, "body_timeout": body_timeout})


class LoopErrors:
    """The serving event loop's exception handler: one line per burst when the process runs out of descriptors.

    Past the file limit asyncio's accept loop reports every connection it cannot take, up to the listen backlog
    (2048) per pass, each with a traceback through the logging module, whose log file then cannot be opened
    either: a burst wrote megabytes of "Logging error" to stderr. Those reports are said in one line at most
    every ``every`` seconds, with a count; anything else goes to asyncio's own handler.
    """

    def __init__(self, log: Callable[[str], None], every: float = OUT_OF_DESCRIPTORS_NOTE_SECONDS) -> None:
        self.log = log
        self.every = every
        self._said_at = -math.inf
        self._unsaid = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._said_at < self.every:
            self._unsaid += 1
            return
        exc = context.get("exception")
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "out of system resources"
        since = f"; {self._unsaid} more refused since the last note" if self._unsaid else ""
        self._said_at, self._unsaid = now, 0
        self.log(f"new connections wait: the process is out of file descriptors ({why}){since}. Raise the file "
                 "limit (ulimit -n) or lower the number of clients.")
