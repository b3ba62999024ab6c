"""The OpenAI wire format: request bodies checked into engine settings, and response bodies built from events.

Everything here is pure (no sockets, no engine), so each refusal is testable on its own. Field names follow
OpenAI's; the extras are llama-server's ``timings`` object and LM Studio's ``stats`` names for drafted and
accepted tokens (``total_draft_tokens_count``, ``accepted_draft_tokens_count``, ``rejected_draft_tokens_count``).
Over 500 lines: every field OpenAI defines is checked or refused here, one sentence each.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from app.engine.schema_limits import check_schema
from app.errors import SettingsError
from app.events import MessageStats
from app.params import JSON_OBJECT, SamplingSettings

DEFAULT_BODY_LIMIT = 4 << 20  # bytes; a chat that fills a 128k context is about 0.5 MB of text
MAX_STOP_SEQUENCES = 4  # OpenAI's limit
MAX_STOP_LENGTH = 256
ROLE_ALIASES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Each message is a history row and a template turn; a 4 MB body of empty messages is 100k of them, which
# held the server 80 s. A 128k context holds at most a few thousand real turns.
MAX_MESSAGES = 2048
# Below this a temperature picks the top token anyway (any other is e^-1000 times less likely at a logit gap of
# 0.01), and near the smallest floats 1/temperature overflows: it is greedy.
GREEDY_BELOW = 1e-5
LARGEST_NUMBER = 2**53  # past this a JSON number is not a count anyone means (and floats lose whole numbers)
# OpenAI parameters this server cannot honour: a client that sends one with an effect gets a 400 naming it
# rather than an answer that silently ignored it. The neutral value of each (false, 0, empty) is accepted.
UNSUPPORTED = {
    "tools": "tool calls", "tool_choice": "tool calls", "functions": "function calls",
    "function_call": "function calls", "parallel_tool_calls": "tool calls", "logprobs": "log probabilities",
    "top_logprobs": "log probabilities", "presence_penalty": "presence penalties (use repeat_penalty)",
    "frequency_penalty": "frequency penalties (use repeat_penalty)", "logit_bias": "logit biases",
    "audio": "audio", "modalities": "other modalities",
    "prediction": "predicted outputs", "web_search_options": "web search",
    "echo": "echoing the prompt", "suffix": "suffixes",
    # llama-server's own: a raw grammar has no path to the engine (a JSON schema does: json_schema below)
    "grammar": "a GBNF grammar (send a JSON schema in 'json_schema' or 'response_format')",
    "n_probs": "token probabilities", "mirostat": "Mirostat sampling",
}
NEUTRAL_VALUES: tuple[Any, ...] = (None, False, 0, 0.0, "", [], {}, "none", "auto")

# --- response_format -------------------------------------------------------------------------------------
# The JSON Schema keywords llama.cpp's schema-to-grammar converter turns into grammar rules. Anything else would
# be ignored by it, so the output could break the schema: such a schema is refused by name instead.
SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "format", "minLength",
    "maxLength", "title", "description", "default", "examples", "$schema", "$id", "$comment",
})
SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
SCHEMA_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
SCHEMA_MAX_DEPTH = 64


def _unsupported_in_schema(schema: Any, where: str, depth: int = 0) -> str | None:
    """Where the schema leaves the supported subset, in words; None when it stays inside it."""
    if depth > SCHEMA_MAX_DEPTH:
        return f"{where} is nested more than {SCHEMA_MAX_DEPTH} deep"
    if isinstance(schema, bool):
        return None if schema else f"{where} is false (nothing matches it)"
    if not isinstance(schema, dict):
        return f"{where} is not a schema object"
    for key, value in schema.items():
        here = f"{where}.{key}"
        if key not in SCHEMA_KEYWORDS:
            return f"the keyword '{key}' (at {where})"
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            odd = [k for k in kinds if k not in SCHEMA_TYPES]
            if odd:
                return f"the type {odd[0]!r} (at {here})"
        elif key == "format" and value not in SCHEMA_FORMATS:
            return f"the format {str(value)[:40]!r} (at {here}); supported: {', '.join(sorted(SCHEMA_FORMATS))}"
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            return f"the reference {str(value)[:80]!r} (at {here}); only references inside the schema are"
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                return f"{here} is not an object"
            for name, sub in value.items():
                found = _unsupported_in_schema(sub, f"{here}.{name}", depth + 1)
                if found:
                    return found
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") or (key == "items" and isinstance(value, list)):
            if not isinstance(value, list) or not value:
                return f"{here} is not a non-empty list"
            for i, sub in enumerate(value):
                found = _unsupported_in_schema(sub, f"{here}[{i}]", depth + 1)
                if found:
                    return found
        elif key in ("items", "additionalProperties") and not isinstance(value, bool):
            found = _unsupported_in_schema(value, here, depth + 1)
            if found:
                return found
    return None


def parse_response_format(value: Any) -> str:
    """``response_format`` as ``SamplingSettings.response_format``: "", "json_object" or the schema's JSON."""
    if value is None:
        return ""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ApiError(400, "'response_format' must be an object with a 'type'.", param="response_format")
    kind = value["type"]
    if kind == "text":
        return ""
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise ApiError(400, f"'response_format' type {kind[:40]!r} is not one of text, json_object and "
                       "json_schema.", param="response_format")
    spec = value.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise ApiError(400, "'response_format.json_schema.schema' must be a JSON Schema object.",
                       param="response_format")
    try:
        check_schema(schema)  # the grammar's bounds and the keywords' types (app.engine.schema_limits)
    except SettingsError as exc:
        raise ApiError(400, str(exc), param="response_format", code="invalid_schema") from None
    unsupported = _unsupported_in_schema(schema, "schema")
    if unsupported:
        raise ApiError(400, f"The JSON schema uses {unsupported}, which this server cannot enforce; it supports "
                       "the subset llama.cpp turns into a grammar.", param="response_format",
                       code="unsupported_schema")
    return json.dumps(schema, ensure_ascii=False)


