"""Anthropic's Messages API wire format: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Pure, like ``app.serve.protocol``: a request body is checked and converted to OpenAI-shaped messages, tools and
sampling fields, which protocol's parser then takes (``openai_body``), so one set of checks holds for both APIs;
responses, stream events and errors are built from plain values in the shapes the official ``anthropic`` client
parses. Field names are Anthropic's; llama-server's route converts the same way. Over 500 lines: every field
of the Messages API is converted or refused here, one sentence each, beside the three shapes answers take.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.params import MAX_STOP_LENGTH
from app.serve.api_error import ApiError
from app.serve.protocol import MAX_MESSAGES, MAX_STOP_SEQUENCES, Limits

# Fields that change what the answer says; each is honoured or refused below.
_HONOURED = frozenset({"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                       "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config"})
# Billing, routing and caching hints: nothing here depends on them (the engine keeps its own prefix cache).
_IGNORED = frozenset({"metadata", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics",
                      "user_profile_id", "workspace_id"})
_CREATE_FIELDS = _HONOURED | _IGNORED
_COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                           "cache_control", "speed", "user_profile_id", "workspace_id"})
# Anthropic's own services, which this server does not have: refused by name unless empty.
_REFUSED = {"container": "a code-execution container", "mcp_servers": "remote MCP servers",
            "context_management": "server-side context editing"}
# OpenAI's tool choice strings; any other string is a tool's name.
_CHOICE_WORDS = ("auto", "none", "required")
# Text blocks of a turn are separate paragraphs to the client; llama-server joins them with a newline too.
_JOIN = "\n"
_ARGUMENTS_FRAGMENT = 512  # characters of a tool's input per input_json_delta


@dataclass(frozen=True)
class MessagesRequest:
    """One checked Messages request in the server's OpenAI-like shape. ``tool_choice``: "auto", "none",
    "required" or a tool's name; None when the request gave none."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None
    parallel: bool = True
    sampling_fields: dict[str, Any] = field(default_factory=dict)  # OpenAI's names, for protocol's parser
    stop: tuple[str, ...] = ()
    stream: bool = False
    model: str = ""


def _refuse(message: str, param: str = "messages", code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for name, value in body.items():
        if name in _REFUSED:
            if value is None or value == [] or value == {}:
                continue
            raise _refuse(f"'{name}' asks for {_REFUSED[name]}, which this server does not have; send the request "
                          "without it.", name, "unsupported_parameter")
        if name not in allowed:  # as Anthropic's API does: a misspelt field is an error, not a silent default
            raise _refuse(f"{name[:40]!r}: Extra inputs are not permitted (the Messages API has no such field).",
                          name[:40])


# --- messages -------------------------------------------------------------------------------------


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _refuse(f"{where}.content must be a string or a list of content blocks.")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _refuse(f"{where}.content[{j}] must be an object with a 'type'.")
    return content


def _text(block: Mapping[str, Any], where: str, param: str = "messages") -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _refuse(f"{where} is a text block without a 'text' string.", param)
    return text


def _refuse_block(kind: str, where: str) -> ApiError:
    return _refuse(f"{where} is a {kind[:40]!r} block; this server takes text, tool_use and tool_result blocks "
                   "only.", code="unsupported_content")


def _tool_use(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise _refuse(f"{where} is a tool_use block without an 'id' and a 'name' string.")
    if not isinstance(arguments, dict):
        raise _refuse(f"{where} is a tool_use block whose 'input' is not an object.")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))}}


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id, content, is_error = block.get("tool_use_id"), block.get("content"), block.get("is_error", False)
    if not isinstance(call_id, str) or not call_id:
        raise _refuse(f"{where} is a tool_result block without a 'tool_use_id' string.")
    if not isinstance(is_error, bool):
        raise _refuse(f"{where}.is_error must be true or false.")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise _refuse(f"{where}.content[{k}] is a {str(kind)[:40]!r} block; this server takes text in tool "
                              "results only.", code="unsupported_content")
            parts.append(_text(part, f"{where}.content[{k}]"))
        text = _JOIN.join(parts)
    else:
        raise _refuse(f"{where}.content must be a string or a list of text blocks.")
    if is_error:  # OpenAI's tool message has no error flag, so the model is told in the text
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _has_content(blocks: Sequence[Mapping[str, Any]]) -> bool:
    return any(block["type"] != "text" or block.get("text") for block in blocks)


