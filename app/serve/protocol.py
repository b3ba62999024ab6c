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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine import tool_calls
from app.engine.schema_limits import check_schema
from app.engine.tool_calls import ToolCall
from app.errors import SettingsError
from app.events import MessageStats, TokenLogprob
from app.params import JSON_OBJECT, MAX_STOP_LENGTH, SamplingSettings
from app.serve.api_error import ApiError
from app.serve.json_schema import unsupported_in_schema
from app.serve.tools import ToolRequest, parse_message_tools, parse_tools, tool_call_json

DEFAULT_BODY_LIMIT = 4 << 20  # bytes; a chat that fills a 128k context is about 0.5 MB of text
MAX_STOP_SEQUENCES = 4  # OpenAI's limit
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
    "functions": "the legacy function calls (send 'tools')", "function_call": "the legacy function calls (send "
    "'tool_choice')", "audio": "audio", "modalities": "other modalities",
    "prediction": "predicted outputs", "web_search_options": "web search",
    "echo": "echoing the prompt", "suffix": "suffixes",
    # llama-server's own: a raw grammar has no path to the engine (a JSON schema does: json_schema below)
    "grammar": "a GBNF grammar (send a JSON schema in 'json_schema' or 'response_format')",
    "n_probs": "token probabilities (send 'logprobs' and 'top_logprobs')", "mirostat": "Mirostat sampling",
}
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_FORCED_CALLS = 16  # parallel calls in one forced answer
MAX_LOGIT_BIAS = 1024
NEUTRAL_VALUES: tuple[Any, ...] = (None, False, 0, 0.0, "", [], {}, "none", "auto")

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
    unsupported = unsupported_in_schema(schema, "schema")
    if unsupported:
        raise ApiError(400, f"The JSON schema uses {unsupported}, which this server cannot enforce; it supports "
                       "the subset llama.cpp turns into a grammar.", param="response_format",
                       code="unsupported_schema")
    return json.dumps(schema, ensure_ascii=False)


@dataclass(frozen=True)
class Limits:
    body_bytes: int = DEFAULT_BODY_LIMIT
    max_tokens: int = 4096  # the most a request may ask for; also the default when it asks for none


@dataclass(frozen=True)
class CompletionRequest:
    """One checked request. ``chat`` is False for /v1/completions: its prompt is the one message, fed raw.
    ``tools``: the request's tools, unless it has none or its tool choice is "none"."""

    messages: tuple[dict[str, Any], ...]
    sampling: SamplingSettings
    chat: bool = True
    tools: ToolRequest | None = None
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


