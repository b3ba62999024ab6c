"""Tool calls in the formats chat templates teach their models, read back from the model's text.

Pure: no llama.cpp, no Qt. The formats and how a template is recognised follow llama.cpp's ``common/chat.cpp``
(and its parsers in ``common/parsers/``):

- ``hermes``: Qwen2.5, Qwen3, Hermes: ``<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>``;
- ``qwen3_coder``: ``<tool_call>\\n<function=N>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``,
  each value typed by the tool's schema (a string as it is, anything else JSON); the ``<tool_call>`` line may
  be missing, as Qwen3-Coder sometimes leaves it out;
- ``llama3``: Llama 3.x: a bare ``{"name": N, "parameters": {...}}`` as the whole answer, or after
  ``<|python_tag|>``; several separated by ``;`` or new lines;
- ``mistral``: ``[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]`` (Nemo) and
  ``[TOOL_CALLS]N[CALL_ID]id[ARGS]{...}`` or ``[TOOL_CALLS]N[ARGS]{...}`` (Small 3.2, Devstral, Ministral);
- ``gpt_oss``: harmony messages; a call is ``<|channel|>commentary to=functions.N <|constrain|>json<|message|>
  {...}<|call|>`` (the recipient may also stand in the role header: `` to=functions.N<|channel|>...``). The
  answer's content is what the final and commentary channels say; the analysis channel is reasoning, not
  content (llama.cpp returns it as ``reasoning_content``);
- ``generic``: a template that does not take tools gets them described in its system turn
  (:func:`tools_system_text`) and is asked for the hermes wrapper.

A call that does not read cleanly (bad JSON, a tool that was not offered, a block left open) is not a call:
the answer is then all text, so nothing the model wrote is lost. Content is the text outside the calls, each
piece stripped and the pieces joined by a new line.

Over 500 lines: six formats, each read whole and as it streams, under one rule for what a malformed call becomes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FORMATS = ("hermes", "qwen3_coder", "llama3", "mistral", "gpt_oss", "generic")

_WS = " \t\r\n"
_TEMPLATE_ID = re.compile(r"[A-Za-z0-9]{9}")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class ParsedAnswer:
    content: str
    calls: tuple[ToolCall, ...]


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# --- the template's side -------------------------------------------------------------------------------------

def detect_format(template: str | None) -> str:
    """The format a template's model writes its calls in, from the template's text, in chat.cpp's order."""
    src = template or ""
    if "<|channel|>" in src:
        return "gpt_oss"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:
        return "qwen3_coder"
    if "<tool_call>" in src:
        return "hermes"
    if "<|python_tag|>" in src or "<|start_header_id|>ipython<|end_header_id|>" in src:
        return "llama3"
    return "generic"


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    function = tool.get("function", tool)
    return function if isinstance(function, Mapping) else {}


def _tool_names(tools: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(_function(t).get("name", "")) for t in tools]


