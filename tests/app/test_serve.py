"""`specdeck serve` against real clients: the official `openai` package and raw HTTP, on 127.0.0.1.

The server runs the real engine worker on a tiny fixture model with the n-gram drafter on. Every bad
request must come back as a 4xx with a message while the server goes on serving and the history keeps
every exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.engine.client import EngineClient
from app.engine.llama import Model
from app.errors import SettingsError
from app.events import Finished, PromptProcessed, Token
from app.params import DraftSettings, LoadSettings, SamplingSettings
from app.serve.metrics import ServeMetrics
from app.serve.protocol import Limits
from app.serve.runner import EngineRunner
from app.serve.server import ServeOptions, Server
from app.storage.history import HistoryStore

CTX = 512
# Repetitive text: the n-gram drafter finds matches in it, so drafts are proposed and some accepted.
PROMPT = "abc abc abc abc abc abc abc abc abc abc abc abc"
MESSAGES = [{"role": "user", "content": PROMPT}]


def start_server(target: Path, history: Path, *, k: int | None = None, n_ctx: int = CTX, max_tokens: int = 256,
                 **options: Any) -> Server:
    settings = LoadSettings(target_path=str(target), n_ctx=n_ctx,
                            draft=DraftSettings(ngram=2, adaptive=k is None, k=k if k is not None else 4))
    metrics = ServeMetrics()
    runner = EngineRunner(settings, metrics, history_path=history)
    server = Server(runner, metrics, ServeOptions(port=0, limits=Limits(max_tokens=max_tokens), **options))
    server.start_in_thread()
    deadline = time.monotonic() + 120
    while httpx.get(server.base_url + "/health").status_code != 200:
        assert runner.state in ("loading", "ready"), runner.message
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.1)
    return server


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    history = tmp_path_factory.mktemp("serve") / "history.sqlite3"
    server = start_server(tiny_target, history, max_waiting=1)
    yield server, history
    server.stop()


@pytest.fixture
def oai(served: tuple[Server, Path]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[0].base_url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client  # closed after the test: a socket left to the collector fails whichever test it lands in


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + (f"{{position={sample.labels['position']}}}" if "position" in sample.labels else "")
            out[key] = sample.value
    return out


def api_chats(history: Path) -> list[tuple[int, int]]:
    """(chat id, message count) of every chat the server saved."""
    with HistoryStore(history) as store:
        return [(c.id, c.message_count) for c in store.list_chats()]


def assert_serving(server: Server) -> None:
    assert httpx.get(server.base_url + "/health").status_code == 200
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                   json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    server.runner.sync_history()  # saved on the history's own thread: wait for it before reading the file


# --- the openai client ------------------------------------------------------------------------------


def test_models_lists_the_loaded_target(oai: openai.OpenAI, tiny_target: Path) -> None:
    models = oai.models.list()
    assert [m.id for m in models.data] == [tiny_target.name]


def test_chat_non_streaming_counts_match_metrics(oai: openai.OpenAI, served: tuple[Server, Path]) -> None:
    before = counters(served[0].base_url)
    response = oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=48, temperature=0)
    after = counters(served[0].base_url)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert response.usage is not None
    assert response.usage.completion_tokens >= 1
    extra = response.model_extra or {}
    stats, timings = extra["stats"], extra["timings"]
    drafted = (after["specdeck:spec_decode_num_draft_tokens_total"]
               - before["specdeck:spec_decode_num_draft_tokens_total"])
    accepted = (after["specdeck:spec_decode_num_accepted_tokens_total"]
                - before["specdeck:spec_decode_num_accepted_tokens_total"])
    assert drafted > 0, "the n-gram drafter proposed nothing on a repetitive prompt"
    assert stats["total_draft_tokens_count"] == drafted == timings["draft_n"]
    assert stats["accepted_draft_tokens_count"] == accepted == timings["draft_n_accepted"]
    assert stats["rejected_draft_tokens_count"] == drafted - accepted
    per_pos = sum(v - before.get(k, 0.0) for k, v in after.items()
                  if k.startswith("specdeck:spec_decode_num_accepted_tokens_per_pos_total"))
    assert per_pos == accepted
    assert timings["prompt_n"] == response.usage.prompt_tokens
    assert timings["predicted_per_second"] > 0


def test_chat_streaming_with_usage(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=32, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    text, finish, usage, last_extra = "", None, None, {}
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            if chunk.choices[0].finish_reason:
                last_extra = chunk.model_extra or {}
        if chunk.usage is not None:
            usage = chunk.usage
    assert finish in ("stop", "length")
    assert usage is not None
    assert usage.completion_tokens >= 1
    assert last_extra["stats"]["total_draft_tokens_count"] == last_extra["timings"]["draft_n"]
    assert usage.completion_tokens >= len(text.encode()) // 16  # text came with the tokens (bytes vocab)


def test_completions_endpoint(oai: openai.OpenAI) -> None:
    response = oai.completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0)
    assert response.object == "text_completion"
    assert response.usage is not None
    assert response.usage.completion_tokens >= 1


def test_completions_feed_the_prompt_raw(oai: openai.OpenAI, tiny_target: Path) -> None:
    """/v1/completions is the engine's completion mode: the prompt's own tokens, with no chat template, and
    control-token text in it stays plain text."""
    prompt = "Once upon a time<|im_end|>"
    model = Model(tiny_target, vocab_only=True)
    try:
        raw = ([model.bos] if model.add_bos and model.bos >= 0 else []) + model.tokenize(prompt, parse_special=False)
        special = model.tokenize(prompt, parse_special=True)
    finally:
        model.close()
    assert len(special) < len(raw) - 1  # the control-token text is one token when parsed as special
    completion = oai.completions.create(model="any", prompt=prompt, max_tokens=2, temperature=0)
    chat = oai.chat.completions.create(model="any", messages=[{"role": "user", "content": prompt}], max_tokens=2,
                                       temperature=0)
    assert completion.usage is not None
    assert chat.usage is not None
    assert completion.usage.prompt_tokens == len(raw)
    assert chat.usage.prompt_tokens != len(raw)  # the chat template wraps the same text in more tokens


@pytest.mark.server
def test_counts_equal_the_engine_run_in_process(tiny_target: Path, tmp_path: Path) -> None:
    """Fixed depth, greedy, fresh caches on both sides: the API reports the engine's own drafted/accepted."""
    server = start_server(tiny_target, tmp_path / "h.sqlite3", k=3)
    try:
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                       json={"messages": MESSAGES, "max_tokens": 48, "temperature": 0}).json()
    finally:
        server.stop()
    client = EngineClient()
    try:
        client.load(LoadSettings(target_path=str(tiny_target), n_ctx=CTX,
                                 draft=DraftSettings(ngram=2, adaptive=False, k=3)))
        list(client.events())
        client.generate(MESSAGES, SamplingSettings(temperature=0, top_p=1.0, max_tokens=48))
        finished = next(e for e in client.events() if isinstance(e, Finished))
    finally:
        client.close()
    assert r["stats"]["total_draft_tokens_count"] == finished.stats.drafted > 0
    assert r["stats"]["accepted_draft_tokens_count"] == finished.stats.accepted
    assert r["choices"][0]["message"]["content"] == finished.text
    assert r["usage"]["completion_tokens"] == finished.stats.completion_tokens