def _messages(value: Any) -> list[dict[str, Any]]:
    """Anthropic's turns as OpenAI's messages. Consecutive turns of one role are one turn (as Anthropic combines
    them); a user turn's tool results become tool messages, and its text a user message after them."""
    if not isinstance(value, list) or not value:
        raise _refuse("'messages' must be a non-empty list.")
    if len(value) > MAX_MESSAGES:
        raise _refuse(f"The request has {len(value)} messages; this server takes at most {MAX_MESSAGES}.",
                      code="too_many_messages")
    turns: list[tuple[str, list[tuple[int, list[dict[str, Any]]]]]] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _refuse(f"{where} must be an object with 'role' and 'content'.")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise _refuse(f"{where} has role {str(role)[:20]!r}; the Messages API takes user and assistant turns "
                          "(and system).")
        blocks = _blocks(message.get("content"), where)
        if not _has_content(blocks) and not (role == "assistant" and i == len(value) - 1):
            raise _refuse(f"{where} has empty content; every message needs some, except a final assistant one.")
        if turns and turns[-1][0] == role:
            turns[-1][1].append((i, blocks))
        else:
            turns.append((role, [(i, blocks)]))

    out: list[dict[str, Any]] = []
    called: dict[str, int] = {}  # the tool_use ids of the assistant turn before, each with its message's index
    for role, parts in turns:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[tuple[str, dict[str, Any]]] = []
        for i, blocks in parts:
            pieces = []
            for j, block in enumerate(blocks):
                where, kind = f"messages[{i}].content[{j}]", block["type"]
                if kind == "text":
                    pieces.append(_text(block, where))
                elif kind == "tool_use" and role == "assistant":
                    calls.append(_tool_use(block, where))
                elif kind == "tool_result" and role == "user":
                    results.append((where, _tool_result(block, where)))
                elif kind == "tool_use":
                    raise _refuse(f"{where} is a tool_use block in a {role} turn; only assistant turns call tools.")
                elif kind == "tool_result":
                    raise _refuse(f"{where} is a tool_result block in {'an' if role == 'assistant' else 'a'} "
                                  f"{role} turn; only user turns carry tool results.")
                else:
                    raise _refuse_block(kind, where)
            texts.append(_JOIN.join(pieces))
        text = "\n\n".join(t for t in texts if t)
        answered = {result["tool_call_id"] for _, result in results}
        missing = [call_id for call_id in called if call_id not in answered]
        if missing:  # templates pair each call with its result; Anthropic refuses a history without the pair
            raise _refuse(f"messages[{called[missing[0]]}] calls tool_use id {missing[0][:64]!r} with no "
                          "tool_result for it in the next message.")
        for where, result in results:
            if result["tool_call_id"] not in called:
                raise _refuse(f"{where} answers tool_use_id {result['tool_call_id'][:64]!r}, which the message "
                              "before it does not call.")
        called = {}
        for call in calls:
            if call["id"] in called:
                raise _refuse(f"messages[{parts[0][0]}] uses tool_use id {call['id'][:64]!r} twice.")
            called[call["id"]] = parts[0][0]
        out.extend(result for _, result in results)
        if role == "assistant":
            if text or calls:  # an empty final assistant turn prefills nothing
                out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        elif text:
            out.append({"role": role, "content": text})
    return out