def template_renders_tools(rendered: str, tools: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a prompt rendered with ``tools=`` shows every tool's name (minja's capability check is the
    same idea): a template that ignores ``tools`` shows none of them."""
    for name in _tool_names(tools):
        if not name or not re.search(r"(?<![A-Za-z0-9_-])" + re.escape(name) + r"(?![A-Za-z0-9_-])", rendered):
            return False
    return True


def compact_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape: kept as an escape, not as broken text
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return text


def _call_block(name: str, arguments: Any) -> str:
    args = arguments_object(arguments)
    shown = json.dumps(args, ensure_ascii=False) if args is not None else str(arguments)
    return f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {shown}}}\n</tool_call>'


def tools_system_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """For a template without tools: the system turn's text that lists them and asks for hermes blocks."""
    lines = []
    for tool in tools:
        function = _function(tool)
        entry: dict[str, Any] = {"name": function.get("name", "")}
        if function.get("description"):
            entry["description"] = function["description"]
        entry["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
        lines.append(json.dumps(entry, ensure_ascii=False))
    return (
        "# Tools\n\n"
        "You may call one or more of these functions to answer. Their signatures are within <tools></tools>:\n"
        "<tools>\n" + "\n".join(lines) + "\n</tools>\n\n"
        "To call a function, answer with one <tool_call></tool_call> block per call, each holding a JSON object "
        "with the function's name and its arguments:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
        "Otherwise, answer in plain text."
    )


def plain_history(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The conversation with its tool turns as text, for a template without tools: an assistant's calls as
    ``<tool_call>`` blocks after its text, tool results as ``<tool_response>`` blocks in a user turn. Results in
    a row, and a user message right after them, share one user turn, so templates that insist on alternating
    roles still take the conversation."""
    out: list[dict[str, str]] = []
    joinable = False  # the last turn holds tool results
    for message in messages:
        role = str(message.get("role", "user"))
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        if role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if joinable:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            joinable = True
            continue
        if role == "assistant" and message.get("tool_calls"):
            blocks = []
            for call in message.get("tool_calls") or ():
                function = call.get("function", {}) if isinstance(call, Mapping) else {}
                blocks.append(_call_block(str(function.get("name", "")), function.get("arguments", {})))
            text = "\n".join(([text] if text.strip() else []) + blocks)
        if role == "user" and joinable:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})
        joinable = False
    return out


def _template_id(call_id: Any) -> str:
    # Mistral's templates refuse ids that are not 9 letters and digits; any other id maps to 9 of them,
    # the same for a call and its result.
    text = str(call_id or "")
    return text if _TEMPLATE_ID.fullmatch(text) else hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:9]


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: a call's ``arguments`` a mapping when it is a JSON object (so
    ``| tojson`` and ``| items`` work), ids 9 letters and digits, no empty ``tool_calls``."""
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = {k: v for k, v in message.items() if k != "tool_calls"}
        calls = message.get("tool_calls")
        if calls:
            copy["tool_calls"] = []
            for call in calls:
                function = call.get("function", {}) if isinstance(call, Mapping) else {}
                arguments = function.get("arguments", {})
                parsed = arguments_object(arguments)
                copy["tool_calls"].append({
                    "id": _template_id(call.get("id") if isinstance(call, Mapping) else ""),
                    "type": "function",
                    "function": {**function, "arguments": parsed if parsed is not None else arguments},
                })
        if message.get("role") == "tool" and "tool_call_id" in message:
            copy["tool_call_id"] = _template_id(message.get("tool_call_id"))
        out.append(copy)
    return out


# --- JSON -----------------------------------------------------------------------------------------------------

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _loads(text: str) -> Any:
    """Strict JSON (no NaN or Infinity); ValueError for anything else, including nesting too deep to read."""
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _decode_at(text: str, pos: int) -> tuple[Any, int]:
    """The JSON value starting at ``pos`` and the index after it."""
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def arguments_object(arguments: Any) -> dict[str, Any] | None:
    """Arguments as a mapping: a mapping, or JSON text of an object; None otherwise."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str):
        try:
            value = _loads(arguments)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


class _Malformed(Exception):
    """A call that does not read cleanly: the answer is text."""


class _Tools:
    def __init__(self, tools: Iterable[Mapping[str, Any]]) -> None:
        self.params: dict[str, Mapping[str, Any]] = {}
        for tool in tools:
            function = _function(tool)
            name = function.get("name")
            if isinstance(name, str) and name:
                params = function.get("parameters")
                self.params[name] = params if isinstance(params, Mapping) else {}

    def call(self, name: Any, arguments: Any) -> ToolCall:
        if not isinstance(name, str) or name not in self.params:
            raise _Malformed
        args = {} if arguments is None else arguments_object(arguments)
        if args is None:
            raise _Malformed
        return ToolCall(new_call_id(), name, compact_json(args))

    def from_object(self, value: Any, *keys: str) -> ToolCall:
        """``{"name": N, "<key>": {...}}``, the first of ``keys`` present holding the arguments."""
        if not isinstance(value, dict):
            raise _Malformed
        if value.get("type", "function") != "function":
            raise _Malformed
        key = next((k for k in keys if k in value), None)
        return self.call(value.get("name"), value[key] if key else None)


# --- parsing ------------------------------------------------------------------------------------------------------

def _pieces(pieces: Iterable[str]) -> str:
    return "\n".join(p.strip() for p in pieces if p.strip())


def _find_marker(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, marker)
    return best


def _markers(fmt: str, tools: _Tools) -> tuple[str, ...]:
    if fmt == "mistral":
        return ("[TOOL_CALLS]",)
    if fmt == "llama3":
        return ("<|python_tag|>",)
    if fmt == "qwen3_coder":
        return ("<tool_call>", *(f"<function={name}>" for name in tools.params))
    return ("<tool_call>",)


def _hermes_block(text: str, pos: int, tools: _Tools) -> tuple[ToolCall, int]:
    """``pos`` is just past ``<tool_call>``."""
    value, end = _decode_at(text, _skip_ws(text, pos))
    end = _skip_ws(text, end)
    if not text.startswith("</tool_call>", end):
        raise _Malformed
    return tools.from_object(value, "arguments", "parameters"), end + len("</tool_call>")


_TYPE_KEYS = ("anyOf", "oneOf")


def _value_types(schema: Any, depth: int = 0) -> set[str] | None:
    """The JSON types a parameter's schema allows; None when it does not say."""
    if not isinstance(schema, Mapping) or depth > 8:
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return set(kind)
    values = schema["enum"] if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is not None:
        return {_json_type(v) for v in values}
    found: set[str] = set()
    for key in _TYPE_KEYS:
        for sub in schema.get(key) or ():
            sub_types = _value_types(sub, depth + 1)
            if sub_types is None:
                return None
            found |= sub_types
    return found or None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


# Jinja's `| string` writes Python's words; Qwen3-Coder's template renders non-string values with it.
_PYTHON_WORDS = {"True": True, "False": False, "None": None}


def _xml_value(raw: str, schema: Any) -> Any:
    types = _value_types(schema)
    if types == {"string"}:
        return raw
    stripped = raw.strip()
    try:
        return _loads(stripped)
    except ValueError:
        pass
    if stripped in _PYTHON_WORDS and types and _json_type(_PYTHON_WORDS[stripped]) in types:
        return _PYTHON_WORDS[stripped]
    if types is None or "string" in types:
        return raw
    raise _Malformed


def _qwen3_coder_function(text: str, pos: int, tools: _Tools) -> tuple[ToolCall, int]:
    """``pos`` is at ``<function=``; returns the call and the index after ``</function>``."""
    close = text.find(">", pos)
    if close < 0:
        raise _Malformed
    name = text[pos + len("<function="):close]
    if name not in tools.params:
        raise _Malformed
    properties = tools.params[name].get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    args: dict[str, Any] = {}
    pos = close + 1
    while True:
        pos = _skip_ws(text, pos)
        if text.startswith("</function>", pos):
            return tools.call(name, args), pos + len("</function>")
        if not text.startswith("<parameter=", pos):
            raise _Malformed
        close = text.find(">", pos)
        end = text.find("</parameter>", close) if close >= 0 else -1
        if end < 0:
            raise _Malformed
        param = text[pos + len("<parameter="):close]
        raw = text[close + 1:end]
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        args[param] = _xml_value(raw, properties.get(param))
        pos = end + len("</parameter>")


def _qwen3_coder_block(text: str, pos: int, marker: str, tools: _Tools) -> tuple[ToolCall, int]:
    if marker != "<tool_call>":  # a bare <function=...>: the closing </tool_call> may be there or not
        call, end = _qwen3_coder_function(text, pos, tools)
        after = _skip_ws(text, end)
        return call, (after + len("</tool_call>") if text.startswith("</tool_call>", after) else end)
    start = _skip_ws(text, pos + len(marker))
    if not text.startswith("<function=", start):
        raise _Malformed
    call, end = _qwen3_coder_function(text, start, tools)
    end = _skip_ws(text, end)
    if not text.startswith("</tool_call>", end):
        raise _Malformed
    return call, end + len("</tool_call>")


def _parse_blocks(text: str, fmt: str, tools: _Tools) -> ParsedAnswer:
    """hermes, generic and qwen3_coder: blocks anywhere, text between them."""
    markers = _markers(fmt, tools)
    pieces: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while (found := _find_marker(text, markers, pos)) is not None:
        at, marker = found
        pieces.append(text[pos:at])
        if fmt == "qwen3_coder":
            call, pos = _qwen3_coder_block(text, at, marker, tools)
        else:
            call, pos = _hermes_block(text, at + len(marker), tools)
        calls.append(call)
    pieces.append(text[pos:])
    return ParsedAnswer(_pieces(pieces), tuple(calls))


def _mistral_calls(text: str, pos: int, tools: _Tools) -> tuple[list[ToolCall], int]:
    """What follows one ``[TOOL_CALLS]``: a JSON list or object of calls, or ``name[CALL_ID]id[ARGS]{...}``."""
    pos = _skip_ws(text, pos)
    if text.startswith(("[", "{"), pos):
        value, end = _decode_at(text, pos)
        items = value if isinstance(value, list) else [value]
        if not items:
            raise _Malformed
        return [tools.from_object(item, "arguments", "parameters") for item in items], end
    args_at = text.find("[ARGS]", pos)
    if args_at < 0:
        raise _Malformed
    head = text[pos:args_at]
    name = head.split("[CALL_ID]", 1)[0].strip()
    value, end = _decode_at(text, _skip_ws(text, args_at + len("[ARGS]")))
    return [tools.call(name, value)], end


def _parse_mistral(text: str, tools: _Tools) -> ParsedAnswer:
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return ParsedAnswer(text.strip(), ())
    calls: list[ToolCall] = []
    pos = at
    while text.startswith("[TOOL_CALLS]", pos):
        found, pos = _mistral_calls(text, pos + len("[TOOL_CALLS]"), tools)
        calls += found
        pos = _skip_ws(text, pos)
    if pos < len(text):
        raise _Malformed
    return ParsedAnswer(text[:at].strip(), tuple(calls))


_OPENERS = (("{", '"name"', ":"), ("{", '"type"', ":", '"function"', ",", '"name"', ":"))
_FULL, _PARTIAL, _NO = 2, 1, 0


def _opener(text: str, pos: int) -> int:
    """Whether ``text[pos:]`` opens a Llama 3 JSON call: _FULL, _PARTIAL (it may, once more text comes) or _NO."""
    best = _NO
    for tokens in _OPENERS:
        i, state = pos, _FULL
        for token in tokens:
            i = _skip_ws(text, i) if token != "{" else i
            if i == len(text):
                state = _PARTIAL
                break
            if text.startswith(token, i):
                i += len(token)
                continue
            rest = text[i:]
            state = _PARTIAL if len(rest) < len(token) and token.startswith(rest) else _NO
            break
        best = max(best, state)
    return best


def _llama3_calls(text: str, pos: int, tools: _Tools) -> list[ToolCall]:
    calls: list[ToolCall] = []
    while True:
        while pos < len(text) and (text[pos] in _WS or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            break
        if text.startswith("<|python_tag|>", pos):
            pos += len("<|python_tag|>")
            continue
        if text[pos] != "{":
            raise _Malformed
        value, pos = _decode_at(text, pos)
        calls.append(tools.from_object(value, "parameters", "arguments"))
    if not calls:
        raise _Malformed
    return calls


def _parse_llama3(text: str, tools: _Tools) -> ParsedAnswer:
    start = _skip_ws(text, 0)
    if start < len(text) and _opener(text, start) == _FULL:
        return ParsedAnswer("", tuple(_llama3_calls(text, start, tools)))
    at = text.find("<|python_tag|>")
    if at < 0:
        return ParsedAnswer(text.strip(), ())
    return ParsedAnswer(text[:at].strip(), tuple(_llama3_calls(text, at + len("<|python_tag|>"), tools)))


# --- gpt-oss (harmony) ------------------------------------------------------------------------------------------

_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_MESSAGE = "<|message|>"
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>([A-Za-z0-9_-]+)")


def _harmony_kind(header: str) -> tuple[str, str]:
    """("call", name) for a call to a function, ("other", recipient) for any other recipient, ("content", "")
    for the final and commentary channels, ("reasoning", "") for the analysis channel."""
    recipient = _RECIPIENT.search(header)
    if recipient is not None and recipient.group(1) != "assistant":
        target = recipient.group(1)
        return ("call", target[len("functions."):]) if target.startswith("functions.") else ("other", target)
    channel = _CHANNEL.search(header)
    return ("reasoning", "") if channel is not None and channel.group(1) == "analysis" else ("content", "")


def _after(found: tuple[int, str]) -> int:
    """Where the next message starts after a body's end marker (``<|start|>`` belongs to that message)."""
    at, marker = found
    return at if marker == "<|start|>" else at + len(marker)


def _header_start(rest: str) -> bool:
    """Whether text after the last message is the start of another one's header (cut short), not content."""
    head = rest.lstrip()
    return any(head.startswith(m) or m.startswith(head) for m in ("<|start|>", "<|channel|>", "to="))


def _parse_gpt_oss(text: str, tools: _Tools) -> ParsedAnswer:
    if _MESSAGE not in text:  # no harmony messages at all: plain text
        return ParsedAnswer(text.strip(), ())
    pieces: list[str] = []
    calls: list[ToolCall] = []
    first_call = -1  # where the first call's message starts: from there on, a malformed call makes it all text
    pos = 0
    try:
        while pos < len(text):
            m = text.find(_MESSAGE, pos)
            if m < 0:
                rest = text[pos:]
                if "to=functions." in rest:  # a call cut short
                    first_call = pos if first_call < 0 else first_call
                    raise _Malformed
                if not _header_start(rest):
                    pieces.append(rest)
                break
            kind, name = _harmony_kind(text[pos:m])
            found = _find_marker(text, _HARMONY_ENDS, m + len(_MESSAGE))
            body = text[m + len(_MESSAGE):found[0] if found is not None else len(text)]
            if kind in ("call", "other"):
                first_call = pos if first_call < 0 else first_call
                if kind == "other":  # a built-in tool (browser, python): not one the request offered
                    raise _Malformed
                calls.append(tools.call(name, _loads(body.strip())))
            elif kind == "content":
                pieces.append(body)
            pos = _after(found) if found is not None else len(text)
    except (_Malformed, ValueError):
        before = _parse_gpt_oss(text[:first_call], tools).content if first_call > 0 else ""
        return ParsedAnswer(_pieces([before, text[max(first_call, 0):]]), ())
    return ParsedAnswer(_pieces(pieces), tuple(calls))


def parse_answer(text: str, fmt: str, tools: Sequence[Mapping[str, Any]]) -> ParsedAnswer:
    """The calls in a model's answer and the text outside them. Never raises: an answer whose calls do not read
    cleanly is all text, with no calls."""
    index = _Tools(tools)
    try:
        if fmt == "gpt_oss":
            return _parse_gpt_oss(text, index)
        if fmt == "mistral":
            return _parse_mistral(text, index)
        if fmt == "llama3":
            return _parse_llama3(text, index)
        return _parse_blocks(text, fmt if fmt in FORMATS else "generic", index)
    except (_Malformed, ValueError):
        return ParsedAnswer(text.strip(), ())


# --- streaming --------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _prefixes(markers: tuple[str, ...]) -> tuple[frozenset[str], int]:
    """Every proper start of the markers, and the longest of them."""
    starts = frozenset(m[:size] for m in markers for size in range(1, len(m)))
    return starts, max((len(p) for p in starts), default=0)


def _partial_suffix(text: str, start: int, markers: tuple[str, ...]) -> int:
    """The earliest index from ``start`` where the rest of ``text`` is the start of a marker; len(text) if none."""
    starts, longest = _prefixes(markers)
    for at in range(max(start, len(text) - longest), len(text)):
        if text[at:] in starts:
            return at
    return len(text)


class ToolCallStream:
    """An ``auto`` answer read as it streams: :meth:`feed` gives the content safe to send now, holding back what
    may be the start of a call (as a stop-sequence matcher does) and everything once a call has started;
    :meth:`finish` gives the content not yet sent and the calls. What is sent is always the start of what
    :func:`parse_answer` gives as content for the whole answer.

    Only the part not yet settled is kept for reading (``_buf``; positions are in it), so a long answer costs
    each piece once, not the whole text again."""

    def __init__(self, fmt: str, tools: Sequence[Mapping[str, Any]]) -> None:
        self.fmt = fmt if fmt in FORMATS else "generic"
        self.tools = list(tools)
        self._markers = _markers(self.fmt, _Tools(tools))
        self._parts: list[str] = []  # the whole answer, for finish
        self._buf = ""
        self._sent: list[str] = []
        self._pos = 0  # the buffer's text before this is settled: sent or dropped (gpt-oss: the message's start)
        self._held = False  # a call has started: nothing more goes out before finish
        self._opening = self.fmt == "llama3"  # a Llama 3 answer may open with a bare JSON call
        self._body = -1  # gpt-oss: where the current message's body starts, or -1 between messages
        self._emit = 0  # gpt-oss: how far into the body the content went out
        self._shown = False  # gpt-oss: some of the current body went out
        self._reasoning = False  # gpt-oss: the current body is the analysis channel's
        self._scan = 0  # gpt-oss: no marker of the current message starts before this, less a marker's length

    def feed(self, text: str) -> str:
        self._parts.append(text)
        if self._held or not text:
            return ""
        self._buf += text
        out = self._feed_harmony() if self.fmt == "gpt_oss" else self._feed_markers()
        if out:
            self._sent.append(out)
        self._trim()
        return out

    def _trim(self) -> None:
        if self._held:
            self._buf = ""
            return
        if self.fmt != "gpt_oss":
            cut = self._pos
        elif self._body < 0:
            cut = min(self._pos, max(0, self._scan - len(_MESSAGE)))
        else:
            cut = min(self._emit, max(0, self._scan - 10))
        if cut > 0:
            self._buf = self._buf[cut:]
            self._pos -= cut
            self._scan = max(0, self._scan - cut)
            self._emit -= cut
            self._body = max(0, self._body - cut) if self._body >= 0 else -1

    def _take(self, start: int, end: int, first: bool) -> tuple[str, int]:
        """The text from ``start`` to ``end`` to send now and where it stops: white space at the start of a piece
        of content is dropped for good (content is stripped), white space at its end waits for what follows."""
        segment = self._buf[start:end]
        if first:
            kept = segment.lstrip()
            start += len(segment) - len(kept)
            segment = kept
        out = segment.rstrip()
        return out, start + len(out)

    def _feed_markers(self) -> str:
        buf = self._buf
        if self._opening:
            start = _skip_ws(buf, self._pos)
            if start == len(buf):
                return ""
            state = _opener(buf, start) if buf[start] == "{" else _NO
            if state != _NO:
                self._held = state == _FULL
                return ""
            self._opening = False
        found = _find_marker(buf, self._markers, self._pos)
        end = found[0] if found is not None else _partial_suffix(buf, self._pos, self._markers)
        out, self._pos = self._take(self._pos, end, not self._sent)
        self._held = found is not None
        return out

    def _feed_harmony(self) -> str:
        buf = self._buf
        out: list[str] = []
        while not self._held:
            if self._body < 0:
                m = buf.find(_MESSAGE, max(self._pos, self._scan - len(_MESSAGE)))
                if m < 0:
                    self._scan = len(buf)
                    break
                kind, _ = _harmony_kind(buf[self._pos:m])
                if kind in ("call", "other"):
                    self._held = True
                    break
                self._body = self._emit = self._scan = m + len(_MESSAGE)
                self._shown, self._reasoning = False, kind == "reasoning"
            found = _find_marker(buf, _HARMONY_ENDS, max(self._body, self._scan - 10))
            end = found[0] if found is not None else _partial_suffix(buf, self._scan, _HARMONY_ENDS)
            self._scan = end
            if self._reasoning:
                self._emit = end  # never shown: nothing of it needs keeping
            else:
                piece, self._emit = self._take(self._emit, end, not self._shown)
                if piece:
                    out.append(("\n" if not self._shown and (self._sent or out) else "") + piece)
                    self._shown = True
            if found is None:
                break
            self._pos = self._scan = _after(found)
            self._body = -1
        return "".join(out)

    def finish(self) -> ParsedAnswer:
        whole = parse_answer("".join(self._parts), self.fmt, self.tools)
        sent = "".join(self._sent)
        if whole.content.startswith(sent):
            return ParsedAnswer(whole.content[len(sent):], whole.calls)
        return whole  # not reached: what was sent is where the whole answer's content starts


# --- forced calls -----------------------------------------------------------------------------------------------

_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})  # their values are data, not schemas
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    params = _function(tool).get("parameters")
    return dict(params) if isinstance(params, Mapping) and params else dict(_NO_PARAMETERS)


def _rebase(schema: Any, prefix: str) -> Any:
    """A schema moved under ``prefix`` (a JSON pointer): its local references follow it."""
    if isinstance(schema, list):
        return [_rebase(item, prefix) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = "#" + prefix + value[1:]
        elif key in _DATA_KEYS:
            out[key] = value
        else:
            out[key] = _rebase(value, prefix)
    return out


def forced_schema(tools: Sequence[Mapping[str, Any]], choice: str | None, parallel: bool) -> dict[str, Any]:
    """The JSON schema a forced answer is held to (vLLM's way): for a named function, its parameters (the answer
    is the arguments object); for ``required``, a list of ``{"name", "arguments"}`` calls, one unless
    ``parallel``."""
    if choice not in (None, "auto", "none", "required"):
        for tool in tools:
            if _function(tool).get("name") == choice:
                return _parameters(tool)
        raise ValueError(f"no tool is named {choice!r}")
    options = []
    for i, tool in enumerate(tools):
        params = _rebase(_parameters(tool), f"/items/anyOf/{i}/properties/arguments")
        options.append({
            "type": "object",
            "properties": {"name": {"const": _function(tool).get("name")}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": options}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def parse_forced(text: str, tools: Sequence[Mapping[str, Any]], choice: str | None) -> tuple[ToolCall, ...]:
    """The calls in an answer held to :func:`forced_schema`; ValueError when it is not complete (cut short)."""
    index = _Tools(tools)
    value = _loads(text.strip())
    try:
        if choice not in (None, "auto", "none", "required"):
            return (index.call(choice, value),)
        if not isinstance(value, list) or not value:
            raise _Malformed
        return tuple(index.from_object(item, "arguments") for item in value)
    except _Malformed:
        raise ValueError("the answer is not the forced call") from None