# --- /metrics ------------------------------------------------------------------------------------


def test_metrics_parse_and_carry_the_spec_decode_counters(served: tuple[Server, Path]) -> None:
    response = httpx.get(served[0].base_url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    names = {s.name for f in text_string_to_metric_families(response.text) for s in f.samples}
    for name in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "tokens_predicted_total",
                 "tokens_predicted_seconds_total", "prompt_tokens_total", "kv_cache_usage_perc",
                 "plain_tokens_per_second"):
        assert "specdeck:" + name in names


# --- bad requests over raw HTTP -------------------------------------------------------------------


def raw_post(server: Server, body: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(server.base_url + path, content=body, headers={"Content-Type": "application/json"},
                      timeout=120)


@pytest.mark.parametrize(("body", "status", "words"), [
    (b'{"messages": [', 400, "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "NaN"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', 400, "finite"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000000000}', 400, "max_tokens"),
    (b'{"messages": "hi"}', 400, "messages"),
    (b'[1, 2]', 400, "JSON object"),
    (b'{"messages": [{"role": "tool", "content": "x"}]}', 400, "tool_call_id"),
    (b'{"messages": [{"role": "function", "content": "x"}]}', 400, "role"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400, "text parts"),
    (os.urandom(1 << 20), 400, "not valid JSON"),
])
def test_bad_requests_get_a_4xx_with_a_message(served: tuple[Server, Path], body: bytes, status: int,
                                               words: str) -> None:
    server, history = served
    server.runner.sync_history()  # an earlier test's answer is saved before counting
    chats = api_chats(history)
    response = raw_post(server, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"
    assert api_chats(history) == chats
    assert_serving(server)


def test_body_over_the_cap_is_413(served: tuple[Server, Path]) -> None:
    server = served[0]
    response = raw_post(server, b'{"pad": "' + b"x" * (server.options.limits.body_bytes + 10) + b'"}')
    assert response.status_code == 413
    assert "at most" in response.json()["error"]["message"]
    assert_serving(server)


def test_prompt_over_the_context_is_context_length_exceeded(served: tuple[Server, Path]) -> None:
    server, history = served
    server.runner.sync_history()
    chats_before = len(api_chats(history))
    body = {"messages": [{"role": "user", "content": "xq" * CTX}], "max_tokens": 4}  # bytes vocab: > CTX tokens
    response = raw_post(server, json.dumps(body).encode())
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert str(CTX) in error["message"]
    assert_serving(server)
    # Only the answered one is saved: a prompt is written to the history once it is in the context (a flood
    # of messages refused as too long wrote every one of them first).
    assert len(api_chats(history)) == chats_before + 1


def test_unknown_route_and_method(served: tuple[Server, Path]) -> None:
    server = served[0]
    assert httpx.get(server.base_url + "/v1/nothing").status_code == 404
    assert httpx.get(server.base_url + "/v1/chat/completions").status_code == 405


def test_client_that_disconnects_mid_stream(served: tuple[Server, Path]) -> None:
    server, history = served
    body = json.dumps({"messages": MESSAGES, "max_tokens": 256, "temperature": 0, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert b"200 OK" in sock.recv(4096)  # headers and the first chunk, then hang up
    deadline = time.monotonic() + 60
    while server.runner.metrics.requests_processing._value.get():  # the engine stops within one pass
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert_serving(server)
    with HistoryStore(history) as store:
        answers = [m for c in store.list_chats() for m in store.messages(c.id) if m.role == "assistant"]
    assert all(m.status != "streaming" for m in answers)
    assert any(m.stop_reason in ("cancelled", "max_tokens", "eog") for m in answers)


def test_a_second_client_gets_429_with_retry_after(served: tuple[Server, Path]) -> None:
    server = served[0]
    admission = server.web.admission
    assert server.loop is not None
    # Hold the one slot and fill the queue (max_waiting=1) exactly as two running clients would.
    asyncio.run_coroutine_threadsafe(admission.acquire(), server.loop).result(10)
    waiter = asyncio.run_coroutine_threadsafe(admission.acquire(), server.loop)
    try:
        deadline = time.monotonic() + 10
        while admission.waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        response = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": MESSAGES}, timeout=30)
        assert response.status_code == 429
        assert int(response.headers["Retry-After"]) >= 1
        assert "another request" in response.json()["error"]["message"]
    finally:
        server.loop.call_soon_threadsafe(admission.release)
        waiter.result(10)
        server.loop.call_soon_threadsafe(admission.release)
    assert_serving(server)


def test_history_marks_api_requests(served: tuple[Server, Path]) -> None:
    server, history = served
    assert_serving(server)
    with HistoryStore(history) as store:
        chats = store.list_chats()
        assert chats
        assert all(c.origin == "api" for c in chats)
        last = store.messages(chats[0].id)
    assert [m.role for m in last] == ["user", "assistant"]
    assert last[0].text == PROMPT
    assert last[1].status == "complete"
    assert last[1].stats
    assert last[1].stats["completion_tokens"] >= 1


def test_engine_killed_answers_500_or_recovers_and_serves_again(served: tuple[Server, Path]) -> None:
    server = served[0]
    pid = server.runner.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:  # the next request restarts the worker and loads the model again
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                       json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
        if r.status_code == 200:
            break
        assert r.status_code in (500, 503), r.text
        assert r.json()["error"]["message"]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert server.runner.worker_pid not in (None, pid)
    assert server.runner.restarts >= 1
    assert_serving(server)


# --- options --------------------------------------------------------------------------------------


def test_non_loopback_needs_an_api_key() -> None:
    with pytest.raises(SettingsError, match="API key"):
        ServeOptions(host="0.0.0.0").check()
    assert ServeOptions(host="0.0.0.0", api_key="k").check().host == "0.0.0.0"
    assert ServeOptions(host="::1").check().host == "::1"


@pytest.mark.server
def test_api_key_is_required_when_set(tiny_target: Path, tmp_path: Path) -> None:
    settings = LoadSettings(target_path=str(tiny_target), n_ctx=CTX, draft=DraftSettings(ngram=2))
    metrics = ServeMetrics()
    server = Server(EngineRunner(settings, metrics, history_path=None), metrics,
                    ServeOptions(port=0, api_key="sesame"))
    server.start_in_thread()
    try:
        assert httpx.get(server.base_url + "/health").status_code in (200, 503)  # /health is open
        refused = httpx.get(server.base_url + "/v1/models")
        assert refused.status_code == 401
        assert "API key" in refused.json()["error"]["message"]
        assert httpx.get(server.base_url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.get(server.base_url + "/v1/models", headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200
    finally:
        server.stop()


# --- the remote reader on SpecDeck's own server ---------------------------------------------------


def test_remote_reader_sees_the_served_counts(served: tuple[Server, Path], tiny_target: Path) -> None:
    from app.remote.client import RemoteEngine
    from app.remote.scrape import rates

    with RemoteEngine(served[0].base_url) as remote:
        info = remote.discover()
        assert info.engine == "SpecDeck"
        assert info.models == (tiny_target.name,)
        assert info.n_ctx == CTX
        assert info.speculation == "n-gram 2"
        before = remote.scrape()
        events = list(remote.chat(MESSAGES, max_tokens=48, temperature=0))
        after = remote.scrape()
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.text
    assert finished.stats.drafted > 0
    figures = rates(before, after)
    # The dashboard's acceptance from counter deltas is the answer's own, exactly: the same passes feed both.
    assert figures.acceptance == finished.stats.accepted / finished.stats.drafted
    # tok/s from counter deltas over one whole answer is that answer's decode rate (the subtraction of two
    # float sums is the only difference).
    assert figures.tokens_per_second == pytest.approx(finished.stats.decode_tps, rel=1e-9)
    assert figures.tokens_per_second > 0
    assert figures.kv_usage is not None
    assert 0 < figures.kv_usage <= 1
    assert "specdeck:tokens_predicted_total" in figures.sources["tokens_per_second"]


def test_the_token_counters_move_while_an_answer_streams(served: tuple[Server, Path]) -> None:
    """Another client's answer is read live (the window's Remote dock): tokens and seconds predicted move pass
    by pass, not only when the answer ends; the whole answer's totals stay its decode window."""
    from app.remote.client import RemoteEngine
    from app.remote.scrape import rates

    with RemoteEngine(served[0].base_url) as remote:
        before = remote.scrape()
        chunks = 0
        mid = None
        events = []
        for event in remote.chat(MESSAGES, max_tokens=200, temperature=0):
            events.append(event)
            if isinstance(event, Token):
                chunks += 1  # one verify pass's text each: 200 tokens are 12 passes or more (K_MAX + 1 a pass)
                if mid is None and chunks == 8:
                    mid = remote.scrape()  # the answer is still being written
        after = remote.scrape()
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert mid is not None, f"the answer came in {chunks} chunks"
    live = rates(before, mid)
    assert live.tokens_per_second is not None
    assert live.tokens_per_second > 0
    assert before.counters["tokens"] < mid.counters["tokens"] <= after.counters["tokens"]
    whole = rates(before, after)
    assert whole.tokens_per_second == pytest.approx(finished.stats.decode_tps, rel=1e-9)


def test_remote_client_stops_an_answer_and_the_server_goes_on(served: tuple[Server, Path]) -> None:
    """The window's Stop on a remote model: the stream is closed at the next chunk, the answer ends
    "cancelled" with the text that came, and the server serves the next request."""
    from app.remote.client import RemoteEngine

    events: list[object] = []
    with RemoteEngine(served[0].base_url) as remote:
        for event in remote.chat(MESSAGES, max_tokens=200, temperature=0, request_id=7,
                                 cancelled=lambda: any(isinstance(e, Token) for e in events)):
            events.append(event)
    tokens = [e for e in events if isinstance(e, Token)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.reason == "cancelled"
    assert finished.request_id == 7
    assert finished.text == "".join(t.text for t in tokens)
    assert_serving(served[0])


def test_remote_completion_mode_is_the_raw_prompt(served: tuple[Server, Path], tiny_target: Path) -> None:
    """Completion mode on a remote model goes to /v1/completions: the server feeds the prompt raw."""
    from app.remote.client import RemoteEngine

    prompt = "Once upon a time"
    model = Model(tiny_target, vocab_only=True)
    try:
        raw = ([model.bos] if model.add_bos and model.bos >= 0 else []) + model.tokenize(prompt, parse_special=False)
    finally:
        model.close()
    with RemoteEngine(served[0].base_url) as remote:
        events = list(remote.complete(prompt, max_tokens=4, temperature=0))
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.stats.prompt_tokens == len(raw)
    processed = [e for e in events if isinstance(e, PromptProcessed)]  # from the per-chunk timings
    assert [e.prompt_tokens for e in processed] == [len(raw)]
    assert finished.text == "".join(e.text for e in events if isinstance(e, Token))


@pytest.mark.server
def test_engine_crash_mid_answer_is_an_error_in_the_stream_and_the_worker_restarts(tiny_target: Path,
                                                                                   tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "h.sqlite3", n_ctx=4096, max_tokens=4000)
    try:
        body = {"messages": MESSAGES, "max_tokens": 4000, "temperature": 0, "stream": True}
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # generating now
            pid = server.runner.worker_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # thousands of tokens are still to come
            rest = [line for line in lines if line.startswith("data:")]
        errors = [json.loads(line[5:])["error"] for line in rest if '"error"' in line and line.startswith("data: {")]
        assert len(errors) == 1
        assert "crashed" in errors[0]["message"]
        assert "SIGKILL" in errors[0]["message"]
        assert rest[-1] == "data: [DONE]"
        assert httpx.get(server.base_url + "/health").status_code == 503  # loading the model again
        deadline = time.monotonic() + 120
        while server.runner.state != "ready":
            assert server.runner.state == "loading", server.runner.message
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert_serving(server)
        assert server.runner.restarts == 1
    finally:
        server.stop()


def _newest_answer(path: Path) -> tuple[str, str, str | None]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        row: tuple[str, str, str | None] = conn.execute(
            "SELECT text, status, stop_reason FROM messages WHERE role='assistant' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    return row


def test_stop_sequences_cut_the_answer_and_the_history_keeps_the_cut(oai: openai.OpenAI,
                                                                     served: tuple[Server, Path]) -> None:
    first = oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=48, temperature=0)
    text = first.choices[0].message.content or ""
    assert len(text) > 12
    stop = text[8:11]  # greedy: the same prompt again almost surely writes this again
    for stream in (False, True):
        if stream:
            chunks = list(oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=48, temperature=0,
                                                      stop=[stop], stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
        else:
            response = oai.chat.completions.create(model="any", messages=MESSAGES, max_tokens=48, temperature=0,
                                                   stop=[stop])
            content, finish = response.choices[0].message.content or "", response.choices[0].finish_reason
        assert stop not in content
        if finish == "stop":
            assert content == text[: text.find(stop)] or len(content) < len(text)
            # The answer returns when the stop sequence shows; the engine is cancelled after it and the
            # history gets the cut answer when the engine ends. The history is read without opening a
            # HistoryStore, which would mark the answer still streaming as interrupted (another SpecDeck).
            served[0].runner.sync_history()
            deadline = time.monotonic() + 60
            while True:
                saved_text, status, stop_reason = _newest_answer(served[1])
                if status != "streaming" or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert saved_text == content
            assert status == "complete"
            assert stop_reason == "stop"


def test_a_foreign_host_header_is_refused_on_loopback(served: tuple[Server, Path]) -> None:
    """DNS rebinding: a page served from evil.example that resolves to 127.0.0.1 must not reach the model."""
    server = served[0]
    refused = httpx.get(server.base_url + "/v1/models", headers={"Host": f"evil.example:{server.port}"})
    assert refused.status_code == 400
    assert httpx.get(server.base_url + "/v1/models", headers={"Host": f"localhost:{server.port}"}).status_code == 200
