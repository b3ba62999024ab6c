"""Remote engines (llama-server, vLLM, SGLang, another `specdeck serve`): discovery, chat and live rates.

Discovery reads ``/v1/models``, ``/props``, ``/metrics`` and ``/slots`` (whatever answers). Chat goes through
``/v1/chat/completions`` (streamed) and yields the app's own ``Token`` and ``Finished`` events. Rates come
from the *deltas* of the server's counters between two scrapes, never from its averaged gauges (each
``/metrics`` scrape resets llama-server's). A figure a server does not expose is ``None``, shown as "not
reported by this server", never as zero. Each figure says where it came from (``RemoteRates.sources``).
Over 450 lines: one reader per engine family (llama-server, vLLM, SGLang, SpecDeck) beside the shared client.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError
from prometheus_client.parser import text_string_to_metric_families

from app.params import SamplingSettings
from app.errors import AppError
from app.events import Finished, MessageStats, PromptProcessed, Token

MAX_METRICS_BYTES = 4 << 20
MAX_JSON_BYTES = 1 << 20
NOT_REPORTED = "not reported by this server"

ENGINE_NAMES = {"llamacpp": "llama-server", "vllm": "vLLM", "sglang": "SGLang", "specdeck": "SpecDeck"}


AnswerEvents = Generator[Token | PromptProcessed | Finished, None, None]


class RemoteError(AppError):
    """A remote server could not be reached, refused, or answered something that is not its API."""


# --- metric names per engine ----------------------------------------------------------------------
# Canonical figure -> the sample names that carry it, per metric prefix. Sources of the names:
#   llama-server: tools/server/server-task.cpp (to_metrics) in the llama.cpp that llama-cpp-python 0.3.36
#     vendors; KV use is not a metric there, it is estimated from /slots.
#   vLLM: docs "Production Metrics" (vllm/v1/metrics/loggers.py); gpu_cache_usage_perc is the pre-V1 name.
#   SGLang: docs "Production Metrics" (sglang/srt/metrics/collector.py): gauges, no spec-decode counters.
#   SpecDeck: app/serve/metrics.py.

COUNTERS: dict[str, dict[str, tuple[str, ...]]] = {
    "llamacpp": {
        "tokens": ("llamacpp:tokens_predicted_total",),
        "token_seconds": ("llamacpp:tokens_predicted_seconds_total",),
        "passes": ("llamacpp:n_decode_total",),
        "drafts": ("llamacpp:spec_decode_num_drafts_total",),
        "draft_tokens": ("llamacpp:spec_decode_num_draft_tokens_total",),
        "accepted": ("llamacpp:spec_decode_num_accepted_tokens_total",),
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),
    },
    "vllm": {
        "tokens": ("vllm:generation_tokens_total",),
        "drafts": ("vllm:spec_decode_num_drafts_total",),
        "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
        "accepted": ("vllm:spec_decode_num_accepted_tokens_total",),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "read_bytes": ("vllm:estimated_read_bytes_per_gpu_total",),
    },
    "sglang": {
        "tokens": ("sglang:generation_tokens_total",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
    },
    "specdeck": {
        "tokens": ("specdeck:tokens_predicted_total",),
        "token_seconds": ("specdeck:tokens_predicted_seconds_total",),
        "passes": ("specdeck:n_decode_total",),
        "drafts": ("specdeck:spec_decode_num_drafts_total",),
        "draft_tokens": ("specdeck:spec_decode_num_draft_tokens_total",),
        "accepted": ("specdeck:spec_decode_num_accepted_tokens_total",),
        "prompt_tokens": ("specdeck:prompt_tokens_total",),
    },
}
PER_POSITION = {
    "llamacpp": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "specdeck": "specdeck:spec_decode_num_accepted_tokens_per_pos_total",
}
# Gauges read as they are: only where an engine has no counter for the figure.
GAUGES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
    "sglang": {
        "kv_usage": ("sglang:token_usage",),
        "throughput": ("sglang:gen_throughput",),
        "accept_rate": ("sglang:spec_accept_rate",),
        "accept_length": ("sglang:spec_accept_length",),
    },
    "specdeck": {"kv_usage": ("specdeck:kv_cache_usage_perc",), "plain_rate": ("specdeck:plain_tokens_per_second",)},
}


@dataclass(frozen=True)
class Scrape:
    """One reading of a server's figures: canonical counters and gauges (absent = not exposed)."""

    t: float  # monotonic seconds
    prefix: str  # "llamacpp", "vllm", "sglang", "specdeck", or "" when no known metric was found
    counters: Mapping[str, float]
    gauges: Mapping[str, float]
    accepted_per_position: Mapping[int, float] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # figure -> metric (or endpoint) it came from


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)], through prometheus_client's parser. Raises RemoteError on garbage."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise RemoteError(f"The server's /metrics is not in Prometheus text format ({exc}).") from None
    return out