class ApiError(Exception):
    """A refusal with its HTTP status, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    body_bytes: int = DEFAULT_BODY_LIMIT
    max_tokens: int = 4096  # the most a request may ask for; also the default when it asks for none


@dataclass(frozen=True)
class CompletionRequest:
    """One checked request. ``chat`` is False for /v1/completions: its prompt is the one message, fed raw."""

    messages: tuple[dict[str, str], ...]
    sampling: SamplingSettings
    chat: bool = True
    stream: bool = False
    include_usage: bool = False
    timings_per_token: bool = False
    stop: tuple[str, ...] = ()
    model: str = ""


def parse_json(raw: bytes, limits: Limits) -> dict[str, Any]:
    if len(raw) > limits.body_bytes:
        raise ApiError(413, f"The request body is {len(raw)} bytes; this server takes at most {limits.body_bytes}.",
                       code="body_too_large")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except ApiError:
        raise
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, json.JSONDecodeError):
            reason = exc.msg
        elif isinstance(exc, UnicodeDecodeError):
            reason = "the body is not UTF-8"
        elif isinstance(exc, RecursionError):
            reason = "it is nested too deeply"
        else:  # Python refuses integers of thousands of digits
            reason = str(exc).split(";")[0]
        raise ApiError(400, f"The request body is not valid JSON: {reason}.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return body


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON; Python's parser would accept them."""
    raise ApiError(400, f"{name} is not a number JSON allows; send a finite number.", code="invalid_json")


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(400, f"{where} has a {kind!r} part; this server takes text parts only.",
                               param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"{where} content must be a string or a list of text parts.", param="messages")


