"""The HTTP side of `specdeck serve`: a Starlette app over one ``EngineRunner``, run by uvicorn.

One request is answered at a time. A second client waits in a bounded queue (``max_waiting`` requests, at
most ``wait_seconds`` each); past either bound it gets 429 with ``Retry-After``. A client that goes away is
cancelled in the engine within one verify pass. Every refusal is a 4xx in OpenAI's error shape; an engine
crash is a 500 with its reason, and the worker is restarted. Over 450 lines: the routes share one request
life cycle (queue, limits, streaming, cancel, history), which reads best in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.engine.tool_calls import ToolCall
from app.errors import SettingsError
from app.events import (
    EngineCrashed,
    EngineError,
    Finished,
    MessageStats,
    PassStats,
    PromptProcessed,
    Token,
    TokensCounted,
)
from app.serve import anthropic, protocol
from app.serve.api_error import ApiError
from app.serve.guard import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEAD_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    LoopErrors,
    RequestGuard,
    default_max_connections,
    guarded_protocol,
    is_loopback,
)
from app.serve.metrics import CONTENT_TYPE, ServeMetrics
from app.serve.protocol import Answer, CompletionRequest, Limits
from app.serve.runner import EngineRunner, Job, JobEnded
from app.serve.tool_answer import ToolAnswer

DEFAULT_PORT = 8642
DISCONNECT_POLL_SECONDS = 0.25
# The window's chat through the window's own server saves its conversation itself: its requests carry this
# header with the server's ``client_saves_token``, and the server does not save them a second time.
CLIENT_SAVES_HEADER = "X-SpecDeck-Client-Saves"
UNAUTHORIZED = ApiError(401, "A valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY).",
                        code="invalid_api_key")
# A route's answer to a running job, in its API's shape: (request, job, first event, HTTP request, close).
Reply = Callable[[CompletionRequest, Job, Any, Request, Callable[[], None]], Awaitable[Response]]


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    max_waiting: int = 4
    wait_seconds: float = 120.0
    retry_after_seconds: int = 5
    send_timeout_seconds: float = DEFAULT_SEND_TIMEOUT  # a client that reads nothing for this long is dropped
    head_timeout_seconds: float = DEFAULT_HEAD_TIMEOUT
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT  # for the whole body, from the end of the head
    max_connections: int = field(default_factory=default_max_connections)
    client_saves_token: str | None = None  # see CLIENT_SAVES_HEADER; None: every request is saved

    def check(self) -> ServeOptions:
        if not is_loopback(self.host) and not self.api_key:
            raise SettingsError(f"Serving on {self.host} makes the model reachable from other machines; "
                                "give an API key (--api-key, --api-key-file or SPECDECK_API_KEY) to do that.")
        if self.api_key and any(ord(c) < 32 or ord(c) == 127 for c in self.api_key):
            raise SettingsError("The API key has control characters, which no HTTP header can carry.")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"The port must be between 0 and 65535, not {self.port}.")
        for name, seconds in (("head", self.head_timeout_seconds), ("body", self.body_timeout_seconds)):
            if not seconds > 0:
                raise SettingsError(f"The request {name} timeout must be above 0 s, not {seconds}.")
        if self.max_connections < 1:
            raise SettingsError(f"The connection limit must be at least 1, not {self.max_connections}.")
        return self


class ClientGone(Exception):
    pass


class ClientStalled(Exception):
    """The client is connected but has read nothing for the send timeout."""


class Admission:
    """One request at a time; at most ``max_waiting`` wait, each at most ``wait_seconds``."""

    def __init__(self, options: ServeOptions, metrics: ServeMetrics) -> None:
        self.options = options
        self.metrics = metrics
        self.waiting = 0
        self._lock: asyncio.Lock | None = None

    def _busy(self, why: str) -> ApiError:
        return ApiError(429, f"The server is answering another request and {why}; retry in "
                        f"{self.options.retry_after_seconds} s.", kind="rate_limit_error", code="server_busy",
                        retry_after=self.options.retry_after_seconds)

    async def acquire(self, gone: Callable[[], Awaitable[object]] | None = None) -> None:
        """Wait for the slot. ``gone`` returns once the client has disconnected: one that leaves while it waits
        gives its place in the queue back at once (``ClientGone``) rather than when the slot would be free."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        if self._lock.locked() and self.waiting >= self.options.max_waiting:
            raise self._busy(f"{self.waiting} more are waiting")
        self.waiting += 1
        self.metrics.requests_deferred.set(self.waiting - (0 if self._lock.locked() else 1))
        slot = asyncio.ensure_future(self._lock.acquire())
        left = asyncio.ensure_future(gone()) if gone is not None else None
        watched = {slot} if left is None else {slot, left}
        try:
            await asyncio.wait(watched, timeout=self.options.wait_seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this request is cancelled: neither task outlives the wait
            for task in watched:
                task.cancel()
            await asyncio.gather(*watched, return_exceptions=True)
            self.waiting -= 1
            self.metrics.requests_deferred.set(self.waiting)
        held = not slot.cancelled() and slot.exception() is None
        if left is not None and not left.cancelled() and left.exception() is None:
            if held:
                self._lock.release()
            raise ClientGone()
        if not held:
            raise self._busy(f"this one waited {self.options.wait_seconds:.0f} s")

    def release(self) -> None:
        if self._lock is not None and self._lock.locked():
            self._lock.release()


class _Streaming(StreamingResponse):
    """A stream that runs ``on_close`` however it ends (finished, client gone, never started).

    A client that stays connected but stops reading fills the socket's buffers, and then each send waits for
    it for ever, holding the only slot. Each send has ``send_timeout`` seconds; past that the client is
    treated as gone: the generation is cancelled, the slot freed and the connection closed.
    """

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], send_timeout: float) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close
        self._send_timeout = send_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_give_up(message: Any) -> None:
            try:
                await asyncio.wait_for(send(message), self._send_timeout)
            except asyncio.TimeoutError:
                self._on_close()
                raise ClientStalled() from None

        try:
            await super().__call__(scope, receive, send_or_give_up)
        except Exception as exc:  # a task group may wrap it in an exception group
            inner = getattr(exc, "exceptions", (exc,))
            if not all(isinstance(e, ClientStalled) for e in inner):
                raise
            # Returning with the answer unfinished makes uvicorn close the connection.
        finally:
            self._on_close()


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=_retry_after(exc))