def _system(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        parts = []
        for j, block in enumerate(value):
            if not isinstance(block, dict) or block.get("type") != "text":
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise _refuse(f"system[{j}] is a {str(kind)[:40]!r} block; 'system' takes text blocks only.",
                              "system")
            parts.append(_text(block, f"system[{j}]", "system"))
        return _JOIN.join(parts)
    raise _refuse("'system' must be a string or a list of text blocks.", "system")


# --- tools ----------------------------------------------------------------------------------------


def _tools(value: Any) -> tuple[dict[str, Any], ...]:
    """Anthropic's client tools as OpenAI function tools. Their schemas are bounded where protocol parses the
    tools (``openai_body``), as an OpenAI request's are."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _refuse("'tools' must be a list of tools.", "tools")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _refuse(f"{where} must be an object with 'name' and 'input_schema'.", "tools")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _refuse(f"{where} is Anthropic's built-in tool {str(kind)[:40]!r}, which this server does not "
                          "have; send a custom tool with 'name' and 'input_schema'.", "tools", "unsupported_tool")
        name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str) or not name:
            raise _refuse(f"{where} needs a 'name' string.", "tools")
        if name in names:
            raise _refuse(f"Tool names must be unique; {name[:64]!r} is given twice.", "tools")
        names.add(name)
        if not isinstance(schema, dict):
            raise _refuse(f"{where} ({name[:64]!r}) needs an 'input_schema' object (a JSON Schema).", "tools")
        if description is not None and not isinstance(description, str):
            raise _refuse(f"{where}.description must be a string.", "tools")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if description:
            function["description"] = description
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return tuple(out)


def _tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, bool]:
    """(OpenAI's choice, parallel calls allowed)."""
    if value is None:
        return None, True
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _refuse("'tool_choice' must be an object whose 'type' is auto, any, tool or none.", "tool_choice")
    disable = value.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise _refuse("'tool_choice.disable_parallel_tool_use' must be true or false.", "tool_choice")
    if kind in ("any", "tool") and not tools:
        raise _refuse(f"'tool_choice' type {kind!r} needs 'tools' to choose from.", "tool_choice")
    if kind == "tool":
        name = value.get("name")
        if not any(tool["function"]["name"] == name for tool in tools):
            raise _refuse(f"'tool_choice' names tool {str(name)[:64]!r}, which is not in 'tools'.", "tool_choice")
        if name in _CHOICE_WORDS:  # the server's choice is one string, where this name means something else
            raise _refuse(f"A tool named {name!r} cannot be chosen by name on this server; rename it or send "
                          "tool_choice type 'any'.", "tool_choice")
        return str(name), not disable
    return {"auto": "auto", "any": "required", "none": "none"}[kind], not disable


# --- the rest of the body -------------------------------------------------------------------------


def _thinking(value: Any) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str):
        raise _refuse("'thinking' must be an object with a 'type'.", "thinking")
    # Adaptive lets the model decide whether to think; an answer without thinking is one it may give.
    if kind not in ("disabled", "adaptive"):
        raise _refuse(f"'thinking' type {kind[:40]!r} asks for extended thinking, which this server does not "
                      "produce; send type 'disabled' or leave 'thinking' out.", "thinking", "unsupported_parameter")


def _response_format(value: Any) -> dict[str, Any] | None:
    """``output_config.format`` as OpenAI's ``response_format`` (its schema is checked there). ``effort`` is how
    long Claude thinks; nothing here thinks, so it is ignored."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _refuse("'output_config' must be an object.", "output_config")
    spec = value.get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "json_schema" or not isinstance(spec.get("schema"), dict):
        raise _refuse("'output_config.format' must be an object with type 'json_schema' and a 'schema' object.",
                      "output_config")
    return {"type": "json_schema", "json_schema": {"schema": spec["schema"]}}


def _fraction(body: Mapping[str, Any], name: str) -> float | None:
    """``temperature`` and ``top_p``: Anthropic's range for both is 0 to 1."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise _refuse(f"'{name}' must be a number from 0 to 1, not {json.dumps(value)[:40]}.", name)
    return float(value)


def _max_tokens(value: Any, limits: Limits) -> int:
    if value is None:
        raise _refuse(f"'max_tokens' is required: the Messages API asks each request for its limit (this server "
                      f"allows 1 to {limits.max_tokens}).", "max_tokens")
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()):
        raise _refuse(f"'max_tokens' must be a whole number, not {json.dumps(value)[:40]}.", "max_tokens")
    if not 1 <= value <= limits.max_tokens:
        raise _refuse(f"'max_tokens' is {int(value)}; this server allows 1 to {limits.max_tokens}.", "max_tokens",
                      "max_tokens_too_large" if value > 1 else None)
    return int(value)


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _refuse("'stop_sequences' must be a list of strings.", "stop_sequences")
    if len(value) > MAX_STOP_SEQUENCES or any(len(s) > MAX_STOP_LENGTH for s in value):
        raise _refuse(f"'stop_sequences' takes at most {MAX_STOP_SEQUENCES} strings of at most {MAX_STOP_LENGTH} "
                      "characters.", "stop_sequences")
    return tuple(s for s in value if s)


