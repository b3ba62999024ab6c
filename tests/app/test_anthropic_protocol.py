"""Anthropic's Messages API wire format (app.serve.anthropic): every conversion and refusal, and the bodies and
event streams it builds read back by the official ``anthropic`` client.

The client is given an HTTP transport that answers in-process (no network): what is tested is that the real
client's parser, not a copy of it, reads these bytes as a Message, its stream and its errors, and that the
bodies the real client sends are ones this module takes. The end-to-end server test is test_serve_anthropic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from app.engine.stops import StopMatcher
from app.serve import protocol
from app.serve.anthropic import (
    ERROR_TYPES,
    MessagesRequest,
    MessageStream,
    count_tokens_body,
    error_body,
    error_type,
    message_body,
    new_message_id,
    new_tool_use_id,
    openai_body,
    parse_count_tokens_request,
    parse_messages_request,
    stop_reason_for,
)
from app.serve.api_error import ApiError
from app.serve.protocol import Limits

LIMITS = Limits(max_tokens=512)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ADD = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def parse(**fields: Any) -> MessagesRequest:
    return parse_messages_request({"model": "tiny", "max_tokens": 16, "messages": ASK, **fields}, LIMITS)


def refusal(match: str, **fields: Any) -> ApiError:
    with pytest.raises(ApiError, match=match) as caught:
        parse(**fields)
    assert caught.value.status == 400
    return caught.value


def turns(*messages: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return parse(messages=list(messages)).messages


def use(call_id: str, name: str = "get_weather", **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def result(call_id: str, content: Any = "21 C", **more: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **more}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- messages -------------------------------------------------------------------------------------


def test_a_plain_request() -> None:
    request = parse(system="Be brief.")
    assert request.messages == ({"role": "system", "content": "Be brief."}, ASK[0])
    assert request.model == "tiny"
    assert request.stream is False
    assert request.stop == ()
    assert request.tools == ()
    assert request.tool_choice is None
    assert request.parallel is True
    assert request.sampling_fields == {"max_tokens": 16}


def test_system_text_blocks_join_and_an_empty_system_is_left_out() -> None:
    blocks = [{"type": "text", "text": "Be brief."},
              {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}]
    assert parse(system=blocks).messages[0] == {"role": "system", "content": "Be brief.\nBe kind."}
    assert parse(system="").messages[0]["role"] == "user"
    assert parse(system=[]).messages[0]["role"] == "user"


def test_text_blocks_join_as_lines_and_consecutive_turns_of_a_role_are_one() -> None:
    assert turns({"role": "user", "content": [{"type": "text", "text": "Hello."}, {"type": "text", "text": "You?"}]},
                 {"role": "user", "content": "Second."}) == ({"role": "user", "content": "Hello.\nYou?\n\nSecond."},)


def test_a_system_turn_in_messages_is_a_system_message() -> None:
    assert turns({"role": "system", "content": [{"type": "text", "text": "Rules."}]}, *ASK)[0] == {
        "role": "system", "content": "Rules."}


def test_a_final_assistant_turn_is_kept_as_a_prefill_and_an_empty_one_dropped() -> None:
    assert turns(*ASK, {"role": "assistant", "content": "It is"})[-1] == {"role": "assistant", "content": "It is"}
    assert turns(*ASK, {"role": "assistant", "content": ""}) == turns(*ASK)
    assert turns(*ASK, {"role": "assistant", "content": []}) == turns(*ASK)


def test_tool_use_becomes_tool_calls_with_compact_arguments() -> None:
    messages = turns(*ASK, {"role": "assistant", "content": [
        {"type": "text", "text": "Looking."}, use("toolu_1", city="Paris", days=[1, 2]), use("toolu_2", "add", a=1)]},
        {"role": "user", "content": [result("toolu_1"), result("toolu_2", "3")]})
    assert messages[1] == {"role": "assistant", "content": "Looking.", "tool_calls": [
        call("toolu_1", "get_weather", '{"city":"Paris","days":[1,2]}'), call("toolu_2", "add", '{"a":1}')]}
    assert turns(*ASK, {"role": "assistant", "content": [use("t", "add", é="ü")]})[1]["tool_calls"][0][
        "function"]["arguments"] == '{"é":"ü"}'


def test_tool_results_become_tool_messages_before_the_turns_text() -> None:
    messages = turns(*ASK, {"role": "assistant", "content": [use("a"), use("b"), use("c"), use("d")]},
                     {"role": "user", "content": [
                         result("a"), result("b", [{"type": "text", "text": "22 C"}, {"type": "text", "text": "dry"}]),
                         {"type": "text", "text": "Thanks."}, result("c", is_error=True, content="timeout"),
                         {"type": "tool_result", "tool_use_id": "d"}]})
    assert messages[2:] == (
        {"role": "tool", "tool_call_id": "a", "content": "21 C"},
        {"role": "tool", "tool_call_id": "b", "content": "22 C\ndry"},
        {"role": "tool", "tool_call_id": "c", "content": "Error: timeout"},
        {"role": "tool", "tool_call_id": "d", "content": ""},
        {"role": "user", "content": "Thanks."},
    )


def test_the_clients_own_dump_of_a_message_is_taken_back() -> None:
    """Blocks carry the client's extra keys (citations, caller: None) when a Message is sent back as history."""
    history = [*ASK, {"role": "assistant", "content": [
        {"type": "text", "text": "Hm.", "citations": None},
        {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}, "caller": None,
         "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [result("toolu_9", cache_control=None, is_error=False)]}]
    assert turns(*history)[1]["tool_calls"] == [call("toolu_9", "get_weather", '{"city":"Oslo"}')]


@pytest.mark.parametrize(("messages", "match"), [
    (None, "'messages' must be a non-empty list"),
    ([], "'messages' must be a non-empty list"),
    ("hi", "'messages' must be a non-empty list"),
    ([ASK[0]] * (protocol.MAX_MESSAGES + 1), "at most 2048"),
    (["hi"], r"messages\[0\] must be an object"),
    ([{"role": "tool", "content": "x"}], r"role 'tool'; the Messages API takes user and assistant"),
    ([{"role": "user"}], r"messages\[0\]\.content must be a string or a list"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\.content must be a string or a list"),
    ([{"role": "user", "content": ["hi"]}], r"messages\[0\]\.content\[0\] must be an object with a 'type'"),
    ([{"role": "user", "content": [{"text": "hi"}]}], r"must be an object with a 'type'"),
    ([{"role": "user", "content": ""}], r"messages\[0\] has empty content"),
    ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "has empty content"),
    ([{"role": "assistant", "content": ""}, *ASK], r"messages\[0\] has empty content"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "without a 'text' string"),
    ([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                "data": "AAAA"}}]}], "is a 'image' block"),
    ([{"role": "user", "content": [{"type": "document", "source": {}}]}], "is a 'document' block"),
    ([*ASK, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}]}],
     "is a 'thinking' block"),
    ([*ASK, {"role": "assistant", "content": [{"type": "redacted_thinking", "data": ""}]}], "'redacted_thinking'"),
    ([{"role": "user", "content": [{"type": "server_tool_use", "id": "s"}]}], "'server_tool_use' block"),
    ([{"role": "user", "content": [use("t")]}], "tool_use block in a user turn; only assistant turns"),
    ([*ASK, {"role": "assistant", "content": [result("t")]}], "tool_result block in an assistant turn"),
    ([{"role": "system", "content": [result("t")]}, *ASK], "tool_result block in a system turn"),
    ([*ASK, {"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]}],
     "without an 'id' and a 'name'"),
    ([*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": "{}"}]}],
     "'input' is not an object"),
    ([*ASK, {"role": "assistant", "content": [use("t")]}, {"role": "user", "content": "And?"}],
     r"messages\[1\] calls tool_use id 't' with no tool_result"),
    ([*ASK, {"role": "assistant", "content": [use("t")]}, {"role": "user", "content": [result("u"), result("t")]}],
     r"messages\[2\]\.content\[0\] answers tool_use_id 'u', which the message before it does not call"),
    ([{"role": "user", "content": [result("t")]}], "answers tool_use_id 't'"),
    ([*ASK, {"role": "assistant", "content": [use("t"), use("t")]}], "uses tool_use id 't' twice"),
    ([*ASK, {"role": "assistant", "content": [use("t")]}, {"role": "user", "content": [{"type": "tool_result"}]}],
     "without a 'tool_use_id'"),
    ([*ASK, {"role": "assistant", "content": [use("t")]}, {"role": "user", "content": [result("t", is_error=1)]}],
     r"content\[0\]\.is_error must be true or false"),
    ([*ASK, {"role": "assistant", "content": [use("t")]}, {"role": "user", "content": [result("t", {"a": 1})]}],
     "must be a string or a list of text blocks"),
    ([*ASK, {"role": "assistant", "content": [use("t")]}, {"role": "user", "content": [result("t", [
        {"type": "image", "source": {}}])]}], r"content\[0\]\.content\[0\] is a 'image' block; this server takes text "
                                               "in tool results only"),
])
def test_bad_messages_are_refused_by_name(messages: Any, match: str) -> None:
    assert refusal(match, messages=messages).param == "messages"


@pytest.mark.parametrize(("system", "match"), [
    (3, "'system' must be a string or a list of text blocks"),
    ([{"type": "image"}], r"system\[0\] is a 'image' block"),
    (["text"], r"system\[0\] is a 'str' block"),
    ([{"type": "text"}], r"system\[0\] is a text block without a 'text' string"),
])
def test_bad_system_prompts_are_refused(system: Any, match: str) -> None:
    assert refusal(match, system=system).param == "system"


# --- tools ----------------------------------------------------------------------------------------


def test_tools_become_openai_function_tools() -> None:
    request = parse(tools=[WEATHER, {**ADD, "type": "custom", "strict": True, "cache_control": {"type": "ephemeral"}}])
    assert request.tools == (
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"],
                                          "description": "The weather in a city."}},
        {"type": "function", "function": {"name": "add", "parameters": ADD["input_schema"], "strict": True}},
    )
    assert request.tool_choice is None
    assert request.parallel is True


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, ("auto", True)),
    ({"type": "any"}, ("required", True)),
    ({"type": "tool", "name": "add"}, ("add", True)),
    ({"type": "none"}, ("none", True)),
    ({"type": "auto", "disable_parallel_tool_use": True}, ("auto", False)),
    ({"type": "any", "disable_parallel_tool_use": True}, ("required", False)),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": False}, ("get_weather", True)),
])
def test_tool_choice_maps_to_openais(choice: dict[str, Any], expected: tuple[str, bool]) -> None:
    request = parse(tools=[WEATHER, ADD], tool_choice=choice)
    assert (request.tool_choice, request.parallel) == expected


