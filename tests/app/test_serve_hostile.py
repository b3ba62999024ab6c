"""`specdeck serve` under attack (issue 28): web pages, DNS rebinding on every loopback address, clients that
stop reading, idle sockets, floods of messages, and OpenAI's contract kept to the letter.

Every case runs the real server (uvicorn, the real engine worker on a tiny fixture model) and a real client.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.errors import SettingsError
from app.serve import protocol
from app.serve.api_error import ApiError
from app.serve.protocol import Limits
from app.serve.server import ServeOptions, Server
from tests.app.test_serve import MESSAGES, PROMPT, api_chats, start_server


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    history = tmp_path_factory.mktemp("serve-hostile") / "history.sqlite3"
    server = start_server(tiny_target, history, max_waiting=2)
    yield server, history
    server.stop()


def _rows(history: Path) -> int:
    with sqlite3.connect(history) as db:
        return int(db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])


# --- web pages and DNS rebinding ------------------------------------------------------------------------

BODY = json.dumps({"messages": MESSAGES, "max_tokens": 4}).encode()


@pytest.mark.parametrize(("headers", "status"), [
    ({"Content-Type": "text/plain"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ({}, 415),
    ({"Content-Type": "application/json", "Origin": "null"}, 403),
    ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
    ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, 403),  # another local page
])
def test_what_a_web_page_can_send_without_a_preflight_is_refused(served: tuple[Server, Path],
                                                                  headers: dict[str, str], status: int) -> None:
    server, history = served
    server.runner.sync_history()  # an earlier test's answer is saved before counting
    before = _rows(history)
    r = httpx.post(server.base_url + "/v1/chat/completions", content=BODY, headers=headers, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    assert "access-control-allow-origin" not in r.headers
    assert _rows(history) == before  # the model did not run, nothing reached the history


def test_the_servers_own_origin_and_plain_clients_are_served(served: tuple[Server, Path]) -> None:
    server = served[0]
    own = httpx.post(server.base_url + "/v1/chat/completions", content=BODY, timeout=120,
                     headers={"Content-Type": "application/json; charset=utf-8", "Origin": server.base_url})
    assert own.status_code == 200, own.text


@pytest.mark.parametrize("host", ["::1", "127.0.0.2"])
@pytest.mark.server
def test_every_loopback_address_checks_the_host_and_answers_its_own(tiny_target: Path, tmp_path: Path,
                                                                    host: str) -> None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
    except OSError:
        pytest.skip(f"{host} is not available on this machine")
    server = start_server(tiny_target, tmp_path / "h.sqlite3", host=host)
    try:
        assert httpx.get(server.base_url + "/health").status_code == 200  # its own address is taken
        for evil in ("evil.example", f"evil.example:{server.port}", "[::2]", "127.0.0.1.evil.example"):
            refused = httpx.get(server.base_url + "/v1/models", headers={"Host": evil})
            assert refused.status_code == 400, evil
        for own in (f"localhost:{server.port}", f"[::1]:{server.port}", f"127.0.0.1:{server.port}"):
            assert httpx.get(server.base_url + "/v1/models", headers={"Host": own}).status_code == 200, own
    finally:
        server.stop()


# --- clients that hold connections ----------------------------------------------------------------------


@pytest.mark.server
def test_a_streaming_client_that_stops_reading_frees_the_slot(tiny_target: Path, tmp_path: Path) -> None:
    """It fills the socket buffers; past the send deadline it is dropped and the next client is answered."""
    history = tmp_path / "stall.sqlite3"
    server = start_server(tiny_target, history, n_ctx=4096, max_tokens=4000, send_timeout_seconds=1.0,
                          wait_seconds=300.0)  # filling the buffers takes a minute or more on a busy machine
    stalled = socket.socket()
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        stalled.connect(("127.0.0.1", server.port))
        body = json.dumps({"messages": MESSAGES, "max_tokens": 4000, "stream": True, "temperature": 1.0,
                           "timings_per_token": True}).encode()
        stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)  # it is answering the stalled client now
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=330,
                       json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
    finally:
        stalled.close()
        server.stop()


@pytest.mark.server
def test_idle_and_slow_connections_are_closed_and_capped(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "idle.sqlite3", head_timeout_seconds=1.0, max_connections=8)
    held = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127")  # a head that never ends
            held.append(s)
        closed = 0
        for s in held:
            s.settimeout(20)
            try:
                data = s.recv(4096)  # the server closes it: over the cap at once, the rest at the deadline
            except TimeoutError:
                continue  # still held open: not closed
            except OSError:  # reset by the server
                data = b""
            closed += data == b"" or data.startswith(b"HTTP/1.1 503")
        assert closed == len(held)
        assert httpx.get(server.base_url + "/health").status_code == 200
    finally:
        for s in held:
            s.close()
        server.stop()


# --- floods ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [10_000, 100_000])
def test_a_flood_of_messages_is_refused_before_the_history(served: tuple[Server, Path], count: int) -> None:
    server, history = served
    server.runner.sync_history()  # an earlier test's answer is saved before counting
    before = _rows(history)
    flood = [{"role": "user", "content": ""}] * count
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": flood}, timeout=120)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    assert str(protocol.MAX_MESSAGES) in r.json()["error"]["message"]
    assert _rows(history) == before


def test_a_prompt_too_long_writes_nothing_to_the_history(served: tuple[Server, Path]) -> None:
    server, history = served
    server.runner.sync_history()  # an earlier test's answer is saved before counting
    before = (_rows(history), len(api_chats(history)))
    long = [{"role": "user", "content": "word " * 20}] * 100  # far over the 512-token context
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": long}, timeout=120)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert (_rows(history), len(api_chats(history))) == before


@pytest.mark.parametrize("value", ["9" * 400, "-" + "9" * 400, "1" + "0" * 5000])
def test_absurd_numbers_are_a_400_naming_the_field(served: tuple[Server, Path], value: str) -> None:
    body = b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + value.encode() + b"}"
    r = httpx.post(served[0].base_url + "/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert "Traceback" not in r.text


def test_nesting_is_named_as_nesting() -> None:
    with pytest.raises(ApiError, match="nested too deeply"):
        protocol.parse_json(b"[" * 100_000 + b"]" * 100_000, Limits())
    with pytest.raises(ApiError, match="not UTF-8"):
        protocol.parse_json(b'{"a": "\xff"}', Limits())


# --- OpenAI's contract ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value"), [
    ("functions", [{"name": "f"}]),
    ("function_call", {"name": "f"}),
    ("audio", {"voice": "alloy"}),
    ("prediction", {"type": "content", "content": "x"}),
    ("n_probs", 3),
    ("mirostat", 2),
])
def test_unsupported_parameters_are_a_400_with_param(name: str, value: Any) -> None:
    body = {"messages": MESSAGES, name: value}
    with pytest.raises(ApiError) as caught:
        protocol.parse_request(body, Limits(), chat=True)
    assert caught.value.status == 400
    assert caught.value.param == name


@pytest.mark.parametrize(("name", "value"), [
    ("logprobs", False), ("presence_penalty", 0), ("frequency_penalty", 0.0), ("logit_bias", {}),
    ("tool_choice", "none"), ("tools", []), ("response_format", {"type": "text"}),
])
def test_neutral_values_of_unsupported_parameters_are_accepted(name: str, value: Any) -> None:
    protocol.parse_request({"messages": MESSAGES, name: value}, Limits(), chat=True)


def test_stream_options_need_stream() -> None:
    with pytest.raises(ApiError) as caught:
        protocol.parse_request({"messages": MESSAGES, "stream_options": {"include_usage": True}}, Limits(),
                               chat=True)
    assert caught.value.param == "stream_options"
    protocol.parse_request({"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
                           Limits(), chat=True)


def test_serve_options_raise_the_apps_error() -> None:
    with pytest.raises(SettingsError, match="API key"):
        ServeOptions(host="0.0.0.0").check()
    with pytest.raises(SettingsError, match="port"):
        ServeOptions(port=70_000).check()


def test_chunks_share_created_and_say_usage_null(served: tuple[Server, Path]) -> None:
    server = served[0]
    chunks = []
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", timeout=120, json={
            "messages": MESSAGES, "max_tokens": 24, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert len(chunks) >= 3
    assert len({c["created"] for c in chunks}) == 1
    assert len({c["id"] for c in chunks}) == 1
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] >= 1


def test_a_model_is_found_by_its_id(served: tuple[Server, Path], tiny_target: Path) -> None:
    server = served[0]
    found = httpx.get(f"{server.base_url}/v1/models/{tiny_target.name}")
    assert found.status_code == 200
    assert found.json()["id"] == tiny_target.name
    assert found.json()["object"] == "model"
    missing = httpx.get(f"{server.base_url}/v1/models/gpt-4o")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def _spec(server: Server, k: int | None, max_tokens: int) -> dict[str, Any]:
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.parametrize("k", [0, 1, 16])
@pytest.mark.server
def test_draft_tokens_never_count_against_max_tokens(tiny_target: Path, tmp_path: Path, k: int) -> None:
    """At fixed depth k, with the n-gram drafter on a repetitive prompt, max_tokens counts emitted tokens only;
    the per-response vLLM statistics add up."""
    server = start_server(tiny_target, tmp_path / "k.sqlite3", k=k)
    try:
        for max_tokens in (1, 7, 40):
            body = _spec(server, k, max_tokens)
            usage, spec = body["usage"], body["metrics"]["speculative_decoding"]
            finish = body["choices"][0]["finish_reason"]
            assert usage["completion_tokens"] <= max_tokens
            if finish == "length":
                assert usage["completion_tokens"] == max_tokens
            assert spec["num_draft_tokens"] == body["stats"]["total_draft_tokens_count"]
            assert spec["num_accepted_draft_tokens"] == body["stats"]["accepted_draft_tokens_count"]
            assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
            assert sum(i * n for i, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"]
            by_length = spec["acceptance_histogram_by_draft_length"]
            assert sum(int(d) * sum(h) for d, h in by_length.items()) == spec["num_draft_tokens"]
            if k == 0:
                assert spec["num_draft_tokens"] == 0
            else:
                assert all(int(d) <= k for d in by_length)
                if spec["num_spec_steps"]:
                    assert spec["mean_acceptance_length"] == pytest.approx(
                        1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"])
        if k:
            assert spec["num_draft_tokens"] > 0, "the n-gram drafter proposed nothing on a repetitive prompt"
    finally:
        server.stop()


# --- response_format: a grammar on the target's distribution -------------------------------------------------

YES_NO = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
          "required": ["answer"], "additionalProperties": False}


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "integer", "minimum": 3}, "minimum"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}, "email"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
    ({"$ref": "https://example.com/schema.json"}, "https://example.com/schema.json"),
    ({"type": "tuple"}, "tuple"),
])
def test_a_schema_outside_the_subset_is_a_400_naming_it(schema: dict[str, Any], named: str) -> None:
    body = {"messages": MESSAGES, "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "s", "schema": schema}}}
    with pytest.raises(ApiError) as caught:
        protocol.parse_request(body, Limits(), chat=True)
    assert caught.value.status == 400
    assert caught.value.param == "response_format"
    assert named in caught.value.message


@pytest.mark.server
def test_the_openai_client_gets_json_that_fits_the_schema_and_speculation_stays_exact(
        tiny_target: Path, tmp_path: Path) -> None:
    """Greedy answers under the grammar are the same with drafting (n-gram, depth 4) as without (depth 0): the
    drafts are verified against the constrained distribution."""
    import openai

    answers = {}
    for k in (0, 4):
        server = start_server(tiny_target, tmp_path / f"rf{k}.sqlite3", k=k)
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            response = client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": PROMPT}], max_tokens=200, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "yes_no", "schema": YES_NO}})
            content = response.choices[0].message.content or ""
            assert response.choices[0].finish_reason == "stop", content
            value = json.loads(content)
            assert value["answer"] in ("yes", "no")
            assert set(value) <= {"answer", "n"}
            assert isinstance(value.get("n", 0), int)
            answers[k] = content
            for seed in range(3):  # sampled: drafts accepted by p/q or replaced from the residual, all inside
                sampled = client.chat.completions.create(
                    model="any", messages=[{"role": "user", "content": PROMPT}], max_tokens=200, temperature=1.0,
                    seed=seed, response_format={"type": "json_schema",
                                                "json_schema": {"name": "yes_no", "schema": YES_NO}})
                assert json.loads(sampled.choices[0].message.content or "")["answer"] in ("yes", "no")
            obj = client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": PROMPT}], max_tokens=64, temperature=0.8, seed=k,
                response_format={"type": "json_object"})
            text = obj.choices[0].message.content or ""
            assert text.startswith("{")
            if obj.choices[0].finish_reason == "stop":
                assert isinstance(json.loads(text), dict)
        finally:
            client.close()  # its connection pool, before the server goes
            server.stop()
    assert answers[0] == answers[4]