def parse_messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    if len(value) > MAX_MESSAGES:
        raise ApiError(400, f"The request has {len(value)} messages; this server takes at most {MAX_MESSAGES}.",
                       param="messages", code="too_many_messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object with 'role' and 'content'.", param="messages")
        role = ROLE_ALIASES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise ApiError(400, f"messages[{i}] has role {message.get('role')!r}; this server takes system, "
                           "developer, user and assistant.", param="messages")
        out.append({"role": role, "content": _text_content(message.get("content"), f"messages[{i}]")})
    return tuple(out)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return float(default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"'{name}' must be a number, not {json.dumps(value)[:40]}.", param=name)
    if isinstance(value, int) and abs(value) > LARGEST_NUMBER:
        raise ApiError(400, f"'{name}' is a {len(str(abs(value)))}-digit number; no setting takes one that large.",
                       param=name)
    if not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number.", param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int) -> int:
    value = _number(body, name, default)
    if not value.is_integer():
        raise ApiError(400, f"'{name}' must be a whole number, not {value:g}.", param=name)
    return int(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ApiError(400, "'stop' must be a string or a list of strings.", param="stop")
    if len(items) > MAX_STOP_SEQUENCES or any(len(s) > MAX_STOP_LENGTH for s in items):
        raise ApiError(400, f"'stop' takes at most {MAX_STOP_SEQUENCES} strings of at most {MAX_STOP_LENGTH} "
                       "characters.", param="stop")
    return tuple(s for s in items if s)


def refuse_unsupported(body: dict[str, Any]) -> None:
    for name, what in UNSUPPORTED.items():
        value = body.get(name)
        if any(value == neutral and type(value) is type(neutral) for neutral in NEUTRAL_VALUES) or value is None:
            continue
        raise ApiError(400, f"'{name}' asks for {what}, which this server does not support; send the request "
                       "without it.", param=name, code="unsupported_parameter")


def _structured_output(body: dict[str, Any]) -> str:
    """``response_format``, or llama-server's ``json_schema`` (a bare schema), as the sampling's response format."""
    schema = body.get("json_schema")
    if schema is None:
        return parse_response_format(body.get("response_format"))
    if parse_response_format(body.get("response_format")):
        raise ApiError(400, "Send either 'json_schema' or a JSON 'response_format', not both.", param="json_schema")
    if not isinstance(schema, dict):
        raise ApiError(400, "'json_schema' must be a JSON Schema object.", param="json_schema")
    try:
        return parse_response_format({"type": "json_schema", "json_schema": {"schema": schema}})
    except ApiError as exc:
        exc.param = "json_schema"
        exc.message = exc.message.replace("'response_format.json_schema.schema'", "'json_schema'")
        raise


def parse_request(body: dict[str, Any], limits: Limits, *, chat: bool) -> CompletionRequest:
    refuse_unsupported(body)
    if chat:
        messages = parse_messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be a string (one prompt per request).", param="prompt")
        messages = ({"role": "user", "content": prompt},)
    for name in ("n", "best_of"):  # OpenAI's default, 1, is the only value one answer per request can honour
        count = _integer(body, name, 1)
        if count != 1:
            raise ApiError(400, f"'{name}' must be 1; this server answers one choice per request, not {count}.",
                           param=name)
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins when both are given
        if body.get(name) is not None:
            max_tokens = _integer(body, name, limits.max_tokens)
            if not 1 <= max_tokens <= limits.max_tokens:
                raise ApiError(400, f"'{name}' is {max_tokens}; this server allows 1 to {limits.max_tokens}.",
                               param=name, code="max_tokens_too_large" if max_tokens > 1 else None)
            break
    else:
        max_tokens = limits.max_tokens
    seed = body.get("seed")
    temperature = _number(body, "temperature", 1.0)
    if 0 < temperature < GREEDY_BELOW:
        temperature = 0.0
    try:
        sampling = SamplingSettings(
            temperature=temperature,
            top_p=_number(body, "top_p", 1.0),
            top_k=_integer(body, "top_k", SamplingSettings.top_k),
            min_p=_number(body, "min_p", SamplingSettings.min_p),
            repeat_penalty=_number(body, "repeat_penalty", 1.0),
            seed=_integer(body, "seed", -1) if seed is not None else -1,
            max_tokens=max_tokens,
            response_format=_structured_output(body),
        ).validate()
    except SettingsError as exc:
        raise ApiError(400, str(exc)) from None
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")
    if options is not None and body.get("stream") is not True:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    return CompletionRequest(
        messages=messages,
        sampling=sampling,
        chat=chat,
        stream=body.get("stream") is True,
        include_usage=bool(options and options.get("include_usage") is True),
        timings_per_token=body.get("timings_per_token") is True,
        stop=_stop(body.get("stop")),
        model=str(body.get("model") or ""),
    )


# --- stop sequences -------------------------------------------------------------------------------


@dataclass
class StopMatcher:
    """Cuts the answer at the first stop sequence; holds back text that may be the start of one."""

    stops: tuple[str, ...]
    _held: str = ""
    stopped: bool = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buffer[: min(hits)]
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buffer)), 0, -1):
                if buffer.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held


# --- responses ------------------------------------------------------------------------------------

FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context_full": "length"}


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