@pytest.mark.parametrize(("fields", "match"), [
    ({"tools": {"name": "x"}}, "'tools' must be a list of tools"),
    ({"tools": ["x"]}, r"tools\[0\] must be an object with 'name' and 'input_schema'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     r"tools\[0\] is Anthropic's built-in tool 'web_search_20250305', which this server does not have"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "built-in tool 'bash_20250124'"),
    ({"tools": [{"input_schema": {}}]}, r"tools\[0\] needs a 'name' string"),
    ({"tools": [{"name": "x"}]}, r"tools\[0\] \('x'\) needs an 'input_schema' object"),
    ({"tools": [{"name": "x", "input_schema": "{}"}]}, "needs an 'input_schema' object"),
    ({"tools": [WEATHER, WEATHER]}, "Tool names must be unique; 'get_weather' is given twice"),
    ({"tools": [{**ADD, "description": 3}]}, r"tools\[0\]\.description must be a string"),
    ({"tools": [ADD], "tool_choice": "auto"},
     "'tool_choice' must be an object whose 'type' is auto, any, tool or none"),
    ({"tools": [ADD], "tool_choice": {"type": "required"}}, "whose 'type' is auto, any, tool or none"),
    ({"tools": [ADD], "tool_choice": {"type": "tool", "name": "sub"}}, "names tool 'sub', which is not in 'tools'"),
    ({"tools": [ADD], "tool_choice": {"type": "tool"}}, "names tool 'None', which is not in 'tools'"),
    ({"tool_choice": {"type": "any"}}, "'tool_choice' type 'any' needs 'tools'"),
    ({"tool_choice": {"type": "tool", "name": "add"}}, "'tool_choice' type 'tool' needs 'tools'"),
    ({"tools": [ADD], "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
     "'tool_choice.disable_parallel_tool_use' must be true or false"),
    ({"tools": [{**ADD, "name": "required"}], "tool_choice": {"type": "tool", "name": "required"}},
     "A tool named 'required' cannot be chosen by name"),
])
def test_bad_tools_are_refused(fields: dict[str, Any], match: str) -> None:
    assert refusal(match, **fields).param in ("tools", "tool_choice")


def test_no_tools_with_a_choice_of_auto_or_none_is_no_tools() -> None:
    for kind in ("auto", "none"):
        request = parse(tool_choice={"type": kind})
        assert request.tools == ()
        assert request.tool_choice == kind


# --- the rest of the body -------------------------------------------------------------------------


def test_sampling_fields_take_openais_names() -> None:
    request = parse(temperature=0, top_p=0.5, top_k=7, max_tokens=100, stop_sequences=["\n\nHuman:", "", "END"],
                    stream=True)
    assert request.sampling_fields == {"max_tokens": 100, "temperature": 0.0, "top_p": 0.5, "top_k": 7}
    assert request.stop == ("\n\nHuman:", "END")
    assert request.stream is True
    assert parse(max_tokens=LIMITS.max_tokens, temperature=1).sampling_fields == {"max_tokens": 512, "temperature": 1.0}
    assert parse(max_tokens=16.0).sampling_fields["max_tokens"] == 16


def test_a_json_output_format_is_openais_response_format() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    request = parse(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    assert request.sampling_fields["response_format"] == {"type": "json_schema", "json_schema": {"schema": schema}}
    assert "response_format" not in parse(output_config={"effort": "high"}).sampling_fields
    assert "response_format" not in parse(output_config={"format": None}).sampling_fields


def test_hints_with_no_effect_here_are_taken() -> None:
    request = parse(metadata={"user_id": "u1"}, service_tier="auto", cache_control={"type": "ephemeral"},
                    inference_geo="eu", speed="fast", container=None, mcp_servers=[], thinking={"type": "disabled"})
    assert request.messages == parse().messages
    assert parse(thinking={"type": "adaptive", "display": "omitted"}).messages == parse().messages


@pytest.mark.parametrize(("fields", "param", "match"), [
    ({"max_tokens": None}, "max_tokens", "'max_tokens' is required: the Messages API asks each request for its limit "
                                         r"\(this server allows 1 to 512\)"),
    ({"max_tokens": 0}, "max_tokens", "'max_tokens' is 0; this server allows 1 to 512"),
    ({"max_tokens": 513}, "max_tokens", "'max_tokens' is 513; this server allows 1 to 512"),
    ({"max_tokens": 10**40}, "max_tokens", "this server allows 1 to 512"),
    ({"max_tokens": 1.5}, "max_tokens", "'max_tokens' must be a whole number, not 1.5"),
    ({"max_tokens": float("inf")}, "max_tokens", "'max_tokens' must be a whole number"),
    ({"max_tokens": True}, "max_tokens", "'max_tokens' must be a whole number, not true"),
    ({"max_tokens": "16"}, "max_tokens", "'max_tokens' must be a whole number"),
    ({"temperature": 1.5}, "temperature", "'temperature' must be a number from 0 to 1, not 1.5"),
    ({"temperature": -0.1}, "temperature", "'temperature' must be a number from 0 to 1"),
    ({"temperature": "0.5"}, "temperature", "'temperature' must be a number from 0 to 1"),
    ({"top_p": 2}, "top_p", "'top_p' must be a number from 0 to 1, not 2"),
    ({"top_p": False}, "top_p", "'top_p' must be a number from 0 to 1"),
    ({"stop_sequences": "END"}, "stop_sequences", "'stop_sequences' must be a list of strings"),
    ({"stop_sequences": [1]}, "stop_sequences", "'stop_sequences' must be a list of strings"),
    ({"stop_sequences": ["a"] * 5}, "stop_sequences", "at most 4 strings of at most 256 characters"),
    ({"stop_sequences": ["a" * 257]}, "stop_sequences", "at most 4 strings"),
    ({"stream": "yes"}, "stream", "'stream' must be true or false"),
    ({"model": 3}, "model", "'model' must be a string"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking",
     "'thinking' type 'enabled' asks for extended thinking, which this server does not produce"),
    ({"thinking": {"type": "between_tools"}}, "thinking", "asks for extended thinking"),
    ({"thinking": True}, "thinking", "'thinking' must be an object with a 'type'"),
    ({"output_config": "json"}, "output_config", "'output_config' must be an object"),
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config",
     "'output_config.format' must be an object with type 'json_schema' and a 'schema' object"),
    ({"container": "cntr_1"}, "container", "'container' asks for a code-execution container, which this server does "
                                           "not have"),
    ({"mcp_servers": [{"type": "url", "url": "https://example.com"}]}, "mcp_servers", "asks for remote MCP servers"),
    ({"context_management": {"edits": []}}, "context_management", "asks for server-side context editing"),
    ({"temprature": 0.5}, "temprature", r"'temprature': Extra inputs are not permitted \(the Messages API has no "
                                        r"such field\)"),
    ({"seed": 1}, "seed", "'seed': Extra inputs are not permitted"),
    ({"n": 2}, "n", "Extra inputs are not permitted"),
])
def test_bad_fields_are_refused_by_name(fields: dict[str, Any], param: str, match: str) -> None:
    assert refusal(match, **fields).param == param


def test_count_tokens_takes_the_prompt_side_only() -> None:
    body = {"model": "tiny", "messages": ASK, "system": "Be brief.", "tools": [ADD], "tool_choice": {"type": "any"}}
    request = parse_count_tokens_request(body, LIMITS)
    assert request.messages == parse(system="Be brief.").messages
    assert request.tools == parse(tools=[ADD]).tools
    assert request.tool_choice == "required"
    assert request.sampling_fields == {}
    assert request.stream is False
    for extra in ({"max_tokens": 16}, {"stream": True}, {"temperature": 0.5}, {"stop_sequences": ["x"]}):
        with pytest.raises(ApiError, match="Extra inputs are not permitted"):
            parse_count_tokens_request({**body, **extra}, LIMITS)
    with pytest.raises(ApiError, match="'messages' must be a non-empty list"):
        parse_count_tokens_request({"model": "tiny"}, LIMITS)
    assert count_tokens_body(42) == {"input_tokens": 42}


def test_the_openai_body_says_the_same_request() -> None:
    request = parse(system="S.", tools=[WEATHER, ADD], tool_choice={"type": "tool", "name": "add",
                                                                     "disable_parallel_tool_use": True},
                    stop_sequences=["END"], temperature=0.2, stream=True)
    body = openai_body(request)
    assert body == {"messages": list(request.messages), "max_tokens": 16, "temperature": 0.2, "stream": True,
                    "model": "tiny", "stop": ["END"], "tools": list(request.tools), "parallel_tool_calls": False,
                    "tool_choice": {"type": "function", "function": {"name": "add"}}}
    assert openai_body(parse(tools=[ADD], tool_choice={"type": "any"}))["tool_choice"] == "required"
    assert "tool_choice" not in openai_body(parse(tools=[ADD]))
    assert "tools" not in openai_body(parse(tool_choice={"type": "none"}))


def test_protocols_parser_takes_the_openai_body() -> None:
    """The server feeds openai_body to protocol's parser: its checks (the engine's ranges, the tools' schemas)
    hold for a Messages request too."""
    history = [*ASK, {"role": "assistant", "content": [use("toolu_1", city="Paris")]},
               {"role": "user", "content": [result("toolu_1"), {"type": "text", "text": "And tomorrow?"}]}]
    request = parse(messages=history, system="S.", tools=[WEATHER], tool_choice={"type": "any"}, top_k=5,
                    stop_sequences=["END"], temperature=0)
    checked = protocol.parse_request(openai_body(request), LIMITS, chat=True)
    assert [m["role"] for m in checked.messages] == ["system", "user", "assistant", "tool", "user"]
    assert checked.sampling.max_tokens == 16
    assert checked.sampling.top_k == 5
    assert checked.sampling.temperature == 0
    assert checked.stop == ("END",)
    assert checked.tools is not None
    with pytest.raises(ApiError, match=r"(?i)top-k"):
        protocol.parse_request(openai_body(parse(top_k=10**7)), LIMITS, chat=True)


# --- responses ------------------------------------------------------------------------------------


def test_a_message_body() -> None:
    body = message_body("msg_1", "tiny", "Here.", [("toolu_1", "get_weather", '{"city": "Paris"}'),
                                                    ("", "add", "")], "tool_use", None, 12, 30,
                        extra={"metrics": {"speculative_decoding": {"num_draft_tokens": 4}}})
    assert body["content"][:2] == [{"type": "text", "text": "Here."}, {
        "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert body["content"][2]["id"].startswith("toolu_")
    assert body["content"][2]["input"] == {}
    assert {k: v for k, v in body.items() if k != "content"} == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "tiny", "stop_reason": "tool_use",
        "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 30},
        "metrics": {"speculative_decoding": {"num_draft_tokens": 4}}}
    assert message_body("msg_2", "tiny", "", (), "max_tokens", None, 1, 0)["content"] == []
    with pytest.raises(ValueError, match="replace the Messages API's own"):
        message_body("msg_3", "tiny", "x", (), "end_turn", None, 1, 1, extra={"usage": {}})
    with pytest.raises(ValueError, match="must be a JSON object"):
        message_body("msg_4", "tiny", "", [("t", "add", "[1]")], "tool_use", None, 1, 1)


def test_ids_are_anthropics_shape_and_new_each_time() -> None:
    assert new_message_id().startswith("msg_")
    assert new_tool_use_id().startswith("toolu_")
    assert len({new_message_id() for _ in range(50)}) == 50
    assert len(new_message_id()) > 20


@pytest.mark.parametrize(("engine", "stopped_by", "has_calls", "expected"), [
    ("eog", None, False, "end_turn"),
    ("stop", None, False, "end_turn"),
    ("cancelled", None, False, "end_turn"),
    ("max_tokens", None, False, "max_tokens"),
    ("context_full", None, False, "max_tokens"),
    ("stop", "END", False, "stop_sequence"),
    ("eog", None, True, "tool_use"),
    ("max_tokens", None, True, "tool_use"),
])
def test_stop_reasons(engine: str, stopped_by: str | None, has_calls: bool, expected: str) -> None:
    assert stop_reason_for(engine, stopped_by, has_calls) == expected


def test_the_stop_matcher_names_the_sequence_that_ended_the_answer() -> None:
    matcher = StopMatcher(("END", "STOP"))
    assert matcher.feed("abc EN") == "abc "
    assert matcher.matched is None
    assert matcher.feed("D more") == ""
    assert matcher.matched == "END"
    assert matcher.stopped
    assert matcher.feed("STOP") == ""
    assert matcher.matched == "END"
    earliest = StopMatcher(("b", "cd"))
    assert earliest.feed("xcdb") == "x"
    assert earliest.matched == "cd"
    plain = StopMatcher(())
    assert plain.feed("text") == "text"
    assert plain.matched is None


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
    (503, "overloaded_error"), (529, "overloaded_error"), (422, "invalid_request_error"), (502, "api_error"),
])
def test_error_bodies_take_anthropics_types(status: int, kind: str) -> None:
    assert error_type(status) == kind
    assert error_body(ApiError(status, "Why.", kind="server_error", code="x")) == {
        "type": "error", "error": {"type": kind, "message": "Why."}}


# --- streaming ------------------------------------------------------------------------------------


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in raw.decode().split("\n\n")[:-1]:
        name, data = frame.split("\n")
        assert name.startswith("event: ")
        assert data.startswith("data: ")
        payload = json.loads(data[len("data: "):])
        assert payload["type"] == name[len("event: "):]
        out.append((payload["type"], payload))
    return out


def test_a_stream_in_anthropics_event_order() -> None:
    stream = MessageStream()
    raw = stream.start("msg_1", "tiny", 9) + stream.text("") + stream.text("Hel") + stream.ping() + stream.text("lo")
    raw += stream.tool_call("toolu_1", "add", '{"a": 1}') + stream.tool_call("", "add", "{}") + stream.text("Done.")
    raw += stream.finish("tool_use", None, 20, extra={"timings": {"draft_n": 3}})
    seen = events(raw)
    assert [(kind, body.get("index")) for kind, body in seen] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("ping", None),
        ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_delta", 3), ("content_block_stop", 3),
        ("message_delta", None), ("message_stop", None)]
    assert seen[0][1]["message"] == {"id": "msg_1", "type": "message", "role": "assistant", "model": "tiny",
                                     "content": [], "stop_reason": None, "stop_sequence": None,
                                     "usage": {"input_tokens": 9, "output_tokens": 0}}
    assert seen[1][1]["content_block"] == {"type": "text", "text": ""}
    assert seen[2][1]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert seen[6][1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}
    assert seen[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a":1}'}
    assert seen[9][1]["content_block"]["id"].startswith("toolu_")
    assert seen[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": 20}, "timings": {"draft_n": 3}}


def test_a_long_tool_input_streams_in_fragments() -> None:
    stream = MessageStream()
    arguments = json.dumps({"text": "ü" * 3000})
    seen = events(stream.start("m", "tiny", 1) + stream.tool_call("t", "echo", arguments))
    fragments = [body["delta"]["partial_json"] for kind, body in seen if kind == "content_block_delta"]
    assert len(fragments) > 2
    assert json.loads("".join(fragments)) == json.loads(arguments)


def test_a_stream_is_used_in_order() -> None:
    stream = MessageStream()
    with pytest.raises(RuntimeError):
        stream.text("early")
    stream.start("m", "tiny", 1)
    with pytest.raises(RuntimeError):
        stream.start("m", "tiny", 1)
    assert [kind for kind, _ in events(stream.finish("end_turn", None, 0))] == ["message_delta", "message_stop"]
    with pytest.raises(RuntimeError):
        stream.text("late")
    other = MessageStream()
    other.start("m", "tiny", 1)
    with pytest.raises(ValueError, match="must be a JSON object"):
        other.tool_call("t", "x", '"str"')


def test_an_error_event() -> None:
    stream = MessageStream()
    stream.start("m", "tiny", 1)
    assert events(stream.error(ApiError(503, "Busy.")))[0][1] == {
        "type": "error", "error": {"type": "overloaded_error", "message": "Busy."}}
    with pytest.raises(RuntimeError):
        stream.text("after")


# --- the official client --------------------------------------------------------------------------


def _http() -> Any:
    """The HTTP library this client version is built on (httpx; httpx2 from anthropic 2)."""
    from anthropic import _base_client

    return getattr(_base_client, "httpx2", None) or _base_client.httpx


HTTP = _http()
Handler = Callable[[dict[str, Any], str], Any]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], Any]]:
    """A client whose requests are answered in-process by ``handler(body, path)``: a dict is sent as JSON, an
    (status, dict) pair as an error, bytes as an event stream."""
    clients: list[Any] = []

    def make(handler: Handler) -> Any:
        def answer(request: Any) -> Any:
            reply = handler(json.loads(request.content), request.url.path)
            if isinstance(reply, bytes):
                return HTTP.Response(200, headers={"content-type": "text/event-stream"}, content=reply)
            status, body = reply if isinstance(reply, tuple) else (200, reply)
            return HTTP.Response(status, json=body)

        client = anthropic.Anthropic(http_client=HTTP.Client(transport=HTTP.MockTransport(answer)),
                                     base_url="http://test", api_key="x", max_retries=0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def _answer(body: dict[str, Any], path: str) -> dict[str, Any]:
    """Parses what the client sent, and answers with text and, when tools were given, a call of the first."""
    assert path == "/v1/messages"
    request = parse_messages_request(body, LIMITS)
    calls = [("", request.tools[0]["function"]["name"], '{"city": "Paris", "days": [1, 2]}')] if request.tools else []
    return message_body(new_message_id(), request.model, "Sunny.", calls, stop_reason_for("eog", None, bool(calls)),
                        None, 7, 11, extra={"timings": {"draft_n": 2}})


def test_the_client_reads_a_message(serve: Callable[[Handler], Any]) -> None:
    client = serve(_answer)
    message = client.messages.create(model="tiny", max_tokens=16, messages=ASK, tools=[WEATHER],
                                     tool_choice={"type": "any"}, system="Be brief.")
    assert isinstance(message, anthropic.types.Message)
    text, tool = message.content
    assert isinstance(text, anthropic.types.TextBlock)
    assert text.text == "Sunny."
    assert isinstance(tool, anthropic.types.ToolUseBlock)
    assert tool.name == "get_weather"
    assert tool.input == {"city": "Paris", "days": [1, 2]}
    assert tool.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    assert message.stop_sequence is None
    assert message.model == "tiny"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 11)
    plain = client.messages.create(model="tiny", max_tokens=16, messages=ASK)
    assert [b.type for b in plain.content] == ["text"]
    assert plain.stop_reason == "end_turn"


