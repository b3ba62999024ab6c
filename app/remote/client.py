"""Remote engines (llama-server, vLLM, SGLang, another `specdeck serve`): discovery and chat.

Discovery reads ``/v1/models``, ``/props``, ``/metrics`` and ``/slots`` (whatever answers). Chat goes through
``/v1/chat/completions`` (streamed, read with httpx-sse) and yields the app's own ``Token`` and ``Finished``
events. The server's figures are read by ``app.remote.scrape``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError

from app.events import Finished, MessageStats, PromptProcessed, Token
from app.params import SamplingSettings
from app.remote.scrape import ENGINE_NAMES, NOT_REPORTED, RemoteError, Scrape, kv_usage_from_slots, read_scrape

MAX_METRICS_BYTES = 4 << 20
MAX_JSON_BYTES = 1 << 20

AnswerEvents = Generator[Token | PromptProcessed | Finished, None, None]


@dataclass(frozen=True)
class RemoteInfo:
    base_url: str
    engine: str  # "llama-server", "vLLM", "SGLang", "SpecDeck", or "an OpenAI-compatible server"
    models: tuple[str, ...]
    n_ctx: int | None
    has_metrics: bool
    has_slots: bool
    speculation: str  # what the server says about its own speculation, or NOT_REPORTED
    notes: tuple[str, ...] = ()
    speculating: bool | None = None  # None: the server does not say (llama-server's /slots and SpecDeck's /props do)


def _guess_engine(prefix: str, models: list[dict[str, Any]], props: dict[str, Any] | None) -> str:
    if prefix:
        return ENGINE_NAMES[prefix]
    if props is not None and "specdeck" in props:
        return "SpecDeck"
    owners = {str(m.get("owned_by", "")).lower() for m in models}
    if "llamacpp" in owners or (props is not None and "build_info" in props):
        return "llama-server"
    if "vllm" in owners:
        return "vLLM"
    if "sglang" in owners:
        return "SGLang"
    return "an OpenAI-compatible server"


@dataclass(frozen=True)
class RemoteModel:
    """One model a connected server lists: what the picker offers beside the local ones."""

    model: str
    base_url: str
    engine: str

    @property
    def where(self) -> str:
        """host:port of the server."""
        return self.base_url.split("://", 1)[-1].split("/", 1)[0]

    @property
    def name(self) -> str:
        """The model's id, or only its file name where the id is a .gguf path (llama-server's without --alias)."""
        return self.model.replace("\\", "/").rsplit("/", 1)[-1] if self.model.lower().endswith(".gguf") else self.model

    @property
    def label(self) -> str:
        return f"{self.name} — remote, {self.where}"


def remote_models(info: RemoteInfo) -> tuple[RemoteModel, ...]:
    return tuple(RemoteModel(model, info.base_url, info.engine) for model in info.models)


class RemoteEngine:
    """One server, from its base URL (with or without the trailing /v1) and an optional API key."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None, headers: Mapping[str, str] | None = None) -> None:
        url = base_url.strip().rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        if not url.startswith(("http://", "https://")):
            raise RemoteError(f"{base_url!r} is not an http:// or https:// address.")
        self.base_url = url
        sent = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url, headers={**(headers or {}), **sent}, timeout=timeout,
                                  transport=transport, follow_redirects=False)
        self.info: RemoteInfo | None = None
        self._last: Scrape | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -----------------------------------------------------------------------------------

    def _get(self, path: str, limit: int = MAX_JSON_BYTES) -> httpx.Response:
        try:
            response = self._http.get(path)
        except httpx.TimeoutException:
            raise RemoteError(f"{self.base_url}{path} did not answer in time.") from None
        except httpx.HTTPError as exc:
            raise RemoteError(f"Could not reach {self.base_url}: {_reason(exc)}.") from None
        if len(response.content) > limit:
            raise RemoteError(f"{self.base_url}{path} answered {len(response.content)} bytes, more than "
                              f"the {limit} read from it.")
        return response

    def _get_json(self, path: str, *, optional: bool = False) -> Any:
        response = self._get(path)
        if optional and response.status_code in (404, 405, 501):
            return None
        if response.status_code in (401, 403):
            raise RemoteError(f"{self.base_url} refused the API key ({response.status_code}): "
                              f"{_error_message(response)}")
        if response.status_code != 200:
            if optional:
                return None
            raise RemoteError(f"{self.base_url}{path} answered {response.status_code}: {_error_message(response)}")
        try:
            return response.json()
        except (ValueError, UnicodeDecodeError):
            if optional:
                return None
            raise RemoteError(f"{self.base_url}{path} did not answer JSON; is this an OpenAI-compatible "
                              "server?") from None

    # --- discovery and figures ----------------------------------------------------------------------

    def discover(self) -> RemoteInfo:
        listing = self._get_json("/v1/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise RemoteError(f"{self.base_url}/v1/models did not list models; is this an OpenAI-compatible "
                              "server?")
        models = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        props = self._get_json("/props", optional=True)
        props = props if isinstance(props, dict) else None
        notes: list[str] = []
        prefix = ""
        has_metrics = False
        try:
            scrape = self.scrape()
            prefix, has_metrics = scrape.prefix, True
        except RemoteError as exc:
            notes.append(f"No figures from /metrics: {exc}")
        slots = self._get_json("/slots", optional=True)
        n_ctx = None
        if props is not None:
            settings = props.get("default_generation_settings")
            value = settings.get("n_ctx") if isinstance(settings, dict) else None
            n_ctx = int(value) if isinstance(value, int | float) and value > 0 else None
        speculation, speculating = NOT_REPORTED, None
        slot_list = slots if isinstance(slots, list) else []
        slot_flags = [s["speculative"] for s in slot_list
                      if isinstance(s, dict) and isinstance(s.get("speculative"), bool)]
        if props is not None and isinstance(props.get("specdeck"), dict):
            meta = props["specdeck"]
            parts = [f"drafter {meta['drafter']}" if meta.get("drafter") else "",
                     f"n-gram {meta['ngram']}" if meta.get("ngram") else ""]
            speculation = ", ".join(p for p in parts if p) or "off"
            speculating = speculation != "off"
        elif slot_flags:  # llama-server: each slot says whether it can speculate
            speculating = any(slot_flags)
            speculation = "on (its /slots say so)" if speculating else "off (its /slots say so)"
        elif has_metrics and self._last is not None and "draft_tokens" in self._last.counters:
            speculation = "configured on the server (it reports spec-decode counters)"
        self.info = RemoteInfo(self.base_url, _guess_engine(prefix, models, props),
                               tuple(m["id"] for m in models), n_ctx, has_metrics, isinstance(slots, list),
                               speculation, tuple(notes), speculating)
        return self.info

    def scrape(self) -> Scrape:
        response = self._get("/metrics", MAX_METRICS_BYTES)
        if response.status_code != 200:
            raise RemoteError(f"/metrics answered {response.status_code} (llama-server needs --metrics).")
        try:
            text = response.content.decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteError("/metrics is not UTF-8 text.") from None
        kv = None
        if "llamacpp:" in text:
            kv = kv_usage_from_slots(self._get_json("/slots", optional=True))
        scrape = read_scrape(text, time.monotonic(), kv)
        if not scrape.prefix:
            raise RemoteError("/metrics has none of the metric names of llama-server, vLLM, SGLang or SpecDeck.")
        self._last = scrape
        return scrape

    def chat(self, messages: list[dict[str, str]], *, model: str | None = None, max_tokens: int = 512,
             temperature: float = 0.0, request_id: int = 0, read_timeout: float = 300.0,
             options: Mapping[str, Any] | None = None,
             cancelled: Callable[[], bool] | None = None) -> AnswerEvents:
        """Stream one answer as ``Token`` events (and ``PromptProcessed`` once the server's per-chunk
        ``timings`` give its prompt figures), then ``Finished`` with what the server reported.
        ``options``: more request fields (sampling, see ``sampling_options``). ``cancelled`` is asked at each
        chunk; when it says yes the stream is closed (the server sees the client go) and the answer ends
        "cancelled" with what arrived."""
        body: dict[str, Any] = {"messages": messages, **self._common(model, max_tokens, temperature, options)}
        return self._answer("/v1/chat/completions", body, request_id, read_timeout, cancelled)

    def complete(self, prompt: str, *, model: str | None = None, max_tokens: int = 512, temperature: float = 0.0,
                 request_id: int = 0, read_timeout: float = 300.0,
                 options: Mapping[str, Any] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> AnswerEvents:
        """Completion mode: ``prompt`` goes to ``/v1/completions`` as it is (no chat template); else as ``chat``."""
        body: dict[str, Any] = {"prompt": prompt, **self._common(model, max_tokens, temperature, options)}
        return self._answer("/v1/completions", body, request_id, read_timeout, cancelled)

    @staticmethod
    def _common(model: str | None, max_tokens: int, temperature: float,
                options: Mapping[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {**(options or {}), "stream": True, "max_tokens": max_tokens,
                                "temperature": temperature, "stream_options": {"include_usage": True},
                                "timings_per_token": True}
        if model:
            body["model"] = model
        return body

    def _answer(self, path: str, body: dict[str, Any], request_id: int, read_timeout: float,
                cancelled: Callable[[], bool] | None) -> AnswerEvents:
        pieces: list[str] = []
        finish = "error"
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        t0 = time.perf_counter()
        ttft = 0.0
        prompt_said = False
        try:
            with self._http.stream("POST", path, json=body,
                                   timeout=httpx.Timeout(10.0, read=read_timeout)) as response:
                if response.status_code != 200:
                    response.read()
                    raise RemoteError(f"The server refused the request ({response.status_code}): "
                                      f"{_error_message(response)}")
                done = False
                for event in _server_sent_events(response):
                    if cancelled is not None and cancelled():
                        done, finish = True, "cancelled"
                        break
                    payload = event.data.strip()
                    if not payload:
                        continue
                    if payload == "[DONE]":
                        done = True
                        break
                    chunk = _json_or_error(payload)
                    if "error" in chunk:
                        err = chunk["error"]
                        raise RemoteError(f"The server stopped the answer: "
                                          f"{err.get('message') if isinstance(err, dict) else err}")
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    if isinstance(chunk.get("timings"), dict):
                        timings = chunk["timings"]
                        prompt_n, prompt_ms = timings.get("prompt_n"), timings.get("prompt_ms")
                        if not prompt_said and isinstance(prompt_n, int) and isinstance(prompt_ms, int | float):
                            prompt_said = True  # the server's own prompt figures (timings_per_token)
                            cached = timings.get("cache_n")  # llama-server: reused from its prompt cache
                            prompt_n += cached if isinstance(cached, int) else 0
                            yield PromptProcessed(request_id, prompt_n, float(prompt_ms) / 1000, None)
                    for choice in chunk.get("choices") or []:
                        if not isinstance(choice, dict):
                            continue
                        delta = choice.get("delta")
                        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                        if isinstance(text, str) and text:
                            if not pieces:
                                ttft = time.perf_counter() - t0
                            pieces.append(text)
                            yield Token(request_id, text, (), ())
                        if choice.get("finish_reason"):
                            finish = str(choice["finish_reason"])
                if not done:
                    raise RemoteError(f"The server closed the stream before it finished (after {len(pieces)} "
                                      "pieces of text); what arrived is kept.")
        except httpx.TimeoutException:
            raise RemoteError(f"The server stopped sending for {read_timeout:.0f} s in the middle of the answer; "
                              "what arrived is kept.") from None
        except httpx.HTTPError as exc:
            raise RemoteError(f"The connection to {self.base_url} broke in the middle of the answer "
                              f"({_reason(exc)}); what arrived is kept.") from None
        yield Finished(request_id, {"stop": "eog", "length": "max_tokens"}.get(finish, finish),
                       _stats(usage, timings, ttft), "".join(pieces))


def _server_sent_events(response: httpx.Response) -> Iterator[ServerSentEvent]:
    """The response's events, parsed by httpx-sse; a stream of another kind is one sentence."""
    try:
        yield from EventSource(response).iter_sse()
    except SSEError as exc:
        raise RemoteError(f"The server's stream is not server-sent events ({exc}).") from None


def sampling_options(sampling: SamplingSettings) -> dict[str, Any]:
    """The window's sampling as request fields beyond temperature and max_tokens: OpenAI's top_p and seed,
    and the top_k, min_p and repeat_penalty that llama-server, vLLM, SGLang and SpecDeck also read."""
    options: dict[str, Any] = {"top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p,
                               "repeat_penalty": sampling.repeat_penalty}
    if sampling.seed >= 0:
        options["seed"] = sampling.seed
    return options


def _stats(usage: Mapping[str, Any], timings: Mapping[str, Any], ttft: float) -> MessageStats:
    def num(mapping: Mapping[str, Any], key: str) -> float:
        value = mapping.get(key)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0

    drafted, accepted = int(num(timings, "draft_n")), int(num(timings, "draft_n_accepted"))
    return MessageStats(
        prompt_tokens=int(num(usage, "prompt_tokens")), completion_tokens=int(num(usage, "completion_tokens")),
        ttft_seconds=ttft, prefill_tps=num(timings, "prompt_per_second"),
        decode_tps=num(timings, "predicted_per_second"), decode_seconds=num(timings, "predicted_ms") / 1000,
        passes=0, drafted=drafted, accepted=accepted, acceptance=accepted / drafted if drafted else 0.0,
        tokens_per_pass=0.0, per_position_acceptance=(), k_history=(), speedup_estimate=1.0,
    )


def _json_or_error(payload: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except ValueError:
        raise RemoteError(f"The server sent a stream chunk that is not JSON: {payload[:80]!r}") from None
    if not isinstance(value, dict):
        raise RemoteError(f"The server sent a stream chunk that is not a JSON object: {payload[:80]!r}")
    return value


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        text = response.text[:200].strip()
        return text or "(empty answer)"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return json.dumps(body)[:200]


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text or isinstance(exc, httpx.ConnectError):
        return f"connection refused or host unreachable ({text})"
    return text
