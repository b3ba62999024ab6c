"""Tool calling through `specdeck serve`, driven by the official `openai` client and the OpenAI Agents SDK.

Tiny random-weight models carry real chat templates of three tool-call families (tests/data/templates). A
random model writes no tool call of its own, so what holds by construction is tested end to end: forced calls
(``required`` and a named function) are constrained by a grammar made from the tools' schemas, so their
arguments always parse and satisfy the schema, streamed or not, whatever the weights; ``auto`` answers come
back as text without an error; a whole agent loop (call, tool result, answer) runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.params import DraftSettings, LoadSettings
from app.serve.metrics import ServeMetrics
from app.serve.protocol import Limits
from app.serve.runner import EngineRunner
from app.serve.server import ServeOptions, Server
from tests.gguf_fixtures import write_tiny_model

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
# A family of each kind: JSON in a wrapper, XML parameters, a JSON list after a control token.
FAMILIES = {
    "hermes": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "qwen3_coder": "Qwen3-Coder.jinja",
    "mistral": "Mistral-Small-3.2-24B-Instruct-2506.jinja",
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two small numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "enum": list(range(10))},
                           "b": {"type": "integer", "enum": list(range(10))}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def template_file(family: str) -> str:
    path = TEMPLATES / FAMILIES[family]
    if not path.exists():
        pytest.skip(f"{path.name} is not among the test templates")
    return path.read_text()


def start(target: Path, tmp: Path) -> Server:
    settings = LoadSettings(target_path=str(target), n_ctx=8192, draft=DraftSettings(ngram=2, adaptive=True))
    metrics = ServeMetrics()
    runner = EngineRunner(settings, metrics, history_path=tmp / "history.sqlite3")
    server = Server(runner, metrics, ServeOptions(port=0, limits=Limits(max_tokens=1024)))
    server.start_in_thread()
    deadline = time.monotonic() + 120
    while httpx.get(server.base_url + "/health").status_code != 200:
        assert runner.state in ("loading", "ready"), runner.message
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.1)
    return server


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"tools-{request.param}")
    target = write_tiny_model(tmp / "tiny.gguf", chat_template=template_file(request.param), name="tiny-tools")
    server = start(target, tmp)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def plain_server(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny model's own template, which has no tool support: tools go in as text."""
    server = start(tiny_target, tmp_path_factory.mktemp("tools-plain"))
    yield server
    server.stop()


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def satisfies(arguments: dict[str, Any], tool: dict[str, Any]) -> bool:
    """The schemas above, checked by hand: required keys, no others, types, enums and bounds."""
    schema = tool["function"]["parameters"]
    if set(arguments) != set(schema["required"]):
        return False
    for name, value in arguments.items():
        spec = schema["properties"][name]
        if spec["type"] == "string" and not (isinstance(value, str) and len(value) <= spec.get("maxLength", 1e9)):
            return False
        if spec["type"] == "integer" and not isinstance(value, int):
            return False
        if "enum" in spec and value not in spec["enum"]:
            return False
    return True


def by_name(name: str) -> dict[str, Any]:
    return next(t for t in TOOLS if t["function"]["name"] == name)


def test_a_named_function_is_called_with_valid_arguments(family_server: Server) -> None:
    with client(family_server) as oai:
        for temperature in (0.0, 1.0):
            answer = oai.chat.completions.create(
                model="tiny", messages=ASK, tools=TOOLS, temperature=temperature, seed=3,  # type: ignore[arg-type]
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
            choice = answer.choices[0]
            assert choice.finish_reason == "tool_calls"
            calls = choice.message.tool_calls or []
            assert len(calls) == 1
            assert calls[0].function.name == "get_weather"
            assert calls[0].id.startswith("call_")
            assert satisfies(json.loads(calls[0].function.arguments), WEATHER)  # type: ignore[union-attr]


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_are_valid_for_their_tools(family_server: Server, parallel: bool) -> None:
    # Calls of `add` are short: a random model that keeps adding calls ends the list long before max_tokens.
    tools = TOOLS if not parallel else [ADD]
    with client(family_server) as oai:
        answer = oai.chat.completions.create(model="tiny", messages=ASK, tools=tools,  # type: ignore[arg-type]
                                             tool_choice="required", parallel_tool_calls=parallel,
                                             temperature=1.0, seed=11, max_tokens=1024)
    calls = answer.choices[0].message.tool_calls or []
    assert answer.choices[0].finish_reason == "tool_calls"
    assert len(calls) >= 1
    assert (parallel or len(calls) == 1)
    for call in calls:
        assert satisfies(json.loads(call.function.arguments), by_name(call.function.name))  # type: ignore[union-attr]
    assert len({call.id for call in calls}) == len(calls)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_streamed_call_assembles_to_the_same_call(family_server: Server, choice: str) -> None:
    tool_choice: Any = "required" if choice == "required" else {"type": "function", "function": {"name": "add"}}
    request: dict[str, Any] = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice,
                               "parallel_tool_calls": False, "temperature": 0.0}
    with client(family_server) as oai:
        whole = oai.chat.completions.create(**request).choices[0].message.tool_calls or []
        names: dict[int, str] = {}
        arguments: dict[int, str] = {}
        finish = None
        for chunk in oai.chat.completions.create(**request, stream=True):
            for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                if delta.function and delta.function.name:
                    assert delta.index not in names, "a call's name comes once, first"
                    names[delta.index] = delta.function.name
                if delta.function and delta.function.arguments:
                    assert delta.index in names, "arguments come after the name"
                    arguments[delta.index] = arguments.get(delta.index, "") + delta.function.arguments
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls"
    assert [names[i] for i in sorted(names)] == [c.function.name for c in whole]  # type: ignore[union-attr]
    assert [json.loads(arguments[i]) for i in sorted(arguments)] == \
        [json.loads(c.function.arguments) for c in whole]  # type: ignore[union-attr]