def anthropic_error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(anthropic.error_body(exc), status_code=exc.status, headers=_retry_after(exc))


def _retry_after(exc: ApiError) -> dict[str, str] | None:
    return {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None


# The engine's crash messages end with advice for a chat window's user, who restarts the engine by hand; the
# server restarts it by itself, so an API client is told that instead.
_CHAT_ADVICE = (
    (re.compile(r"\s*Your chat is safe; restart the engine to go on\."), ""),
    (re.compile(r"your chat is safe: "), ""),
    (re.compile(r",? and restart the engine\."), "."),
)


def crash_message(message: str) -> str:
    for pattern, replacement in _CHAT_ADVICE:
        message = pattern.sub(replacement, message)
    return (f"The engine crashed: {message.strip()} The server restarts it and loads the model again by itself; "
            "this request can be retried once /health answers 200.")


def engine_error(event: EngineError | EngineCrashed) -> ApiError:
    if isinstance(event, EngineCrashed):
        return ApiError(500, crash_message(event.message), kind="server_error", code="engine_crashed")
    if event.kind == "PromptTooLongError":
        return ApiError(400, event.message, param="messages", code="context_length_exceeded")
    if event.kind in ("SettingsError", "TemplateError"):
        return ApiError(400, event.message)
    if event.kind == "not_loaded":
        return ApiError(503, event.message, kind="server_error", code="model_not_loaded")
    return ApiError(500, event.message, kind="server_error", code=event.kind)


class ServeApp:
    """The routes, bound to one runner."""

    def __init__(self, runner: EngineRunner, metrics: ServeMetrics, options: ServeOptions) -> None:
        self.runner = runner
        self.metrics = metrics
        self.options = options
        self.admission = Admission(options, metrics)
        self.started = int(time.time())
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/props", self.props, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
        ]
        # Web pages the user visits must not reach the model (see app.serve.guard).
        middleware = [Middleware(RequestGuard, loopback_only=is_loopback(options.host))]
        self.app = Starlette(routes=routes, middleware=middleware,
                             exception_handlers={HTTPException: self._http_error, Exception: self._internal_error})

    # --- plumbing -----------------------------------------------------------------------------------

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse({"error": {"message": f"{request.method} {request.url.path}: {exc.detail}.",
                                       "type": kind, "param": None, "code": None}}, status_code=exc.status_code)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        message = f"The server failed on this request: {type(exc).__name__}: {exc}"
        return JSONResponse({"error": {"message": message, "type": "server_error", "param": None, "code": None}},
                            status_code=500)

    def _authorized(self, request: Request) -> bool:
        key = self.options.api_key
        if not key:
            return True
        # The header's bytes against the key's UTF-8: Starlette's decoded headers are latin-1, so a key with any
        # other character could never match as text.
        headers: dict[bytes, bytes] = {}
        for name, value in request.scope["headers"]:
            headers.setdefault(name.lower(), value)
        given = headers.get(b"authorization", b"")
        token = given[7:] if given[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return hmac.compare_digest(token.strip(), key.encode("utf-8"))

    def _client_saves(self, request: Request) -> bool:
        token = self.options.client_saves_token
        given = request.headers.get(CLIENT_SAVES_HEADER)
        # Starlette decodes headers as latin-1: its bytes again, against the token's.
        return bool(token) and given is not None and hmac.compare_digest(given.encode("latin-1"),
                                                                         str(token).encode("utf-8"))

    def _unauthorized(self) -> JSONResponse:
        return error_response(UNAUTHORIZED)

    async def _body(self, request: Request) -> dict[str, Any]:
        limit = self.options.limits.body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"The request body is {declared} bytes; this server takes at most {limit}.",
                           code="body_too_large")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"The request body is over {limit} bytes, the most this server takes.",
                                   code="body_too_large")
                chunks.append(chunk)
        except ClientDisconnect:
            raise ClientGone() from None
        return protocol.parse_json(b"".join(chunks), self.options.limits)

    # --- informational routes ---------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        state = self.runner.state
        if self.runner.worker_dead:
            self.runner.restart_if_dead()
            return JSONResponse({"status": "loading", "message": "The engine stopped while idle; it is being "
                                 "restarted and the model loaded again."}, status_code=503)
        if state == "ready" and self.runner.worker_stopped:
            return JSONResponse({"status": "error", "message": "The engine process is stopped (a signal or a "
                                 "debugger holds it); requests wait until it runs again."}, status_code=503)
        body: dict[str, Any] = {"status": {"ready": "ok"}.get(state, state)}
        if state == "loading":
            body["progress"] = round(self.runner.load_fraction, 3)
        if state in ("error", "stopped") and self.runner.message:
            body["message"] = self.runner.message
        return JSONResponse(body, status_code=200 if state == "ready" else 503)

    async def metrics_text(self, request: Request) -> Response:
        if not self._authorized(request):
            return self._unauthorized()
        return Response(self.metrics.render(), media_type=CONTENT_TYPE.split(";")[0],
                        headers={"Content-Type": CONTENT_TYPE})

    def _model_meta(self) -> dict[str, Any]:
        loaded = self.runner.loaded
        draft = self.runner.settings.draft
        return {
            "engine": "specdeck",
            "n_ctx": loaded.n_ctx if loaded else self.runner.settings.n_ctx,
            "drafter": self.runner.drafter_name,
            "ngram": draft.ngram,
            "adaptive_depth": draft.adaptive,
            "backend": loaded.backend if loaded else None,
            "plain_tokens_per_second": loaded.plain_tps if loaded else None,
        }

    def _model_object(self) -> dict[str, Any]:
        return {"id": self.runner.model_id, "object": "model", "created": self.started, "owned_by": "specdeck",
                "meta": self._model_meta()}

    async def models(self, request: Request) -> Response:
        if not self._authorized(request):
            return self._unauthorized()
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def model(self, request: Request) -> Response:
        if not self._authorized(request):
            return self._unauthorized()
        wanted = request.path_params["model_id"]
        if wanted != self.runner.model_id:
            return error_response(ApiError(404, f"The model {wanted[:200]!r} does not exist; this server serves "
                                           f"{self.runner.model_id!r}.", param="model", code="model_not_found"))
        return JSONResponse(self._model_object())

    async def props(self, request: Request) -> Response:
        """A subset of llama-server's /props, so remote-engine discovery reads both the same way."""
        if not self._authorized(request):
            return self._unauthorized()
        meta = self._model_meta()
        return JSONResponse({
            "model_path": self.runner.settings.target_path,
            "total_slots": 1,
            "default_generation_settings": {"n_ctx": meta["n_ctx"]},
            "build_info": "specdeck",
            "specdeck": meta,
        })

    # --- completions --------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, lambda body: protocol.parse_request(body, self.options.limits, chat=True),
                                    self._openai_reply, error_response)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, lambda body: protocol.parse_request(body, self.options.limits,
                                                                                 chat=False),
                                    self._openai_reply, error_response)

    async def _complete(self, request: Request, parse: Callable[[dict[str, Any]], CompletionRequest],
                        reply: Reply, refuse: Callable[[ApiError], Response], *, count_only: bool = False) -> Response:
        """One request's life: parse, wait for its turn, run the job, ``reply`` in the route's own shape."""
        if not self._authorized(request):
            return refuse(UNAUTHORIZED)
        try:
            parsed = parse(await self._body(request))
            if self.runner.state != "ready":
                raise ApiError(503, self.runner._not_ready_message(), kind="server_error", code="model_not_loaded")
        except ApiError as exc:
            return refuse(exc)
        except ClientGone:
            return Response(status_code=499)
        try:
            await self.admission.acquire(lambda: _disconnected(request))
        except ApiError as exc:
            return refuse(exc)
        except ClientGone:
            return Response(status_code=499)
        if await request.is_disconnected():  # gave up while waiting in the queue: its job is not run
            self.admission.release()
            return Response(status_code=499)
        job = Job(parsed.messages, parsed.sampling, asyncio.get_running_loop(), raw=not parsed.chat,
                  stops=parsed.stop, tools=parsed.tools.tools if parsed.tools else (), count_only=count_only,
                  saved=not self._client_saves(request))
        closed = False

        def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                job.cancel()
                self.admission.release()

        try:
            self.runner.submit(job)
            first = await self._next(job, request)  # errors before the first token get their own status
            if isinstance(first, EngineError | EngineCrashed):
                close()
                return refuse(engine_error(first))
            if isinstance(first, JobEnded):
                close()
                return refuse(ApiError(500, "The engine ended the request without an answer.", kind="server_error"))
            return await reply(parsed, job, first, request, close)
        except ClientGone:
            close()
            return Response(status_code=499)
        except BaseException:
            close()
            raise

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API: the request becomes the OpenAI one it means, checked by the same rules."""
        return await self._complete(request, self._parse_messages, self._messages_reply, anthropic_error_response)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's ``/v1/messages/count_tokens``: the prompt a Messages request would send, counted by the
        model's own template and tokenizer in the worker, without decoding."""
        return await self._complete(request, self._parse_count, self._count_reply, anthropic_error_response,
                                    count_only=True)

    def _parse_count(self, body: dict[str, Any]) -> CompletionRequest:
        wanted = anthropic.parse_count_tokens_request(body, self.options.limits)
        return protocol.parse_request(anthropic.openai_body(wanted), self.options.limits, chat=True)

    async def _count_reply(self, parsed: CompletionRequest, job: Job, first: Any, request: Request,
                           close: Callable[[], None]) -> Response:
        del parsed, job, request
        close()
        if isinstance(first, TokensCounted):
            return JSONResponse(anthropic.count_tokens_body(first.prompt_tokens))
        return anthropic_error_response(ApiError(500, "The engine ended the request without a count.",
                                                 kind="server_error"))

    def _parse_messages(self, body: dict[str, Any]) -> CompletionRequest:
        wanted = anthropic.parse_messages_request(body, self.options.limits)
        return protocol.parse_request(anthropic.openai_body(wanted), self.options.limits, chat=True)

    async def _messages_reply(self, parsed: CompletionRequest, job: Job, first: Any, request: Request,
                              close: Callable[[], None]) -> Response:
        if parsed.stream:
            return _Streaming(self._messages_stream(parsed, job, first, request), close,
                              self.options.send_timeout_seconds)
        answer = Answer()
        try:
            async for event in self._events(job, first, request):
                if isinstance(event, Token):
                    answer.text.append(event.text)
                elif isinstance(event, Finished):
                    shaper = ToolAnswer(parsed.tools)
                    shaper.start(answer.tool_format)
                    content, calls = shaper.whole("".join(answer.text))
                    return JSONResponse(anthropic.message_body(
                        anthropic.new_message_id(), self.runner.model_id, content,
                        [(call.id, call.name, call.arguments) for call in calls],
                        anthropic.stop_reason_for(event.reason, event.stop_sequence, bool(calls)),
                        event.stop_sequence, event.stats.prompt_tokens, event.stats.completion_tokens,
                        extra=self._figures(answer, event)))
                elif isinstance(event, EngineError | EngineCrashed):
                    return anthropic_error_response(engine_error(event))
                else:
                    self._count(answer, event)
            return anthropic_error_response(ApiError(500, "The engine ended the request without an answer.",
                                                     kind="server_error"))
        finally:
            close()

    async def _messages_stream(self, parsed: CompletionRequest, job: Job, first: Any,
                               request: Request) -> AsyncIterator[bytes]:
        stream = anthropic.MessageStream()
        answer = Answer()
        shaper = ToolAnswer(parsed.tools)
        started = False
        try:
            async for event in self._events(job, first, request):
                if isinstance(event, PromptProcessed):
                    self._count(answer, event)
                    shaper.start(event.tool_format)
                    yield stream.start(anthropic.new_message_id(), self.runner.model_id, event.prompt_tokens)
                    started = True
                elif isinstance(event, Token):
                    answer.text.append(event.text)
                    text, _fragments = shaper.feed(event.text)  # a forced call goes out whole, at the end
                    if text:
                        yield stream.text(text)
                elif isinstance(event, Finished):
                    tail, calls = shaper.finish()
                    if tail:
                        yield stream.text(tail)
                    for call in calls:
                        yield stream.tool_call(call.id, call.name, call.arguments)
                    yield stream.finish(anthropic.stop_reason_for(event.reason, event.stop_sequence, bool(calls)),
                                        event.stop_sequence, event.stats.completion_tokens,
                                        extra=self._figures(answer, event))
                    break
                elif isinstance(event, EngineError | EngineCrashed):
                    if not started:
                        yield stream.start(anthropic.new_message_id(), self.runner.model_id, 0)
                    yield stream.error(engine_error(event))
                    break
                else:
                    self._count(answer, event)
        except ClientGone:
            return

    def _figures(self, answer: Answer, event: Finished) -> dict[str, Any]:
        """SpecDeck's own figures beside an answer: speculation per request and llama-server's timings."""
        return {"metrics": {"speculative_decoding": protocol.speculative_decoding(answer)},
                "timings": protocol.timings(event.stats.prompt_tokens, answer.prompt_seconds, event.stats, answer)}

    async def _openai_reply(self, parsed: CompletionRequest, job: Job, first: Any, request: Request,
                            close: Callable[[], None]) -> Response:
        if parsed.stream:
            return _Streaming(self._stream(parsed, job, first, request), close, self.options.send_timeout_seconds)
        response = await self._collect(parsed, job, first, request)
        close()
        return response

    async def _next(self, job: Job, request: Request) -> Any:
        while True:
            try:
                return await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    raise ClientGone() from None

    async def _events(self, job: Job, first: Any, request: Request) -> AsyncIterator[Any]:
        event = first
        while not isinstance(event, JobEnded):
            yield event
            event = await self._next(job, request)

    async def _collect(self, parsed: CompletionRequest, job: Job, first: Any, request: Request) -> Response:
        answer = Answer()
        async for event in self._events(job, first, request):
            if isinstance(event, Token):
                answer.text.append(event.text)
                answer.logprobs += event.logprobs
            elif isinstance(event, Finished):
                return JSONResponse(self._final_body(parsed, answer, event))
            elif isinstance(event, EngineError | EngineCrashed):
                return error_response(engine_error(event))
            else:
                self._count(answer, event)
        return error_response(ApiError(500, "The engine ended the request without an answer.", kind="server_error"))

    @staticmethod
    def _count(answer: Answer, event: object) -> None:
        if isinstance(event, PromptProcessed):
            answer.prompt_tokens, answer.prompt_seconds = event.prompt_tokens, event.seconds
            answer.tool_format = event.tool_format
        elif isinstance(event, PassStats):
            answer.count_pass(event.drafted, sum(event.accepted), event.emitted)

    def _final_body(self, parsed: CompletionRequest, answer: Answer, event: Finished) -> dict[str, Any]:
        shaper = ToolAnswer(parsed.tools)
        shaper.start(answer.tool_format)
        content, calls = shaper.whole("".join(answer.text))
        return protocol.completion_body(parsed, _response_id(parsed), self.runner.model_id, content,
                                        event.reason, event.stats, answer.prompt_seconds, answer,
                                        self.runner.drafter_name, int(time.time()), calls)

    async def _stream(self, parsed: CompletionRequest, job: Job, first: Any, request: Request) -> AsyncIterator[bytes]:
        response_id = _response_id(parsed)
        model = self.runner.model_id
        created = int(time.time())
        answer = Answer()
        shaper = ToolAnswer(parsed.tools)
        streamed: dict[str, int] = {}  # tool call id -> its index in the stream

        def chunk(**fields: Any) -> dict[str, Any]:
            return protocol.chunk_body(parsed, response_id, model, created, **fields)

        def deltas(fragments: list[tuple[ToolCall, str]]) -> list[dict[str, Any]]:
            out = []
            for call, fragment in fragments:
                if call.id not in streamed:
                    streamed[call.id] = len(streamed)
                    out.append({"index": streamed[call.id], "id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": ""}})
                if fragment:
                    out.append({"index": streamed[call.id], "function": {"arguments": fragment}})
            return out

        if parsed.chat:
            yield protocol.sse(chunk(role=True))
        try:
            async for event in self._events(job, first, request):
                if isinstance(event, PromptProcessed):
                    self._count(answer, event)
                    shaper.start(event.tool_format)
                elif isinstance(event, Token):
                    answer.text.append(event.text)
                    answer.logprobs += event.logprobs
                    text, fragments = shaper.feed(event.text)
                    calls = deltas(fragments)
                    if text or calls or event.logprobs:
                        body = chunk(text=text, tool_calls=calls, logprobs=event.logprobs)
                        if parsed.timings_per_token:
                            body["timings"] = protocol.timings(answer.prompt_tokens, answer.prompt_seconds,
                                                               None, answer)
                        yield protocol.sse(body)
                elif isinstance(event, Finished):
                    tail, found = shaper.finish()
                    fragments = [(call, call.arguments) for call in found if call.id not in streamed]
                    if tail or fragments:
                        yield protocol.sse(chunk(text=tail, tool_calls=deltas(fragments)))
                    yield protocol.sse(self._last_chunk(parsed, response_id, created, answer, event, bool(found)))
                    if parsed.include_usage:
                        usage_chunk = chunk()
                        usage_chunk["choices"] = []
                        usage_chunk["usage"] = protocol.usage(event.stats.prompt_tokens, event.stats.completion_tokens)
                        yield protocol.sse(usage_chunk)
                    break
                elif isinstance(event, EngineError | EngineCrashed):
                    # Headers are out: the error goes in the stream, in the shape OpenAI's clients raise.
                    yield protocol.sse(engine_error(event).body())
                    break
                else:
                    self._count(answer, event)
            yield protocol.sse("[DONE]")
        except ClientGone:
            return

    def _last_chunk(self, parsed: CompletionRequest, response_id: str, created: int, answer: Answer,
                    event: Finished, called: bool = False) -> dict[str, Any]:
        reason = event.reason
        stats: MessageStats = event.stats
        chunk = protocol.chunk_body(parsed, response_id, self.runner.model_id, created,
                                    finish="tool_calls" if called else protocol.FINISH_REASONS.get(reason, "stop"))
        chunk["metrics"] = {"speculative_decoding": protocol.speculative_decoding(answer)}
        chunk["timings"] = protocol.timings(stats.prompt_tokens, answer.prompt_seconds, stats, answer)
        chunk["stats"] = protocol.lm_studio_stats(stats, reason, self.runner.drafter_name)
        return chunk