def test_the_clients_requests_are_taken(serve: Callable[[Handler], Any]) -> None:
    """What the client sends, including a Message it parsed sent back as history, parses here."""
    sent: list[MessagesRequest] = []

    def handler(body: dict[str, Any], path: str) -> dict[str, Any]:
        sent.append(parse_messages_request(body, LIMITS))
        return _answer(body, path)

    client = serve(handler)
    first = client.messages.create(model="tiny", max_tokens=16, messages=ASK, tools=[WEATHER],
                                   extra_body={"temperature": 0.0, "top_k": 3}, stop_sequences=["END"],
                                   metadata={"user_id": "u"})
    tool = next(block for block in first.content if block.type == "tool_use")
    history = [*ASK, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "21 C"}]}]
    client.messages.create(model="tiny", max_tokens=16, messages=history, tools=[WEATHER])
    assert sent[0].sampling_fields == {"max_tokens": 16, "temperature": 0.0, "top_k": 3}
    assert sent[0].stop == ("END",)
    assert sent[1].messages[1:] == (
        {"role": "assistant", "content": "Sunny.", "tool_calls": [
            call(tool.id, "get_weather", '{"city":"Paris","days":[1,2]}')]},
        {"role": "tool", "tool_call_id": tool.id, "content": "21 C"})


