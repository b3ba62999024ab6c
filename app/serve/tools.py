"""OpenAI's tool calling, the request side: ``tools``, ``tool_choice``, ``parallel_tool_calls`` and the tool turns
of the history, checked into the engine's shapes (``app.engine.tool_calls``); and calls in OpenAI's shapes.

Pure, like ``app.serve.protocol``: each refusal is one sentence naming the field. Every tool's parameters pass
the grammar's bounds (``app.engine.schema_limits``), so a hostile schema (nesting hundreds deep, an enum of
100k values, a pattern whose matching explodes) is refused by name instead of reaching the template or the
grammar; when the call is forced, the schemas must also stay inside the subset the grammar enforces
(``app.serve.json_schema``), never silently loosened.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.engine import tool_calls
from app.engine.schema_limits import check_schema
from app.engine.tool_calls import ToolCall
from app.errors import SettingsError
from app.serve.api_error import ApiError
from app.serve.json_schema import unsupported_in_schema

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_TOOLS = 128  # OpenAI's limit
MAX_CALLS_PER_MESSAGE = 128
MAX_ID_CHARS = 256
CHOICE_WORDS = ("auto", "none", "required")
ARGUMENTS_FRAGMENT = 512  # characters of arguments per stream delta
_NEUTRAL: tuple[Any, ...] = (None, False, 0, "", [], {}, "none", "auto")


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools as the template takes them (``{"type": "function", "function": {"name", "description",
    "parameters"}}``), its tool choice ("auto", "required" or a function's name) and whether several calls may
    come in one answer."""

    tools: tuple[dict[str, Any], ...]
    choice: str | None
    parallel: bool