def _parse(body: Mapping[str, Any], sampling: dict[str, Any]) -> MessagesRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _refuse("'model' must be a string.", "model")
    system = _system(body.get("system"))
    messages = _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    choice, parallel = _tool_choice(body.get("tool_choice"), tools)
    _thinking(body.get("thinking"))
    response_format = _response_format(body.get("output_config"))
    if response_format is not None:
        sampling["response_format"] = response_format
    return MessagesRequest(
        messages=(({"role": "system", "content": system},) if system else ()) + tuple(messages),
        tools=tools, tool_choice=choice, parallel=parallel, sampling_fields=sampling, model=model or "")


def parse_messages_request(body: dict[str, Any], limits: Limits) -> MessagesRequest:
    """A ``POST /v1/messages`` body, checked; ``ApiError`` (400) names the first field at fault."""
    _check_fields(body, _CREATE_FIELDS)
    sampling: dict[str, Any] = {"max_tokens": _max_tokens(body.get("max_tokens"), limits)}
    for name in ("temperature", "top_p"):
        value = _fraction(body, name)
        if value is not None:
            sampling[name] = value
    if body.get("top_k") is not None:  # a whole number within the engine's range: protocol's parser checks it
        sampling["top_k"] = body["top_k"]
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _refuse("'stream' must be true or false.", "stream")
    return replace(_parse(body, sampling), stop=_stop_sequences(body.get("stop_sequences")), stream=stream)


def parse_count_tokens_request(body: dict[str, Any], limits: Limits) -> MessagesRequest:
    """A ``POST /v1/messages/count_tokens`` body: a request's prompt side, without ``max_tokens``."""
    del limits  # nothing is generated, so no generation limit applies
    _check_fields(body, _COUNT_FIELDS)
    return _parse(body, {})


def openai_body(request: MessagesRequest) -> dict[str, Any]:
    """The same request as a chat-completions body, for ``protocol.parse_request(body, limits, chat=True)``."""
    body: dict[str, Any] = {"messages": [dict(m) for m in request.messages], **request.sampling_fields,
                            "stream": request.stream, "model": request.model}
    if request.stop:
        body["stop"] = list(request.stop)
    if request.tools:
        body["tools"] = [dict(tool) for tool in request.tools]
        body["parallel_tool_calls"] = request.parallel
        if request.tool_choice in _CHOICE_WORDS:
            body["tool_choice"] = request.tool_choice
        elif request.tool_choice is not None:
            body["tool_choice"] = {"type": "function", "function": {"name": request.tool_choice}}
    return body


def count_tokens_body(input_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens}


# --- responses ------------------------------------------------------------------------------------


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def stop_reason_for(engine_reason: str, stopped_by: str | None, has_calls: bool) -> str:
    """Anthropic's ``stop_reason`` for the engine's finish reason; ``stopped_by`` is the stop sequence hit."""
    if has_calls:
        return "tool_use"
    if stopped_by:
        return "stop_sequence"
    if engine_reason in ("max_tokens", "context_full"):
        return "max_tokens"
    return "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as a tool_use block's ``input``, which must be an object."""
    value = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(value, dict):
        raise ValueError(f"A tool call's arguments must be a JSON object, not {arguments[:40]!r}.")
    return value