def parse_messages(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    if len(value) > MAX_MESSAGES:
        raise ApiError(400, f"The request has {len(value)} messages; this server takes at most {MAX_MESSAGES}.",
                       param="messages", code="too_many_messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object with 'role' and 'content'.", param="messages")
        if message.get("role") == "tool" or (message.get("role") == "assistant" and message.get("tool_calls")):
            out.append(parse_message_tools(message, i))
            continue
        role = ROLE_ALIASES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise ApiError(400, f"messages[{i}] has role {message.get('role')!r}; this server takes system, "
                           "developer, user, assistant and tool.", param="messages")
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
    tools = parse_tools(body) if chat else None
    response_format = _structured_output(body)
    if tools is not None and forced_response_format(tools):
        if response_format:
            raise ApiError(400, "A forced tool call ('tool_choice' required or a named function) and a JSON "
                           "'response_format' cannot both constrain the answer; send one of them.",
                           param="tool_choice")
        response_format = forced_response_format(tools)
    logprobs, top_logprobs = _logprobs(body, chat)
    try:
        sampling = SamplingSettings(
            temperature=temperature,
            top_p=_number(body, "top_p", 1.0),
            top_k=_integer(body, "top_k", SamplingSettings.top_k),
            min_p=_number(body, "min_p", SamplingSettings.min_p),
            repeat_penalty=_number(body, "repeat_penalty", 1.0),
            presence_penalty=_number(body, "presence_penalty", 0.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            logit_bias=_logit_bias(body.get("logit_bias")),
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            seed=_integer(body, "seed", -1) if seed is not None else -1,
            max_tokens=max_tokens,
            response_format=response_format,
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
        tools=tools,
        stream=body.get("stream") is True,
        include_usage=bool(options and options.get("include_usage") is True),
        timings_per_token=body.get("timings_per_token") is True,
        stop=_stop(body.get("stop")),
        model=str(body.get("model") or ""),
    )


def forced_response_format(tools: ToolRequest) -> str:
    """The grammar's schema when the call is forced (``required`` or a named function), else ""."""
    if tools.choice in (None, "auto", "none"):
        return ""
    schema = tool_calls.forced_schema(tools.tools, tools.choice, tools.parallel)
    if schema.get("type") == "array":  # a model that never closes the list would run to max_tokens
        schema["maxItems"] = min(schema.get("maxItems", MAX_FORCED_CALLS), MAX_FORCED_CALLS)
    return json.dumps(schema, ensure_ascii=False)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}``; the ids are checked against the vocabulary by the engine."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ApiError(400, "'logit_bias' must be an object of token ids to biases.", param="logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise ApiError(400, f"'logit_bias' has {len(value)} entries; this server takes at most {MAX_LOGIT_BIAS}.",
                       param="logit_bias")
    out = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
            raise ApiError(400, f"'logit_bias' key {key[:20]!r} is not a token id.", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise ApiError(400, f"'logit_bias' for token {key} must be a number from -100 to 100.",
                           param="logit_bias")
        out.append((int(key), float(bias)))
    return tuple(out)


def _logprobs(body: dict[str, Any], chat: bool) -> tuple[bool, int]:
    """(logprobs on, how many alternatives): chat's ``logprobs`` is a boolean with ``top_logprobs`` beside it;
    the legacy completions' ``logprobs`` is the count of alternatives itself."""
    value = body.get("logprobs")
    if not chat:
        if value is None or value is False:
            return False, 0
        top = _integer(body, "logprobs", 0)
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"'logprobs' must be 0 to {MAX_TOP_LOGPROBS}.", param="logprobs")
        return True, top
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, "'logprobs' must be true or false.", param="logprobs")
    top = _integer(body, "top_logprobs", 0) if body.get("top_logprobs") is not None else 0
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'top_logprobs' must be 0 to {MAX_TOP_LOGPROBS}.", param="top_logprobs")
    if top and value is not True:
        raise ApiError(400, "'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs")
    return value is True, top


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
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per token, when the request asked
    tool_format: str = ""  # how the answer's tool calls are written (PromptProcessed.tool_format)

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
                    created: int, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    finish = "tool_calls" if calls else FINISH_REASONS.get(reason, "stop")
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                              "logprobs": logprobs_body(answer.logprobs, request.chat)
                              if request.sampling.logprobs else None}
    if request.chat:
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = [tool_call_json(call) for call in calls]
        choice["message"] = message
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
               role: bool = False, finish: str | None = None, tool_calls: Sequence[dict[str, Any]] = (),
               logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
    """One chunk; ``created`` is the response's, the same in every chunk of it (as OpenAI's)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                              "logprobs": logprobs_body(logprobs, request.chat) if logprobs else None}
    body: dict[str, Any]
    if request.chat:
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = list(tool_calls)
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


def logprobs_body(items: Sequence[TokenLogprob], chat: bool) -> dict[str, Any]:
    """OpenAI's ``logprobs``: chat's ``content`` list, or the legacy completions' parallel lists."""
    if chat:
        return {"content": [{
            "token": item.token, "logprob": item.logprob, "bytes": list(item.token_bytes),
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token_bytes)}
                             for t in item.top],
        } for item in items], "refusal": None}
    offsets, at = [], 0
    for item in items:
        offsets.append(at)
        at += len(item.token)
    return {"tokens": [item.token for item in items], "token_logprobs": [item.logprob for item in items],
            "top_logprobs": [{t.token: t.logprob for t in item.top} for item in items], "text_offset": offsets}


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, allow_nan=False)
    return f"data: {payload}\n\n".encode()