@dataclass
class Answer:
    """What one request produced so far: drafted/accepted counts as the passes report them."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    completion_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    text: list[str] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)  # one entry per verify pass that drafted
    per_step_accepted: list[int] = field(default_factory=list)

    def count_pass(self, drafted: int, accepted: int, emitted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.completion_tokens += emitted
        if drafted:
            self.per_step_drafted.append(drafted)
            self.per_step_accepted.append(accepted)


def speculative_decoding(answer: Answer, *, detailed: bool = False) -> dict[str, Any]:
    """vLLM's per-response ``metrics.speculative_decoding``: counts per speculation step (a verify pass that
    drafted), which fits drafts of varying length as adaptive depth makes them."""
    steps = len(answer.per_step_drafted)
    longest = max(answer.per_step_drafted, default=0)
    histogram = [0] * (longest + 1)
    by_length: dict[str, list[int]] = {}
    for drafted, accepted in zip(answer.per_step_drafted, answer.per_step_accepted, strict=True):
        histogram[accepted] += 1
        by_length.setdefault(str(drafted), [0] * (drafted + 1))[accepted] += 1
    out: dict[str, Any] = {
        "num_spec_steps": steps,
        "num_draft_tokens": answer.drafted,
        "num_accepted_draft_tokens": answer.accepted,
        "draft_acceptance_rate": answer.accepted / answer.drafted if answer.drafted else 0.0,
        # Tokens a step yields: the accepted drafts and the target's own token after them.
        "mean_acceptance_length": 1.0 + answer.accepted / steps if steps else 1.0,
        "acceptance_histogram": histogram,
        "acceptance_histogram_by_draft_length": dict(sorted(by_length.items(), key=lambda kv: int(kv[0]))),
    }
    if detailed:
        out["per_step_accepted"] = list(answer.per_step_accepted)
        out["per_step_drafted"] = list(answer.per_step_drafted)
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _per_second(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def timings(prompt_tokens: int, prompt_seconds: float, stats: MessageStats | None, answer: Answer) -> dict[str, Any]:
    """llama-server's ``timings`` object. The predicted window is the engine's decode window (after the
    first token), so ``predicted_per_second`` is the decode rate the window and ``specdeck bench`` show."""
    out: dict[str, Any] = {
        "prompt_n": prompt_tokens,
        "prompt_ms": prompt_seconds * 1000,
        "prompt_per_token_ms": prompt_seconds * 1000 / prompt_tokens if prompt_tokens else 0.0,
        "prompt_per_second": _per_second(prompt_tokens, prompt_seconds),
        "draft_n": answer.drafted,
        "draft_n_accepted": answer.accepted,
    }
    if stats is not None:
        decoded = stats.decode_tokens
        out.update({
            "predicted_n": decoded,
            "predicted_ms": stats.decode_seconds * 1000,
            "predicted_per_token_ms": stats.decode_seconds * 1000 / decoded if decoded else 0.0,
            "predicted_per_second": stats.decode_tps,
        })
    return out




def lm_studio_stats(stats: MessageStats, reason: str, drafter: str | None) -> dict[str, Any]:
    return {
        "tokens_per_second": stats.decode_tps,
        "time_to_first_token": stats.ttft_seconds,
        "generation_time": stats.ttft_seconds + stats.decode_seconds,
        "stop_reason": reason,
        "draft_model": drafter,
        "total_draft_tokens_count": stats.drafted,
        "accepted_draft_tokens_count": stats.accepted,
        "rejected_draft_tokens_count": stats.drafted - stats.accepted,
        "tokens_per_pass": stats.tokens_per_pass,
    }


def completion_body(request: CompletionRequest, response_id: str, model: str, text: str, reason: str,
                    stats: MessageStats, prompt_seconds: float, answer: Answer, drafter: str | None,
                    created: int) -> dict[str, Any]:
    finish = FINISH_REASONS.get(reason, "stop")
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if request.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": response_id,
        "object": "chat.completion" if request.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(stats.prompt_tokens, stats.completion_tokens),
        "timings": timings(stats.prompt_tokens, prompt_seconds, stats, answer),
        "stats": lm_studio_stats(stats, reason, drafter),
        "metrics": {"speculative_decoding": speculative_decoding(answer)},
    }


def chunk_body(request: CompletionRequest, response_id: str, model: str, created: int, *, text: str | None = None,
               role: bool = False, finish: str | None = None) -> dict[str, Any]:
    """One chunk; ``created`` is the response's, the same in every chunk of it (as OpenAI's)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    body: dict[str, Any]
    if request.chat:
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    body = {
        "id": response_id,
        "object": "chat.completion.chunk" if request.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if request.include_usage:
        body["usage"] = None  # OpenAI's chunks say so until the last, which carries the usage
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, allow_nan=False)
    return f"data: {payload}\n\n".encode()
