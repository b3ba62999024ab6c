"""`/metrics` of `specdeck serve`: Prometheus counters fed by engine events, in a registry of its own.

Names mirror llama-server's (``llamacpp:*``) and vLLM's (``vllm:spec_decode_*``) with the prefix
``specdeck:``, so a Grafana board built for either reads SpecDeck too. Counters only ever grow; rates are
taken by the reader from their deltas. Every counter moves per verify pass, so a scrape during an answer sees
it (the window's Remote dock reads another client's answer live). Tokens and seconds predicted cover the
answer's decode window (``RunCounts``: from the end of its first pass to its last token), counted pass by pass
and made whole when the answer ends, so their rate over whole answers is the decode rate the window and
``specdeck bench`` report.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest

from app.events import Finished, Loaded, PassStats, PromptProcessed

PREFIX = "specdeck:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class _LiveDecode:
    """The decode window counted so far of the answer being written (one at a time)."""

    request_id: int
    end: float  # when the last emitting pass emitted its tokens (PassStats.t_emitted)
    tokens: int = 0
    seconds: float = 0.0


class ServeMetrics:
    """Thread-safe: the engine thread observes events, the HTTP side renders."""

    def __init__(self) -> None:
        # llama-server and vLLM expose no *_created series; without them the text reads like theirs.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        p = PREFIX
        # prometheus_client appends _total to counters; the names below are exposed with it.
        self.drafts = Counter(p + "spec_decode_num_drafts", "Verify passes that checked at least one draft token",
                              registry=r)
        self.draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens", "Draft tokens accepted by the target",
                                       registry=r)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted per draft position (0 = first)", ["position"],
                                        registry=r)
        self.tokens_predicted = Counter(p + "tokens_predicted",
                                        "Tokens generated in each answer's decode window (after its first pass)",
                                        registry=r)
        self.tokens_predicted_seconds = Counter(p + "tokens_predicted_seconds",
                                                "Seconds spent generating the tokens in tokens_predicted_total",
                                                registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed", registry=r)
        self.prompt_seconds = Counter(p + "prompt_seconds", "Seconds spent processing prompts", registry=r)
        self.n_decode = Counter(p + "n_decode", "Target passes (llama_decode calls of the target)", registry=r)
        self.requests = Counter(p + "requests", "Answered requests by how they ended", ["reason"], registry=r)
        self.requests_processing = Gauge(p + "requests_processing", "Requests being answered now", registry=r)
        self.requests_deferred = Gauge(p + "requests_deferred", "Requests waiting for the engine", registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "Fraction of the context (KV cache) in use, 0 to 1",
                              registry=r)
        self.kv_bytes = Gauge(p + "kv_cache_used_bytes", "Bytes of KV cache in use", registry=r)
        self.n_ctx = Gauge(p + "n_ctx", "Context size of the loaded model, in tokens", registry=r)
        self.plain_rate = Gauge(p + "plain_tokens_per_second",
                                "Plain decoding's rate measured on the loaded model at load (one-token passes per "
                                "second); the ceiling is the roofline's, not this", registry=r)
        self._live: _LiveDecode | None = None  # engine thread only

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def on_loaded(self, loaded: Loaded) -> None:
        self.n_ctx.set(loaded.n_ctx)
        self.plain_rate.set(loaded.plain_tps)

    def on_prompt(self, event: PromptProcessed) -> None:
        self.prompt_tokens.inc(event.prompt_tokens)
        self.prompt_seconds.inc(max(event.seconds, 0.0))

    def on_pass(self, p: PassStats, n_ctx: int) -> None:
        self.n_decode.inc()
        if p.drafted > 0:
            self.drafts.inc()
            self.draft_tokens.inc(p.drafted)
            accepted = sum(p.accepted)
            self.accepted_tokens.inc(accepted)
            for position, ok in enumerate(p.accepted):
                if ok:
                    self.accepted_per_pos.labels(position=str(position)).inc()
        if n_ctx > 0:
            self.kv_usage.set(min(p.context_tokens / n_ctx, 1.0))
        self.kv_bytes.set(p.kv_bytes_used)
        self._count_decode(p)

    def _count_decode(self, p: PassStats) -> None:
        """A pass's share of the decode window: after the answer's first emitting pass, its tokens and the time
        since the end of the pass before."""
        if p.emitted <= 0:
            return
        live = self._live
        if live is None or live.request_id != p.request_id:
            self._live = _LiveDecode(p.request_id, p.t_emitted)  # an older answer is over
            return
        seconds = max(p.t_emitted - live.end, 0.0)
        self.tokens_predicted.inc(p.emitted)
        self.tokens_predicted_seconds.inc(seconds)
        live.tokens += p.emitted
        live.seconds += seconds
        live.end = p.t_emitted

    def on_finished(self, event: Finished) -> None:
        counts = event.stats.counts
        live = self._live if self._live is not None and self._live.request_id == event.request_id else None
        self._live = None
        counted_tokens, counted_seconds = (live.tokens, live.seconds) if live is not None else (0, 0.0)
        # What the passes left uncounted; never negative, counters only grow.
        self.tokens_predicted.inc(max(counts.decode_tokens - counted_tokens, 0))
        self.tokens_predicted_seconds.inc(max(counts.decode_seconds - counted_seconds, 0.0))
        self.requests.labels(reason=event.reason).inc()

    def on_ended(self, reason: str) -> None:
        """A request that ended without a Finished event (an engine error or crash)."""
        self._live = None
        self.requests.labels(reason=reason).inc()