def _streamed(body: dict[str, Any], path: str) -> bytes:
    request = parse_messages_request(body, LIMITS)
    assert request.stream
    stream = MessageStream()
    raw = stream.start(new_message_id(), request.model, 5) + stream.ping()
    for piece in ("It ", "is ", "sunny ", "in Paris."):
        raw += stream.text(piece)
    raw += stream.tool_call("toolu_a", "get_weather", json.dumps({"city": "Paris", "note": "x" * 2000}))
    raw += stream.tool_call("", "add", '{"a": 2}')
    return raw + stream.finish("tool_use", None, 40, extra={"timings": {"draft_n": 2}})


def test_the_client_assembles_a_stream(serve: Callable[[Handler], Any]) -> None:
    client = serve(_streamed)
    with client.messages.stream(model="tiny", max_tokens=16, messages=ASK, tools=[WEATHER, ADD]) as stream:
        pieces = list(stream.text_stream)
        message = stream.get_final_message()
    assert pieces == ["It ", "is ", "sunny ", "in Paris."]
    text, weather, add = message.content
    assert text.type == "text"
    assert text.text == "It is sunny in Paris."
    assert weather.type == "tool_use"
    assert weather.id == "toolu_a"
    assert weather.name == "get_weather"
    assert weather.input == {"city": "Paris", "note": "x" * 2000}
    assert add.type == "tool_use"
    assert add.input == {"a": 2}
    assert add.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    assert message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 40)


