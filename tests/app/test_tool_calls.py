"""Tool calls in each family's format (app.engine.tool_calls) and OpenAI's request side (app.serve.tools).

The templates in tests/data/templates are real ones, copied unchanged from llama.cpp's ``models/templates``
(the copy llama-cpp-python 0.3.36 vendors). Rendered through the project's sandboxed renderer with a tool-call
history, each shows how its model writes a call; reading that text back gives the same calls (a round trip),
so the parsers read what the templates themselves teach. The other answers are written in the exact formats
llama.cpp's ``tests/test-chat.cpp`` feeds its parsers.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from app.engine import tool_calls as tc
from app.engine.chat_template import render_in_process
from app.engine.schema_limits import check_schema, schema_grammar
from app.engine.tool_calls import ParsedAnswer, ToolCall, ToolCallStream
from app.serve.api_error import ApiError
from app.serve.tools import (
    ARGUMENTS_FRAGMENT,
    ToolRequest,
    parse_message_tools,
    parse_tools,
    tool_call_deltas,
    tool_call_json,
)

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
FORMAT_OF = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "openai-gpt-oss-120b.jinja": "gpt_oss",
}
NO_TOOLS = ("microsoft-Phi-3.5-mini-instruct.jinja", "google-gemma-2-2b-it.jinja")
# Llama 3.x templates refuse more than one call per turn; gpt-oss's renders only the first.
ONE_CALL = ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "openai-gpt-oss-120b.jinja")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
        "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}
PYTHON = {"type": "function", "function": {
    "name": "python", "description": "Run Python code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
TOOLS = [WEATHER, ADD, PYTHON]
WEATHER_ARGS = {"city": "42nd Street", "days": 3, "metric": True}
ADD_ARGS = {"a": 2, "b": 0.5}


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def call_message(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for call_id, name, args in calls]}


def history(parallel: bool) -> list[dict[str, Any]]:
    calls = [("call_one", "get_weather", WEATHER_ARGS)] + ([("call_two", "add", ADD_ARGS)] if parallel else [])
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris, and 2 + 0.5?"},
        call_message(*calls),
        *({"role": "tool", "tool_call_id": call_id, "content": f"result of {name}"} for call_id, name, _ in calls),
    ]


def render(name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    return render_in_process(template(name), tc.template_messages(messages),
                             extra_context={"tools": tools} if tools is not None else None,
                             bos_token="<s>", eos_token="</s>")


def assistant_part(name: str, rendered: str) -> str:
    """The text the model wrote for the assistant turn with the calls, as it would generate it."""
    fmt = FORMAT_OF[name]
    if fmt == "llama3":
        return rendered.split("<|start_header_id|>assistant<|end_header_id|>\n\n")[-2].split("<|eot_id|>")[0]
    if fmt == "mistral":
        return rendered[rendered.index("[TOOL_CALLS]"):].split("</s>")[0]
    if fmt == "gpt_oss":  # the prompt ends with "<|start|>assistant": the answer starts after it
        at = rendered.index("<|start|>assistant to=functions.") + len("<|start|>assistant")
        return rendered[at:rendered.index("<|call|>", at) + len("<|call|>")]
    return rendered.split("<|im_start|>assistant")[-2].split("<|im_end|>")[0]


def calls_of(answer: ParsedAnswer) -> list[tuple[str, Any]]:
    return [(call.name, json.loads(call.arguments)) for call in answer.calls]


# --- the templates ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*FORMAT_OF, *NO_TOOLS])
def test_each_template_is_recognised_by_its_format(name: str) -> None:
    assert tc.detect_format(template(name)) == FORMAT_OF.get(name, "generic")


def test_no_template_reads_as_generic() -> None:
    assert tc.detect_format(None) == "generic"
    assert tc.detect_format("") == "generic"


@pytest.mark.parametrize("name", FORMAT_OF)
def test_tool_templates_show_the_tools_and_take_a_call_history(name: str) -> None:
    parallel = name not in ONE_CALL
    rendered = render(name, history(parallel), TOOLS)
    assert tc.template_renders_tools(rendered, TOOLS)
    assert "result of get_weather" in rendered
    assert ("result of add" in rendered) == parallel
    assert not tc.template_renders_tools(render(name, history(parallel)), TOOLS)  # without tools= : none shown


@pytest.mark.parametrize("name", NO_TOOLS)
def test_a_template_without_tool_support_does_not_show_them(name: str) -> None:
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    assert not tc.template_renders_tools(render(name, ask, TOOLS), TOOLS)


def test_a_name_inside_another_word_does_not_count_as_shown() -> None:
    assert not tc.template_renders_tools("please readd the numbers", [ADD])
    assert tc.template_renders_tools('{"name": "add"}', [ADD])


@pytest.mark.parametrize("name", FORMAT_OF)
def test_a_rendered_call_turn_reads_back_as_the_same_calls(name: str) -> None:
    parallel = name not in ONE_CALL
    answer = tc.parse_answer(assistant_part(name, render(name, history(parallel), TOOLS)), FORMAT_OF[name], TOOLS)
    expected = [("get_weather", WEATHER_ARGS)] + ([("add", ADD_ARGS)] if parallel else [])
    assert calls_of(answer) == expected
    assert answer.content == ""
    assert all(call.id.startswith("call_") for call in answer.calls)
    assert len({call.id for call in answer.calls}) == len(answer.calls)


def test_template_messages_give_mappings_and_ids_mistral_takes() -> None:
    messages = tc.template_messages(history(parallel=True))
    calls = messages[2]["tool_calls"]
    assert calls[0]["function"]["arguments"] == WEATHER_ARGS
    ids = [call["id"] for call in calls]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
    assert [m["tool_call_id"] for m in messages[3:]] == ids  # each result keeps its call's id
    assert tc.template_messages([{"role": "assistant", "content": "x", "tool_calls": []}]) == [
        {"role": "assistant", "content": "x"}]  # Llama 3.1 tests `'tool_calls' in message`
    kept = tc.template_messages([call_message(("abcdefghi", "add", ADD_ARGS))])
    assert kept[0]["tool_calls"][0]["id"] == "abcdefghi"


# --- each family's own format -----------------------------------------------------------------------------------

W = '{"city": "Paris"}'
CASES: list[tuple[str, str, str, list[tuple[str, Any]]]] = [
    # (format, the model's text, content, calls)
    ("hermes", f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>', "",
     [("get_weather", {"city": "Paris"})]),
    ("hermes", f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>\n'
               '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "Let me check.",
     [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]),
    ("hermes", '<tool_call>{"name": "python", "arguments": {"code": "print(\\"</tool_call>\\")"}}</tool_call>', "",
     [("python", {"code": 'print("</tool_call>")'})]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>', "",
     [("add", {"a": 1, "b": 2})]),
    ("hermes", "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("generic", f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>', "",
     [("get_weather", {"city": "Paris"})]),
    ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n"
                    "</function>\n</tool_call>", "", [("add", {"a": 1, "b": 2.5})]),
    ("qwen3_coder", "I will run it.\n<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n"
                    "    print(\"Hello, world!\")\n\nhello()\n</parameter>\n</function>\n</tool_call>",
     "I will run it.", [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n<parameter=metric>\n"
                    "false\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=python>\n"
                    "<parameter=code>\n#include\n\n</parameter>\n</function>\n</tool_call>", "",
     [("get_weather", {"city": "1984", "metric": False}), ("python", {"code": "#include\n"})]),
    ("qwen3_coder", "<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>\n"
                    "</tool_call>", "", [("add", {"a": 1, "b": 2})]),  # Qwen3-Coder sometimes drops <tool_call>
    ("qwen3_coder", "#include <functional>\nint main() {}", "#include <functional>\nint main() {}", []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", {"city": "Paris"})]),
    ("llama3", '{"type": "function", "name": "add", "parameters": {"a": 1, "b": 2}}; '
               '{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Paris"})]),
    ("llama3", 'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}\n'
               '{"name": "add", "arguments": {"a": 1, "b": 2}}', "Checking.",
     [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3", "Paris is sunny.", "Paris is sunny.", []),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "123456789"}]', "",
     [("add", {"a": 1, "b": 2})]),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
                '{"name": "get_weather", "arguments": {"city": "Paris"}}]', "",
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS]add[CALL_ID]000000001[ARGS]{"a": 1, "b": 2}'
                '[TOOL_CALLS]get_weather[CALL_ID]000000002[ARGS]{"city": "Paris"}', "",
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Paris"})]),
    ("mistral", 'Hello, world!\nWhat\'s up?[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', "Hello, world!\nWhat's up?",
     [("add", {"a": 1, "b": 2})]),
    ("gpt_oss", "<|channel|>final<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("gpt_oss", "<|channel|>commentary<|message|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("gpt_oss", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
                "Hello, world!\nWhat's up?<|return|>", "Hello, world!\nWhat's up?", []),
    ("gpt_oss", ' to=functions.add<|channel|>analysis<|message|>{"a": 1, "b": 2}', "", [("add", {"a": 1, "b": 2})]),
    ("gpt_oss", '<|channel|>analysis to=functions.add<|message|>{"a": 1, "b": 2}', "", [("add", {"a": 1, "b": 2})]),
    ("gpt_oss", ' to=functions.add<|channel|>analysis <|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>', "",
     [("add", {"a": 1, "b": 2})]),
    ("gpt_oss", "<|channel|>analysis<|message|>Thinking about it...<|end|><|start|>assistant<|channel|>commentary"
                '<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather '
                '<|constrain|>json<|message|>{"city": "Paris"}<|call|>', "Let me look.",
     [("get_weather", {"city": "Paris"})]),
    ("gpt_oss", "Plain text, no channels.", "Plain text, no channels.", []),
]
MALFORMED: list[tuple[str, str]] = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),  # cut short
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'),  # never closed
    ("hermes", 'Sure.\n<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'),  # not offered
    ("hermes", '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>'),  # arguments not an object
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": NaN}}\n</tool_call>'),  # not JSON
    ("hermes", '<tool_call>\n' + "[" * 100_000 + '\n</tool_call>'),  # too deep to read
    ("generic", '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call> and <tool_call> oops'),
    ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\nnot a number\n</parameter>\n</function>\n"
                    "</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=nope>\n</function>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}} and then some words'),
    ("llama3", '{"name": "weather", "parameters": {"city": "Paris"}}'),
    ("llama3", 'Ok<|python_tag|>brave_search.call(query="weather")'),  # a built-in tool
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}'),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1} trailing words'),
    ("mistral", "[TOOL_CALLS]add"),
    ("gpt_oss", ' to=functions.add<|channel|>commentary json<|message|>{"a": 1'),
]
# gpt-oss: the messages before the first call read as usual (the analysis channel is not content), and the
# text from the call's message on comes back as it is.
HARMONY_MALFORMED: list[tuple[str, str, str]] = [
    ('<|channel|>commentary<|message|>Let me look.<|end|>', '<|start|>assistant<|channel|>commentary '
     'to=functions.get_weather <|constrain|>json<|message|>{"city": ', "Let me look."),
    ("<|channel|>analysis<|message|>Run it.<|end|>", "<|start|>assistant<|channel|>commentary to=python "
     '<|constrain|>code<|message|>print("hello")', ""),  # a built-in tool the request did not offer
    ("<|channel|>final<|message|>Hi<|end|>", "<|start|>assistant to=functions.add<|channel|>commen", "Hi"),
    ("<|channel|>final<|message|>Hi<|end|>", '<|start|>assistant to=functions.add<|channel|>commentary<|message|>'
     '{"a": 1}<|call|><|start|>assistant to=functions.nope<|channel|>commentary<|message|>{}', "Hi"),  # all or none
]
MALFORMED += [("gpt_oss", before + rest) for before, rest, _ in HARMONY_MALFORMED]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_each_format_reads_its_calls_and_content(fmt: str, text: str, content: str, calls: list[Any]) -> None:
    answer = tc.parse_answer(text, fmt, TOOLS)
    assert answer.content == content
    assert calls_of(answer) == calls
    for call in answer.calls:  # compact JSON of an object
        assert call.arguments == json.dumps(json.loads(call.arguments), separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_a_malformed_call_is_text(fmt: str, text: str) -> None:
    expected = {before + rest: "\n".join(p for p in (content, rest.strip()) if p)
                for before, rest, content in HARMONY_MALFORMED}
    answer = tc.parse_answer(text, fmt, TOOLS)
    assert answer.calls == ()
    assert answer.content == expected.get(text, text.strip())


def test_an_unknown_format_reads_as_generic() -> None:
    assert calls_of(tc.parse_answer(CASES[0][1], "nonsense", TOOLS)) == CASES[0][3]


def test_a_lone_surrogate_in_arguments_stays_an_escape() -> None:
    answer = tc.parse_answer('<tool_call>{"name": "python", "arguments": {"code": "\\ud800"}}</tool_call>', "hermes",
                             TOOLS)
    assert answer.calls[0].arguments == '{"code":"\\ud800"}'
    answer.calls[0].arguments.encode("utf-8")


# --- streaming --------------------------------------------------------------------------------------------------

MARKERS = ("<tool_call>", "</tool_call>", "<function=", "<parameter=", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>",
           "<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>", "<|constrain|>", "to=functions")


def stream(fmt: str, pieces: list[str]) -> tuple[list[str], ParsedAnswer]:
    reader = ToolCallStream(fmt, TOOLS)
    sent = [reader.feed(piece) for piece in pieces]
    return [s for s in sent if s], reader.finish()


@pytest.mark.parametrize(("fmt", "text"), [(c[0], c[1]) for c in CASES] + MALFORMED)
@pytest.mark.parametrize("steps", ["one", "seven", "random"])
def test_a_stream_gives_what_the_whole_answer_gives(fmt: str, text: str, steps: str) -> None:
    if steps == "random":  # the pieces tokens make: of any size, cutting markers anywhere
        rng = random.Random(len(text))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, max(1, len(text) // 4))))
        pieces = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
    else:
        size = 1 if steps == "one" else 7
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
    sent, end = stream(fmt, pieces)
    whole = tc.parse_answer(text, fmt, TOOLS)
    assert "".join(sent) + end.content == whole.content
    assert calls_of(end) == calls_of(whole)
    if whole.calls:  # what went out before the end is plain content: no piece of a call's markup
        for marker in MARKERS:
            assert marker not in "".join(sent)


def test_a_stream_sends_content_as_it_comes_and_holds_a_call() -> None:
    reader = ToolCallStream("hermes", TOOLS)
    assert reader.feed("Let me ") == "Let me"  # the space waits for what follows it
    assert reader.feed("check.\n<tool") == " check."
    assert reader.feed("_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>") == ""
    end = reader.finish()
    assert end.content == ""
    assert calls_of(end) == [("add", {"a": 1, "b": 2})]


def test_a_stream_lets_a_lookalike_of_a_marker_through() -> None:
    reader = ToolCallStream("hermes", TOOLS)
    assert reader.feed("a <tool") == "a"
    assert reader.feed("box> b") == " <toolbox> b"
    assert reader.finish() == ParsedAnswer("", ())


def test_a_gpt_oss_stream_sends_the_final_channel_as_it_comes() -> None:
    reader = ToolCallStream("gpt_oss", TOOLS)
    assert reader.feed("<|channel|>analysis<|message|>Let me think.") == ""  # reasoning is not content
    assert reader.feed("<|end|><|start|>assistant<|channel|>final<|message|>The weather") == "The weather"
    assert reader.feed(" is fine.<|en") == " is fine."
    assert reader.feed("d|>") == ""
    assert reader.finish() == ParsedAnswer("", ())


def test_a_llama3_stream_holds_an_opening_json_call_only() -> None:
    reader = ToolCallStream("llama3", TOOLS)
    assert reader.feed('{"na') == ""
    assert reader.feed('me": "add", "parameters": {"a": 1, "b": 2}}') == ""
    assert calls_of(reader.finish()) == [("add", {"a": 1, "b": 2})]
    reader = ToolCallStream("llama3", TOOLS)
    assert reader.feed("{") == ""
    assert reader.feed('"x": 1}') == '{"x": 1}'


# --- the fallback for templates without tools -------------------------------------------------------------------

def test_tools_as_text_for_a_template_without_them() -> None:
    text = tc.tools_system_text(TOOLS)
    for tool in TOOLS:
        function = tool["function"]
        assert json.dumps(function["parameters"]) in text
        assert function["description"] in text
    assert "<tool_call>" in text
    plain = tc.plain_history(history(parallel=True))
    assert all(set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values()) for m in plain)
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user"]  # results share one user turn
    assert plain[3]["content"] == ("<tool_response>\nresult of get_weather\n</tool_response>\n"
                                   "<tool_response>\nresult of add\n</tool_response>")
    # the calls are written in the format the text asks for, so the model sees its own calls that way
    assert calls_of(tc.parse_answer(plain[2]["content"], "generic", TOOLS)) == [
        ("get_weather", WEATHER_ARGS), ("add", ADD_ARGS)]
    messages = [{"role": "system", "content": text}, *plain[1:]]
    rendered = render("microsoft-Phi-3.5-mini-instruct.jinja", messages)
    assert tc.template_renders_tools(rendered, TOOLS)
    assert "result of add" in rendered


def test_plain_history_keeps_alternating_roles() -> None:
    messages = [*history(parallel=False)[1:], {"role": "user", "content": "Thanks; and tomorrow?"}]
    plain = tc.plain_history(messages)
    assert [m["role"] for m in plain] == ["user", "assistant", "user"]
    assert plain[2]["content"].endswith("</tool_response>\n\nThanks; and tomorrow?")
    gemma = render("google-gemma-2-2b-it.jinja", plain)  # refuses turns that do not alternate
    assert "Thanks; and tomorrow?" in gemma


# --- forced calls -----------------------------------------------------------------------------------------------

def test_a_named_forced_call_is_its_arguments() -> None:
    schema = tc.forced_schema(TOOLS, "add", parallel=True)
    assert schema == ADD["function"]["parameters"]
    check_schema(schema)
    (call,) = tc.parse_forced(' {"a": 1, "b": 2.5}\n', TOOLS, "add")
    assert (call.name, call.arguments) == ("add", '{"a":1,"b":2.5}')
    assert tc.forced_schema([{"type": "function", "function": {"name": "ping"}}], "ping", True) == {
        "type": "object", "properties": {}}


@pytest.mark.parametrize("parallel", [False, True])
def test_a_required_call_is_a_list_of_calls(parallel: bool) -> None:
    schema = tc.forced_schema(TOOLS, "required", parallel)
    assert schema["type"] == "array"
    assert schema["minItems"] == 1
    assert schema.get("maxItems") == (None if parallel else 1)
    options = schema["items"]["anyOf"]
    assert [o["properties"]["name"] for o in options] == [{"const": t["function"]["name"]} for t in TOOLS]
    assert all(o["required"] == ["name", "arguments"] and o["additionalProperties"] is False for o in options)
    check_schema(schema)
    schema_grammar(json.dumps(schema))
    text = json.dumps([{"name": "add", "arguments": ADD_ARGS}, {"name": "get_weather", "arguments": WEATHER_ARGS}])
    assert calls_of(ParsedAnswer("", tc.parse_forced(text, TOOLS, "required"))) == [
        ("add", ADD_ARGS), ("get_weather", WEATHER_ARGS)]


def test_references_inside_a_tool_follow_it_into_the_required_schema() -> None:
    tool = {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"to": {"$ref": "#/$defs/point"}}, "required": ["to"],
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}}}
    schema = tc.forced_schema([ADD, tool], "required", parallel=False)
    assert schema["items"]["anyOf"][1]["properties"]["arguments"]["properties"]["to"] == {
        "$ref": "#/items/anyOf/1/properties/arguments/$defs/point"}
    checked = check_schema(schema)
    assert checked.refs  # the reference resolves in the moved schema
    assert "point" in schema_grammar(json.dumps(schema)) or "::=" in schema_grammar(json.dumps(schema))


@pytest.mark.parametrize(("text", "choice"), [
    ('{"a": 1', "add"), ("[1, 2]", "add"), ("[]", "required"), ('[{"name": "nope", "arguments": {}}]', "required"),
    ('{"name": "add", "arguments": {}}', "required"), ("", "required")])
def test_a_forced_answer_cut_short_is_refused(text: str, choice: str) -> None:
    with pytest.raises(ValueError, match=r"\w"):
        tc.parse_forced(text, TOOLS, choice)


# --- the request side -------------------------------------------------------------------------------------------

def test_tools_are_checked_into_the_template_shape() -> None:
    request = parse_tools({"tools": [WEATHER, {"type": "function", "function": {"name": "ping"}}],
                           "parallel_tool_calls": False})
    assert request == ToolRequest(tools=(
        WEATHER, {"type": "function", "function": {"name": "ping", "description": "",
                                                   "parameters": {"type": "object", "properties": {}}}}),
        choice="auto", parallel=False)
    assert parse_tools({}) is None
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}) is None
    assert parse_tools({"tool_choice": "auto"}) is None
    named = parse_tools({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}})
    assert named is not None
    assert named.choice == "add"
    assert parse_tools({"tools": [WEATHER], "tool_choice": "required"}) == ToolRequest((WEATHER,), "required", True)


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def with_parameters(parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "hostile", "parameters": parameters}}


@pytest.mark.parametrize(("body", "words"), [
    ({"tools": {"a": 1}}, "must be a list"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "function tools only"),
    ({"tools": [{"type": "function"}]}, "'tools[0].function' must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "'get weather'; a name is 1 to 64"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "1 to 64"),
    ({"tools": [{"type": "function", "function": {"name": "a", "description": 3}}]}, "description' must be a string"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]}, "JSON Schema object"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}]},
     "must describe an object"),
    ({"tools": [WEATHER, WEATHER]}, "'get_weather' is given twice"),
    ({"tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(129)]}, "at most 128"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
     "'add', which is not in 'tools'"),
    ({"tools": [WEATHER], "tool_choice": "get_weather"}, "it takes auto, none, required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools"}}, "'allowed_tools' is not one"),
    ({"tool_choice": "required"}, "needs 'tools'"),
    ({"tools": [{"type": "function", "function": {"name": "auto"}}],
      "tool_choice": {"type": "function", "function": {"name": "auto"}}}, "cannot be chosen by name"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "'parallel_tool_calls' must be true or false"),
    ({"functions": [{"name": "x"}]}, "'functions' is OpenAI's deprecated function calling"),
    ({"tools": [WEATHER], "function_call": {"name": "get_weather"}}, "send 'tool_choice' instead"),
    ({"tools": [with_parameters(deep_schema(200))], "tool_choice": "required"}, "nested more than 64 deep"),
    ({"tools": [with_parameters({"type": "object", "properties": {
        "x": {"type": "string", "enum": [str(i) for i in range(100_000)]}}})], "tool_choice": "required"},
     "enum has 100000 values"),
    ({"tools": [with_parameters({"type": "object", "properties": {
        "x": {"type": "string", "pattern": "^(a|b)*(c|d)*((e|f)*){1000}$"}}})], "tool_choice": "required"},
     "pattern"),
    ({"tools": [with_parameters({"type": "object", "properties": {"x": {"type": "string", "maxLength": 10**6}}})],
      "tool_choice": {"type": "function", "function": {"name": "hostile"}}}, "maxLength"),
    ({"tools": [with_parameters({"type": "object", "properties": {"x": {"type": "string", "x-custom": 1}}})],
      "tool_choice": "required"}, "the keyword 'x-custom'"),
])
def test_malformed_or_hostile_tools_are_refused_by_name(body: dict[str, Any], words: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_tools(body)
    assert caught.value.status == 400
    assert words in caught.value.message, caught.value.message
    assert caught.value.param in ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


def test_an_unenforceable_keyword_is_only_refused_where_a_grammar_enforces_the_schema() -> None:
    loose = with_parameters({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})
    assert parse_tools({"tools": [loose]}) is not None  # auto: the schema is only shown to the model
    long_string = with_parameters({"type": "object", "properties": {"x": {"type": "string", "maxLength": 10**6}}})
    assert parse_tools({"tools": [long_string]}) is not None
    assert parse_tools({"tools": [loose, ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}})
    with pytest.raises(ApiError, match="'minimum'"):
        parse_tools({"tools": [loose, ADD], "tool_choice": "required"})


def test_the_history_tool_turns_are_checked() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1,  "b": 2}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}
    assert parse_message_tools(message, 2) == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "3"}], "name": "add"}
    assert parse_message_tools(result, 3) == {"role": "tool", "tool_call_id": "call_1", "content": "3", "name": "add"}


@pytest.mark.parametrize(("message", "words"), [
    ({"role": "tool", "content": "3"}, "messages[4].tool_call_id must be a non-empty string"),
    ({"role": "tool", "tool_call_id": "x" * 300, "content": "3"}, "at most 256"),
    ({"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url"}]}, "'image_url' part"),
    ({"role": "tool", "tool_call_id": "c", "content": 3}, "content must be a string or a list of text parts"),
    ({"role": "assistant", "tool_calls": {"id": "c"}}, "messages[4].tool_calls must be a list"),
    ({"role": "assistant", "tool_calls": ["c"]}, "messages[4].tool_calls[0] must be an object"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "a b"}}]},
     "tool_calls[0].function.name"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "a", "arguments": 3}}]},
     "arguments must be a string of JSON"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "a"}}]}, "tool_calls[0].id must be"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "a"}}] * 2}, "uses tool call id 'c' twice"),
    ({"role": "user", "tool_calls": [{"id": "c", "function": {"name": "a"}}]}, "only assistant messages"),
])
def test_malformed_tool_turns_are_refused_naming_the_message(message: dict[str, Any], words: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_message_tools(message, 4)
    assert caught.value.status == 400
    assert words in caught.value.message, caught.value.message
    assert "messages[4]" in caught.value.message


def test_calls_in_openai_shapes() -> None:
    calls = [ToolCall("call_a", "add", '{"a":1,"b":2}'), ToolCall("call_b", "python", json.dumps({"code": "x" * 1600}))]
    assert tool_call_json(calls[0]) == {"id": "call_a", "type": "function",
                                        "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}
    deltas = tool_call_deltas(calls, first_index=1)
    assert deltas[0] == {"index": 1, "id": "call_a", "type": "function", "function": {"name": "add", "arguments": ""}}
    assert [d["index"] for d in deltas if "id" in d] == [1, 2]
    for index, call in enumerate(calls, 1):
        fragments = [d["function"]["arguments"] for d in deltas if d["index"] == index and "id" not in d]
        assert "".join(fragments) == call.arguments
        assert len(fragments) == -(-len(call.arguments) // ARGUMENTS_FRAGMENT)
    assert tc.new_call_id() != tc.new_call_id()
    assert tc.new_call_id().startswith("call_")