def _with_extra(body: dict[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    if extra:
        clash = body.keys() & extra.keys()
        if clash:
            raise ValueError(f"Extra keys {sorted(clash)} would replace the Messages API's own.")
        body.update(extra)
    return body


def message_body(message_id: str, model: str, text: str, calls: Sequence[tuple[str, str, str]], stop_reason: str,
                 stop_sequence: str | None, input_tokens: int, output_tokens: int,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A whole Message. ``calls``: (id, name, arguments JSON); an empty id gets a new ``toolu_`` one."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.extend({"type": "tool_use", "id": call_id or new_tool_use_id(), "name": name,
                    "input": tool_input(arguments)} for call_id, name, arguments in calls)
    return _with_extra({
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }, extra)


# --- errors ---------------------------------------------------------------------------------------

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def error_body(exc: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(exc.status), "message": exc.message}}


# --- streaming ------------------------------------------------------------------------------------


def event(name: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n".encode()


class MessageStream:
    """A Message as server-sent events in Anthropic's order: message_start; per content block a start, its
    deltas and a stop, the blocks indexed from 0; message_delta with the stop reason; message_stop."""

    def __init__(self) -> None:
        self._started = False
        self._finished = False
        self._blocks = 0  # content blocks opened so far; the next one's index
        self._text_open = False

    def _check(self) -> None:
        if not self._started or self._finished:
            raise RuntimeError("A MessageStream sends content between start() and finish().")

    def start(self, message_id: str, model: str, input_tokens: int) -> bytes:
        if self._started:
            raise RuntimeError("A MessageStream starts once.")
        self._started = True
        message: dict[str, Any] = {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
        return event("message_start", {"type": "message_start", "message": message})

    def _open(self, block: dict[str, Any]) -> bytes:
        self._blocks += 1
        return event("content_block_start", {"type": "content_block_start", "index": self._blocks - 1,
                                             "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self._blocks - 1,
                                             "delta": delta})

    def _close(self) -> bytes:
        return event("content_block_stop", {"type": "content_block_stop", "index": self._blocks - 1})

    def _close_text(self) -> bytes:
        if not self._text_open:
            return b""
        self._text_open = False
        return self._close()

    def text(self, delta: str) -> bytes:
        self._check()
        if not delta:
            return b""
        out = b""
        if not self._text_open:
            out = self._open({"type": "text", "text": ""})
            self._text_open = True
        return out + self._delta({"type": "text_delta", "text": delta})

    def tool_call(self, call_id: str, name: str, arguments: str) -> bytes:
        """One whole tool use: its block, its input in fragments, its stop. An empty id gets a new one."""
        self._check()
        out = self._close_text()
        out += self._open({"type": "tool_use", "id": call_id or new_tool_use_id(), "name": name, "input": {}})
        payload = json.dumps(tool_input(arguments), ensure_ascii=False, separators=(",", ":"))
        for at in range(0, len(payload), _ARGUMENTS_FRAGMENT):
            out += self._delta({"type": "input_json_delta", "partial_json": payload[at:at + _ARGUMENTS_FRAGMENT]})
        return out + self._close()

    def finish(self, stop_reason: str, stop_sequence: str | None, output_tokens: int,
               extra: Mapping[str, Any] | None = None) -> bytes:
        """The end: ``extra`` keys ride on the message_delta event beside Anthropic's."""
        self._check()
        out = self._close_text()
        self._finished = True
        delta = _with_extra({"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                                "stop_sequence": stop_sequence},
                             "usage": {"output_tokens": output_tokens}}, extra)
        return out + event("message_delta", delta) + event("message_stop", {"type": "message_stop"})

    def ping(self) -> bytes:
        return event("ping", {"type": "ping"})

    def error(self, exc: ApiError) -> bytes:
        """A failure after the stream began (its status is already 200); nothing follows it."""
        self._finished = True
        return event("error", error_body(exc))