def test_the_clients_raw_events_are_anthropics_types(serve: Callable[[Handler], Any]) -> None:
    client = serve(_streamed)
    seen = list(client.messages.create(model="tiny", max_tokens=16, messages=ASK, stream=True))
    types = anthropic.types
    assert isinstance(seen[0], types.RawMessageStartEvent)
    assert isinstance(seen[-1], types.RawMessageStopEvent)
    assert isinstance(seen[-2], types.RawMessageDeltaEvent)
    assert seen[-2].delta.stop_reason == "tool_use"
    deltas = [e.delta for e in seen if isinstance(e, types.RawContentBlockDeltaEvent)]
    assert {type(d) for d in deltas} == {types.TextDelta, types.InputJSONDelta}
    assert all(isinstance(e, (types.RawMessageStartEvent, types.RawContentBlockStartEvent,
                              types.RawContentBlockDeltaEvent, types.RawContentBlockStopEvent,
                              types.RawMessageDeltaEvent, types.RawMessageStopEvent)) for e in seen)


def test_a_stream_ended_by_a_stop_sequence(serve: Callable[[Handler], Any]) -> None:
    def handler(body: dict[str, Any], path: str) -> bytes:
        stream = MessageStream()
        return stream.start("msg_s", "tiny", 3) + stream.text("one ") + stream.finish("stop_sequence", "END", 2)

    with serve(handler).messages.stream(model="tiny", max_tokens=8, messages=ASK, stop_sequences=["END"]) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "END"
    assert message.content[0].text == "one "
    assert message.id == "msg_s"


