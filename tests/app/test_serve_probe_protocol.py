"""`specdeck serve` and what a request asks for: usage past a stop sequence, llama-server's parameters, OpenAI's
defaults, extreme numbers, and a request whose chat template falls back. A real server on a tiny model, real
HTTP clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.serve import protocol
from app.serve.api_error import ApiError
from app.serve.protocol import Limits
from app.serve.server import Server
from tests.app.test_serve import MESSAGES, start_server


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tiny_target, tmp_path_factory.mktemp("serve-probe") / "history.sqlite3")
    yield server
    server.stop()


def _chat(server: Server, **body: Any) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                      json={"messages": MESSAGES, "temperature": 0, **body})


def _streamed(server: Server, **body: Any) -> tuple[str, dict[str, int]]:
    text, usage = "", {}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=120, json={
            "messages": MESSAGES, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk["choices"]:
                    text += choice["delta"].get("content") or ""
                usage = chunk.get("usage") or usage
    return text, usage


# --- usage past a stop sequence ----------------------------------------------------------------------------


def test_completion_tokens_count_the_text_up_to_the_stop_streamed_or_not(served: Server) -> None:
    full = _chat(served, max_tokens=40).json()["choices"][0]["message"]["content"]
    # A stop sequence a few characters in, that does not occur before it.
    cut = next(i for i in range(3, 16) if full.find(full[i:i + 2]) == i)
    stop = full[cut:cut + 2]
    # Greedy answers grow by prefix: the text up to the stop takes the fewest tokens whose text reaches it.
    needed = next(m for m in range(1, 41)
                  if len(_chat(served, max_tokens=m).json()["choices"][0]["message"]["content"]) >= cut)
    plain = _chat(served, max_tokens=40, stop=[stop]).json()
    assert plain["choices"][0]["message"]["content"] == full[:cut]
    assert plain["choices"][0]["finish_reason"] == "stop"
    assert plain["usage"]["completion_tokens"] == needed
    assert plain["usage"]["total_tokens"] == plain["usage"]["prompt_tokens"] + needed
    text, usage = _streamed(served, max_tokens=40, stop=[stop])
    assert text == full[:cut]
    assert usage["completion_tokens"] == needed


# --- llama-server's parameters, OpenAI's defaults, extreme numbers ------------------------------------------


@pytest.mark.parametrize(("name", "value"), [
    ("grammar", 'root ::= "yes" | "no"'), ("n_probs", 5), ("mirostat", 2), ("best_of", 2), ("best_of", 0),
])
def test_parameters_the_server_cannot_honour_are_a_400_naming_them(served: Server, name: str, value: Any) -> None:
    r = _chat(served, max_tokens=2, **{name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name


@pytest.mark.parametrize(("name", "value"), [
    ("best_of", 1), ("n", 1), ("grammar", ""), ("n_probs", 0), ("mirostat", 0),
])
def test_defaults_that_ask_for_nothing_are_accepted(served: Server, name: str, value: Any) -> None:
    r = _chat(served, max_tokens=2, **{name: value})
    assert r.status_code == 200, r.text


YES_NO = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}


def test_llama_servers_json_schema_constrains_the_answer(served: Server) -> None:
    r = _chat(served, max_tokens=100, json_schema=YES_NO)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"])["answer"] in ("yes", "no")


@pytest.mark.parametrize("body", [
    {"json_schema": "an object"},
    {"json_schema": {"type": "integer", "minimum": 3}},
    {"json_schema": YES_NO, "response_format": {"type": "json_object"}},
])
def test_a_json_schema_the_server_cannot_enforce_is_a_400_naming_it(body: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as caught:
        protocol.parse_request({"messages": MESSAGES, **body}, Limits(), chat=True)
    assert caught.value.status == 400
    assert caught.value.param == "json_schema"


@pytest.mark.parametrize("temperature", [4.9e-324, 1e-300, 1e-9])
def test_a_vanishing_temperature_answers_as_greedy(served: Server, temperature: float) -> None:
    greedy = _chat(served, max_tokens=8)
    tiny = _chat(served, max_tokens=8, temperature=temperature)
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["message"]["content"] == greedy.json()["choices"][0]["message"]["content"]


# --- a chat template that falls back for one request ----------------------------------------------------------

# Cubic in the messages: fine for a chat, far past the render's CPU bound for 2000 of them.
CUBIC_TEMPLATE = ("{% for m in messages %}{% for n in messages %}{% for o in messages %}{{ o['content'][:1] }}"
                      "{% endfor %}{% endfor %}"
                      "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.server
def test_one_request_whose_template_is_stopped_does_not_change_the_format_of_the_next(
        tmp_path: Path, tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    target = tiny_model_factory("cubic.gguf", chat_template=CUBIC_TEMPLATE)
    server = start_server(target, tmp_path / "t.sqlite3", n_ctx=4096)
    try:
        hello = [{"role": "user", "content": "hello"}]
        before = _chat(server, messages=hello, max_tokens=2).json()["usage"]["prompt_tokens"]
        heavy = _chat(server, messages=[{"role": "user", "content": ""}] * 2000, max_tokens=2)
        assert heavy.status_code < 500, heavy.text
        after = _chat(server, messages=hello, max_tokens=2).json()["usage"]["prompt_tokens"]
        assert after == before  # the model's own format, not the fallback's
    finally:
        server.stop()
