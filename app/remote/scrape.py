"""A remote server's live figures, from its ``/metrics`` (and llama-server's ``/slots``): one reader per engine
family (llama-server, vLLM, SGLang, SpecDeck), the same canonical figures out of each.

Rates come from the *deltas* of the server's counters between two scrapes, never from its averaged gauges
(each ``/metrics`` scrape resets llama-server's). A figure a server does not expose is ``None``, shown as
"not reported by this server", never as zero. Each figure says where it came from (``RemoteRates.sources``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.errors import AppError

NOT_REPORTED = "not reported by this server"
ENGINE_NAMES = {"llamacpp": "llama-server", "vllm": "vLLM", "sglang": "SGLang", "specdeck": "SpecDeck"}


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