def _response_id(parsed: CompletionRequest) -> str:
    return protocol.new_id(parsed.chat)


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone. Called after the body is read, so nothing else arrives meanwhile."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _uvicorn_server(config: Any, loop_errors: LoopErrors) -> Any:
    import uvicorn

    class Uvicorn(uvicorn.Server):
        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            asyncio.get_running_loop().set_exception_handler(loop_errors)
            await super().serve(sockets)

    return Uvicorn(config)


class Server:
    """A runner and its HTTP app, served by uvicorn on a thread or in the foreground."""

    def __init__(self, runner: EngineRunner, metrics: ServeMetrics, options: ServeOptions) -> None:
        import uvicorn

        self.options = options.check()
        self.runner = runner
        self.web = ServeApp(runner, metrics, options)
        config = uvicorn.Config(self.web.app, host=options.host, port=options.port, log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=5,
                                http=guarded_protocol(options.max_connections, options.head_timeout_seconds,
                                                     options.body_timeout_seconds),
                                # The guard caps connections (each runs one request at a time); uvicorn's own
                                # limit would add a log line per refused request, thousands in a burst.
                                limit_concurrency=None)
        self.uvicorn = _uvicorn_server(config, LoopErrors(runner.log))
        self._thread: Any = None
        self._socket: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Take the address now, before the model loads: a port in use is an OSError at once, not after a load."""
        if self._socket is not None:
            return
        host = self.options.host
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind((host, self.options.port))
        except OSError:
            sock.close()
            raise
        self._socket = sock

    @property
    def port(self) -> int:
        """The bound port (useful with port 0), once bound."""
        if self._socket is not None and self._socket.fileno() >= 0:
            return int(self._socket.getsockname()[1])
        servers = getattr(self.uvicorn, "servers", None) or []
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.options.port

    @property
    def base_url(self) -> str:
        host = self.options.host if ":" not in self.options.host else f"[{self.options.host}]"
        return f"http://{host}:{self.port}"

    def serve_forever(self) -> None:
        self.bind()
        assert self._socket is not None
        self.runner.start()
        try:
            self.uvicorn.run(sockets=[self._socket])
        finally:
            self.runner.stop()

    def start_in_thread(self, timeout: float = 30.0) -> None:
        """Serve from a thread with its own event loop (``self.loop``), for the window and for tests."""
        import threading

        self.bind()
        sockets = [self._socket] if self._socket is not None else None
        self.runner.start()
        loop = self.loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.uvicorn.serve(sockets))
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name="specdeck-serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started:
            if not self._thread.is_alive():
                self.runner.stop()
                raise OSError(f"The server could not listen on {self.options.host}:{self.options.port} "
                              "(is the port in use?).")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start listening in time")
            time.sleep(0.05)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self._socket is not None:
            self._socket.close()  # uvicorn closes it when it served; not when it never started
        with contextlib.suppress(Exception):
            self.runner.stop()