def detect_prefix(samples: Mapping[str, Any]) -> str:
    counts: dict[str, int] = {}
    for name in samples:
        prefix = name.split(":", 1)[0] if ":" in name else ""
        if prefix in ENGINE_NAMES:
            counts[prefix] = counts.get(prefix, 0) + 1
    return max(counts, key=lambda p: counts[p]) if counts else ""


def read_scrape(text: str, t: float, kv_from_slots: float | None = None) -> Scrape:
    samples = parse_metrics(text)
    prefix = detect_prefix(samples)
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    sources: dict[str, str] = {}
    for figure, names in COUNTERS.get(prefix, {}).items():
        for name in names:
            if name in samples:
                counters[figure] = sum(v for _, v in samples[name] if math.isfinite(v))
                sources[figure] = name
                break
    for figure, names in GAUGES.get(prefix, {}).items():
        for name in names:
            values = [v for _, v in samples.get(name, []) if math.isfinite(v)]
            if values:
                gauges[figure] = max(values)
                sources[figure] = name
                break
    per_pos: dict[int, float] = {}
    pos_name = PER_POSITION.get(prefix)
    for labels, value in samples.get(pos_name or "", []):
        try:
            position = int(labels.get("position", ""))
        except ValueError:
            continue
        per_pos[position] = per_pos.get(position, 0.0) + value
    if per_pos and pos_name:
        sources["accepted_per_position"] = pos_name
    if kv_from_slots is not None and "kv_usage" not in gauges:
        gauges["kv_usage"] = kv_from_slots
        sources["kv_usage"] = "/slots: (n_prompt_tokens + next_token.n_decoded) / n_ctx"
    return Scrape(t, prefix, counters, gauges, per_pos, sources)


def kv_usage_from_slots(slots: Any) -> float | None:
    """llama-server has no KV metric: the busiest slot's (prompt + decoded) tokens over its n_ctx."""
    if not isinstance(slots, list):
        return None
    best: float | None = None
    for slot in slots:
        if not isinstance(slot, dict):
            continue
        n_ctx = slot.get("n_ctx")
        if not isinstance(n_ctx, int | float) or n_ctx <= 0:
            continue
        prompt = slot.get("n_prompt_tokens", 0)
        next_token = slot.get("next_token")
        decoded = next_token.get("n_decoded", 0) if isinstance(next_token, dict) else 0
        if isinstance(next_token, list) and next_token and isinstance(next_token[0], dict):
            decoded = next_token[0].get("n_decoded", 0)
        if not isinstance(prompt, int | float) or not isinstance(decoded, int | float):
            continue
        if not slot.get("is_processing", True):
            prompt = decoded = 0
        value = min(max((prompt + decoded) / n_ctx, 0.0), 1.0)
        best = value if best is None else max(best, value)
    return best


@dataclass(frozen=True)
class RemoteRates:
    """Figures over the interval between two scrapes; None = not reported (or nothing happened)."""

    seconds: float
    tokens_per_second: float | None
    acceptance: float | None  # accepted draft tokens / drafted
    mean_accepted_length: float | None  # tokens per verify pass that drafted: 1 + accepted / drafts
    per_position_acceptance: tuple[float, ...] | None
    kv_usage: float | None  # 0..1
    read_bytes_per_second: float | None  # vLLM's estimated bytes read per GPU
    plain_tokens_per_second: float | None  # measured at load, not a ceiling
    sources: Mapping[str, str]