def test_auto_answers_and_a_whole_tool_loop(family_server: Server) -> None:
    with client(family_server) as oai:
        first = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, temperature=0.0)  # type: ignore[arg-type]
        call = (first.choices[0].message.tool_calls or [])[0]
        history: list[Any] = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                              {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
        for stream in (False, True):
            answer = oai.chat.completions.create(model="tiny", messages=history, tools=TOOLS,  # type: ignore[arg-type]
                                                 max_tokens=24, temperature=0.0, stream=stream)
            if stream:
                finishes = [c.choices[0].finish_reason for c in answer if c.choices]  # type: ignore[union-attr]
                assert finishes[-1] in ("stop", "length", "tool_calls")
            else:
                assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")  # type: ignore[union-attr]


def test_a_template_without_tools_gets_them_as_text(plain_server: Server) -> None:
    with client(plain_server) as oai:
        answer = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                             tool_choice={"type": "function", "function": {"name": "add"}},
                                             temperature=0.0)
        call = (answer.choices[0].message.tool_calls or [])[0]
        assert satisfies(json.loads(call.function.arguments), ADD)  # type: ignore[union-attr]
        auto = oai.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=16,  # type: ignore[arg-type]
                                           temperature=0.0)
        assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(("schema", "word"), [
    ({"type": "object", "properties": {"x": {"type": "string", "enum": [str(i) for i in range(100_000)]}}}, "enum"),
    ({"type": "object", "properties": {"x": {"type": "string", "pattern": "(a|b)*(c|d)*((e|f)*){1000}"}}}, "pattern"),
    ({"type": "object", "properties": {"x": {"type": "string", "x-custom": 1}}}, "x-custom"),
])
def test_a_hostile_tool_schema_is_refused_by_name(plain_server: Server, schema: dict[str, Any], word: str) -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"x": deep}}
    for parameters in (schema, deep):
        tool = {"type": "function", "function": {"name": "hostile", "parameters": parameters}}
        response = httpx.post(plain_server.base_url + "/v1/chat/completions", timeout=60, json={
            "messages": ASK, "tools": [tool], "tool_choice": "required"})
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert (("nested" in message or "deep" in message) if parameters is deep else word in message), message
    assert httpx.get(plain_server.base_url + "/health").status_code == 200


def test_the_sampling_contract_is_accepted(plain_server: Server) -> None:
    with client(plain_server) as oai:
        answer = oai.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, temperature=0.0,
                                             presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"65": -100},
                                             logprobs=True, top_logprobs=3)
        content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content
        assert all(len(item.top_logprobs) == 3 for item in content)
        for item in content:  # greedy: the token is the most likely one, and the log probabilities are ordered
            assert item.logprob == pytest.approx(item.top_logprobs[0].logprob, abs=1e-4)
            assert [t.logprob for t in item.top_logprobs] == sorted((t.logprob for t in item.top_logprobs),
                                                                    reverse=True)
        streamed = [c for c in oai.chat.completions.create(model="tiny", messages=ASK, max_tokens=8, stream=True,
                                                           temperature=0.0, logprobs=True, top_logprobs=2)]
        items = [i for c in streamed if c.choices and c.choices[0].logprobs
                 for i in c.choices[0].logprobs.content or []]
        assert len(items) == len(content)


def test_an_agent_framework_runs_its_loop(family_server: Server) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[tuple[int, int]] = []

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        calls.append((a, b))
        return a + b

    async def run() -> Any:
        # The client is closed inside the loop that used it: left open, its connections outlive the loop.
        async with openai.AsyncOpenAI(base_url=family_server.base_url + "/v1", api_key="unused", max_retries=0,
                                      timeout=120) as oai:
            model = agents.OpenAIChatCompletionsModel(model="tiny", openai_client=oai)
            agent = agents.Agent(name="adder", instructions="Use the add tool.", tools=[add], model=model,
                                 model_settings=agents.ModelSettings(tool_choice="required",
                                                                     parallel_tool_calls=False, temperature=0.0,
                                                                     max_tokens=200))
            return await agents.Runner.run(agent, "What is 2 plus 3?", max_turns=4)

    result = asyncio.run(run())
    assert calls, "the agent called its tool"  # the SDK sets the tool choice back to auto after a call
    assert isinstance(result.final_output, str)