@pytest.mark.parametrize(("status", "name"), [
    (400, "BadRequestError"), (401, "AuthenticationError"), (403, "PermissionDeniedError"),
    (404, "NotFoundError"), (413, "ContentTooLargeError"), (429, "RateLimitError"),
    (500, "InternalServerError"), (503, "ServiceUnavailableError"), (529, "OverloadedError"),
])
def test_the_client_raises_its_error_for_each_status(serve: Callable[[Handler], Any], status: int, name: str) -> None:
    """Older clients lack some of the newer classes; every one raises a subclass of APIStatusError."""
    def handler(body: dict[str, Any], path: str) -> tuple[int, dict[str, Any]]:
        try:
            parse_messages_request(body, LIMITS)
        except ApiError as exc:
            return exc.status, error_body(exc)
        return status, error_body(ApiError(status, "It went wrong."))

    client = serve(handler)
    with pytest.raises(getattr(anthropic, name, anthropic.APIStatusError)) as caught:
        client.messages.create(model="tiny", max_tokens=16, messages=ASK)
    assert caught.value.status_code == status
    assert caught.value.body == {"type": "error", "error": {"type": ERROR_TYPES[status], "message": "It went wrong."}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="tiny", max_tokens=16, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert "'image' block" in refused.value.body["error"]["message"]


def test_the_client_raises_an_error_event_mid_stream(serve: Callable[[Handler], Any]) -> None:
    def handler(body: dict[str, Any], path: str) -> bytes:
        stream = MessageStream()
        return stream.start("m", "tiny", 1) + stream.text("half") + stream.error(ApiError(500, "The engine crashed."))

    with pytest.raises(anthropic.APIStatusError) as caught, \
            serve(handler).messages.stream(model="tiny", max_tokens=8, messages=ASK) as stream:
        stream.get_final_message()
    assert caught.value.body == {"type": "error", "error": {"type": "api_error", "message": "The engine crashed."}}


def test_the_client_counts_tokens(serve: Callable[[Handler], Any]) -> None:
    def handler(body: dict[str, Any], path: str) -> dict[str, int]:
        assert path == "/v1/messages/count_tokens"
        request = parse_count_tokens_request(body, LIMITS)
        return count_tokens_body(sum(len(m["content"]) for m in request.messages))

    counted = serve(handler).messages.count_tokens(model="tiny", messages=ASK, system="Be brief.", tools=[ADD])
    assert counted.input_tokens == len("Be brief.") + len(ASK[0]["content"])