def _refuse(message: str, param: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _function(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise _refuse(f"'{where}' must be an object with 'type' and 'function'.", "tools")
    if tool.get("type") != "function":
        raise _refuse(f"'{where}' has type {str(tool.get('type'))[:40]!r}; this server takes function tools "
                      "only ('type': 'function').", "tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _refuse(f"'{where}.function' must be an object with a 'name'.", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        shown = repr(name[:80]) if isinstance(name, str) else "missing"
        raise _refuse(f"'{where}.function.name' is {shown}; a name is 1 to 64 letters, digits, '_' or '-'.",
                      "tools", "invalid_tool_name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _refuse(f"'{where}.function.description' must be a string.", "tools")
    if function.get("strict") is not None and not isinstance(function.get("strict"), bool):
        raise _refuse(f"'{where}.function.strict' must be true or false.", "tools")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise _refuse(f"'{where}.function.parameters' must be a JSON Schema object.", "tools", "invalid_schema")
    if parameters.get("type", "object") != "object":
        raise _refuse(f"'{where}.function.parameters' must describe an object (its 'type' is "
                      f"{str(parameters.get('type'))[:40]!r}); a call's arguments are an object.", "tools",
                      "invalid_schema")
    parameters = {"type": "object", **parameters}
    # The template gets a description and parameters always: some templates read them unguarded.
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters}}


def _choice(value: Any, names: Sequence[str]) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in CHOICE_WORDS:
            raise _refuse(f"'tool_choice' is {value[:40]!r}; it takes auto, none, required or "
                          "{'type': 'function', 'function': {'name': ...}}.", "tool_choice")
        return value
    if not isinstance(value, dict) or value.get("type") != "function":
        kind = value.get("type") if isinstance(value, dict) else None
        raise _refuse(f"'tool_choice' type {str(kind)[:40]!r} is not one this server takes; send auto, none, "
                      "required or {'type': 'function', 'function': {'name': ...}}.", "tool_choice")
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise _refuse("'tool_choice.function.name' must be the name of one of the tools.", "tool_choice")
    if name not in names:
        raise _refuse(f"'tool_choice' names function {name[:64]!r}, which is not in 'tools'.", "tool_choice")
    if name in CHOICE_WORDS:  # the choice is one string here, where this name means something else
        raise _refuse(f"A function named {name!r} cannot be chosen by name on this server; rename it or send "
                      "'tool_choice' required.", "tool_choice")
    return name


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools, checked; None when it has none, or its tool choice is "none"."""
    for legacy, instead in (("functions", "tools"), ("function_call", "tool_choice")):
        if body.get(legacy) not in _NEUTRAL:
            raise _refuse(f"'{legacy}' is OpenAI's deprecated function calling, which this server does not take; "
                          f"send '{instead}' instead.", legacy, "unsupported_parameter")
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise _refuse("'tools' must be a list of function tools.", "tools")
    raw = raw or []
    if len(raw) > MAX_TOOLS:
        raise _refuse(f"The request has {len(raw)} tools; this server takes at most {MAX_TOOLS}.", "tools")
    tools = tuple(_function(i, tool) for i, tool in enumerate(raw))
    names = [t["function"]["name"] for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _refuse(f"Tool names must be unique; {name!r} is given twice.", "tools")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise _refuse("'parallel_tool_calls' must be true or false.", "parallel_tool_calls")
    choice = _choice(body.get("tool_choice"), names)
    if not tools:
        if choice not in ("auto", "none"):
            raise _refuse(f"'tool_choice' {choice!r} needs 'tools' to choose from.", "tool_choice")
        return None
    if choice == "none":
        return None
    if choice != "auto":
        _check_forced(tools, choice, parallel)
    return ToolRequest(tools, choice, parallel)


def _check_forced(tools: tuple[dict[str, Any], ...], choice: str, parallel: bool) -> None:
    """A forced call is held to its schema by the grammar, so each schema it uses must be one the grammar
    enforces whole, and the forced schema must fit the grammar's bounds. Under ``auto`` a schema is only text in
    the prompt, so it is not held to the grammar's subset."""
    for i, tool in enumerate(tools):
        function = tool["function"]
        if choice not in ("required", function["name"]):
            continue
        try:
            check_schema(function["parameters"])
        except SettingsError as exc:
            raise _refuse(f"'tools[{i}].function.parameters' ({function['name']}): {exc}", "tools",
                          "invalid_schema") from None
        except RecursionError:
            raise _refuse(f"'tools[{i}].function.parameters' ({function['name']}) is nested too deeply.", "tools",
                          "invalid_schema") from None
        unsupported = unsupported_in_schema(function["parameters"], "parameters")
        if unsupported:
            raise _refuse(f"'tools[{i}]' ({function['name']}) uses {unsupported}, which this server cannot enforce "
                          "in a forced call; it supports the subset llama.cpp turns into a grammar.", "tools",
                          "unsupported_schema")
    try:
        check_schema(tool_calls.forced_schema(tools, choice, parallel))
    except SettingsError as exc:
        raise _refuse(f"The forced call's schema (every tool's parameters, for 'tool_choice' {choice!r}) is too "
                      f"large for the grammar: {exc}", "tool_choice", "invalid_schema") from None


# --- the history --------------------------------------------------------------------------------------------

def _text(content: Any, where: str, *, empty: bool) -> str:
    if isinstance(content, str):
        return content
    if content is None and empty:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _refuse(f"{where} has a {str(kind)[:40]!r} part; this server takes text parts only.",
                              "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise _refuse(f"{where} content must be a string or a list of text parts.", "messages")


def _id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _refuse(f"{where} must be a non-empty string.", "messages")
    if len(value) > MAX_ID_CHARS:
        raise _refuse(f"{where} is {len(value)} characters; at most {MAX_ID_CHARS} are taken.", "messages")
    return value


def _history_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise _refuse(f"{where} must be an object with 'id', 'type' and 'function'.", "messages")
    if call.get("type", "function") != "function":
        raise _refuse(f"{where} has type {str(call.get('type'))[:40]!r}; only function calls are taken.",
                      "messages")
    function = call.get("function")
    if not isinstance(function, dict):
        raise _refuse(f"{where}.function must be an object with 'name' and 'arguments'.", "messages")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _refuse(f"{where}.function.name must be a tool's name (1 to 64 letters, digits, '_' or '-').",
                      "messages")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):  # some clients send the object itself
        arguments = tool_calls.compact_json(arguments)
    if not isinstance(arguments, str):
        raise _refuse(f"{where}.function.arguments must be a string of JSON.", "messages")
    parsed = tool_calls.arguments_object(arguments)
    if parsed is not None:
        arguments = tool_calls.compact_json(parsed)
    return {"id": _id(call.get("id"), f"{where}.id"), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def parse_message_tools(message: dict[str, Any], i: int) -> dict[str, Any]:
    """An assistant message with ``tool_calls`` (its content may be null) or a ``tool`` message, as the engine's
    message dict; ApiError naming ``messages[i]`` when it is malformed."""
    where = f"messages[{i}]"
    role = message.get("role")
    if role == "tool":
        out: dict[str, Any] = {"role": "tool", "tool_call_id": _id(message.get("tool_call_id"),
                                                                    f"{where}.tool_call_id"),
                               "content": _text(message.get("content"), where, empty=True)}
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        return out
    if role != "assistant":
        raise _refuse(f"{where} has role {str(role)[:40]!r}; only assistant messages carry tool calls.", "messages")
    calls = message.get("tool_calls")
    content = _text(message.get("content"), where, empty=True)
    if calls is None or calls == []:
        return {"role": "assistant", "content": content}
    if not isinstance(calls, list):
        raise _refuse(f"{where}.tool_calls must be a list of calls.", "messages")
    if len(calls) > MAX_CALLS_PER_MESSAGE:
        raise _refuse(f"{where} has {len(calls)} tool calls; at most {MAX_CALLS_PER_MESSAGE} are taken.", "messages")
    parsed = [_history_call(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(calls)]
    ids = [call["id"] for call in parsed]
    for k, call_id in enumerate(ids):
        if call_id in ids[:k]:
            raise _refuse(f"{where} uses tool call id {call_id[:64]!r} twice.", "messages")
    return {"role": "assistant", "content": content, "tool_calls": parsed}


# --- answers ----------------------------------------------------------------------------------------------------

def tool_call_json(call: ToolCall) -> dict[str, Any]:
    """A call in OpenAI's message shape."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_deltas(calls: Sequence[ToolCall], first_index: int = 0) -> list[dict[str, Any]]:
    """Whole calls as OpenAI's stream deltas: per call, its id and name with empty arguments, then the arguments
    in fragments."""
    out: list[dict[str, Any]] = []
    for index, call in enumerate(calls, first_index):
        out.append({"index": index, "id": call.id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}})
        for at in range(0, len(call.arguments), ARGUMENTS_FRAGMENT):
            out.append({"index": index, "function": {"arguments": call.arguments[at:at + ARGUMENTS_FRAGMENT]}})
    return out
