"""Anthropic's Messages API on `specdeck serve`, driven by the official `anthropic` client over loopback.

What holds by construction on a random-weight model: a forced tool use (``any`` or a named tool) has an input
that satisfies the tool's schema (the grammar makes it so), streamed or not; a greedy answer is the same
twice, so a stop sequence taken from it ends the second answer where it first occurs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.serve.server import Server
from tests.app.test_serve_tools import ADD, TOOLS, WEATHER, by_name, satisfies, start, template_file
from tests.gguf_fixtures import write_tiny_model

anthropic = pytest.importorskip("anthropic")

TOOLS_ANTHROPIC = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("anthropic")
    target = write_tiny_model(tmp / "tiny.gguf", chat_template=template_file("hermes"), name="tiny-tools")
    server = start(target, tmp)
    yield server
    server.stop()


@pytest.fixture
def claude(served: Server) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=served.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def test_a_message_and_its_stream_agree(claude: Any) -> None:
    whole = claude.messages.create(model="tiny", max_tokens=24, messages=ASK, extra_body={"temperature": 0.0})
    assert whole.type == "message"
    assert whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.input_tokens > 0
    assert 0 < whole.usage.output_tokens <= 24
    with claude.messages.stream(model="tiny", max_tokens=24, messages=ASK,
                                extra_body={"temperature": 0.0}) as stream:
        streamed = stream.get_final_message()
    text = "".join(block.text for block in whole.content if block.type == "text")
    assert "".join(block.text for block in streamed.content if block.type == "text") == text
    assert streamed.stop_reason == whole.stop_reason


def test_a_stop_sequence_ends_the_answer(claude: Any) -> None:
    first = claude.messages.create(model="tiny", max_tokens=40, messages=ASK, extra_body={"temperature": 0.0})
    text = "".join(block.text for block in first.content if block.type == "text")
    if len(text) < 8:
        pytest.skip("the greedy answer ended too soon to cut")
    stop = text[5:8]
    cut = claude.messages.create(model="tiny", max_tokens=40, messages=ASK, stop_sequences=[stop],
                                 extra_body={"temperature": 0.0})
    assert cut.stop_reason == "stop_sequence"
    assert cut.stop_sequence == stop
    assert "".join(block.text for block in cut.content if block.type == "text") == text[: text.find(stop)]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "add"}])
def test_a_forced_tool_use_satisfies_its_schema(claude: Any, choice: dict[str, Any]) -> None:
    for stream in (False, True):
        request = {"model": "tiny", "max_tokens": 200, "messages": ASK, "tools": TOOLS_ANTHROPIC,
                   "tool_choice": {**choice, "disable_parallel_tool_use": True}, "extra_body": {"temperature": 1.0}}
        if stream:
            with claude.messages.stream(**request) as events:
                message = events.get_final_message()
        else:
            message = claude.messages.create(**request)
        uses = [block for block in message.content if block.type == "tool_use"]
        assert message.stop_reason == "tool_use"
        assert len(uses) == 1
        if choice["type"] == "tool":
            assert uses[0].name == "add"
        assert satisfies(uses[0].input, by_name(uses[0].name))


def test_a_tool_result_loop(claude: Any) -> None:
    first = claude.messages.create(model="tiny", max_tokens=200, messages=ASK, tools=TOOLS_ANTHROPIC,
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0.0})
    use = next(block for block in first.content if block.type == "tool_use")
    assert satisfies(use.input, WEATHER)
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]}]
    answer = claude.messages.create(model="tiny", max_tokens=16, messages=history, tools=TOOLS_ANTHROPIC,
                                    extra_body={"temperature": 0.0})
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert ADD["function"]["name"] in {t["name"] for t in TOOLS_ANTHROPIC}


def test_bad_requests_get_anthropic_errors(claude: Any, served: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        claude.messages.create(model="tiny", messages=ASK, max_tokens=0)
    assert missing.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    hostile = {"name": "deep", "input_schema": {"type": "object", "properties": {"x": {
        "type": "string", "enum": [str(i) for i in range(100_000)]}}}}
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="tiny", max_tokens=8, messages=ASK, tools=[hostile], tool_choice={"type": "any"})
    assert claude.messages.create(model="tiny", max_tokens=4, messages=ASK).type == "message"


def test_count_tokens_is_the_prompt_a_message_sends(claude: Any) -> None:
    """``messages.count_tokens`` counts with the model's own template and tokenizer in the worker: the same
    number a message reports as its input, with the tools' text counted when there are tools; a request the
    Messages API refuses is refused here too, and nothing is generated (no output usage to report)."""
    for tools in ([], TOOLS_ANTHROPIC):
        extra = {"tools": tools} if tools else {}
        counted = claude.messages.count_tokens(model="tiny", messages=ASK, **extra)
        sent = claude.messages.create(model="tiny", max_tokens=1, messages=ASK, extra_body={"temperature": 0.0},
                                      **extra)
        assert counted.input_tokens == sent.usage.input_tokens
    plain = claude.messages.count_tokens(model="tiny", messages=ASK).input_tokens
    with_tools = claude.messages.count_tokens(model="tiny", messages=ASK, tools=TOOLS_ANTHROPIC).input_tokens
    assert with_tools > plain
    short = claude.messages.count_tokens(model="tiny", system="Be brief.", messages=ASK).input_tokens
    longer = claude.messages.count_tokens(model="tiny", system="Be brief. " * 20, messages=ASK).input_tokens
    assert longer > short
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="tiny", messages=[])


def test_the_plain_template_model_also_serves_messages(tiny_target: Path,
                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start(tiny_target, tmp_path_factory.mktemp("anthropic-plain"))
    try:
        with anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as client:
            message = client.messages.create(model="tiny", max_tokens=200, messages=ASK, tools=TOOLS_ANTHROPIC,
                                             tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                             extra_body={"temperature": 0.0})
        use = next(block for block in message.content if block.type == "tool_use")
        assert satisfies(use.input, by_name(use.name))
    finally:
        server.stop()