def reported(scrape: Scrape) -> dict[str, bool]:
    """Which ``RemoteRates`` figures this server exposes at all. A figure that is exposed but None in an
    interval had nothing happen in it (idle); one that is not exposed is "not reported by this server"."""
    c, g = scrape.counters, scrape.gauges
    return {
        "tokens_per_second": "tokens" in c or "throughput" in g,
        "acceptance": "draft_tokens" in c or "accept_rate" in g,
        "mean_accepted_length": "drafts" in c or "accept_length" in g,
        "per_position_acceptance": scrape.prefix in PER_POSITION,
        "kv_usage": "kv_usage" in g,
        "read_bytes_per_second": "read_bytes" in c,
        "plain_tokens_per_second": "plain_rate" in g,
    }


def _delta(before: Scrape, after: Scrape, figure: str) -> float | None:
    if figure not in before.counters or figure not in after.counters:
        return None
    d = after.counters[figure] - before.counters[figure]
    return d if d >= 0 else None  # a counter that went back: the server restarted


def rates(before: Scrape, after: Scrape) -> RemoteRates:
    seconds = after.t - before.t
    sources: dict[str, str] = {}
    tokens = _delta(before, after, "tokens")
    token_seconds = _delta(before, after, "token_seconds")
    tps: float | None = None
    if tokens and token_seconds:
        tps = tokens / token_seconds
        sources["tokens_per_second"] = (f"Δ{after.sources['tokens']} / Δ{after.sources['token_seconds']}")
    elif tokens and "token_seconds" not in after.counters and seconds > 0:
        tps = tokens / seconds
        sources["tokens_per_second"] = f"Δ{after.sources['tokens']} / Δwall time"
    elif "throughput" in after.gauges and "tokens" not in after.counters:
        tps = after.gauges["throughput"]
        sources["tokens_per_second"] = f"{after.sources['throughput']} (gauge; no counter exposed)"
    drafted = _delta(before, after, "draft_tokens")
    accepted = _delta(before, after, "accepted")
    drafts = _delta(before, after, "drafts")
    acceptance: float | None = None
    if drafted and accepted is not None:
        acceptance = accepted / drafted
        sources["acceptance"] = f"Δ{after.sources['accepted']} / Δ{after.sources['draft_tokens']}"
    elif "accept_rate" in after.gauges:
        acceptance = after.gauges["accept_rate"]
        sources["acceptance"] = f"{after.sources['accept_rate']} (gauge; no counter exposed)"
    length: float | None = None
    if drafts and accepted is not None:
        length = 1.0 + accepted / drafts
        sources["mean_accepted_length"] = f"1 + Δ{after.sources['accepted']} / Δ{after.sources['drafts']}"
    elif "accept_length" in after.gauges:
        length = after.gauges["accept_length"]
        sources["mean_accepted_length"] = f"{after.sources['accept_length']} (gauge)"
    per_pos: tuple[float, ...] | None = None
    if drafts and after.accepted_per_position:
        n = max(after.accepted_per_position) + 1
        per_pos = tuple(
            max(after.accepted_per_position.get(i, 0.0) - before.accepted_per_position.get(i, 0.0), 0.0) / drafts
            for i in range(n)
        )
        sources["per_position_acceptance"] = f"Δ{after.sources['accepted_per_position']} / Δ{after.sources['drafts']}"
    read = _delta(before, after, "read_bytes")
    read_rate = read / seconds if read is not None and seconds > 0 else None
    if read_rate is not None:
        sources["read_bytes_per_second"] = f"Δ{after.sources['read_bytes']} / Δwall time"
    kv = after.gauges.get("kv_usage")
    if kv is not None:
        sources["kv_usage"] = after.sources["kv_usage"]
    plain = after.gauges.get("plain_rate")
    if plain is not None:
        sources["plain_tokens_per_second"] = after.sources["plain_rate"]
    return RemoteRates(seconds, tps, acceptance, length, per_pos, kv, read_rate, plain, sources)


# --- discovery and chat ---------------------------------------------------------------------------


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
                 transport: httpx.BaseTransport | None = None) -> None:
        url = base_url.strip().rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        if not url.startswith(("http://", "https://")):
            raise RemoteError(f"{base_url!r} is not an http:// or https:// address.")
        self.base_url = url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout, transport=transport,
                                  follow_redirects=False)
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
