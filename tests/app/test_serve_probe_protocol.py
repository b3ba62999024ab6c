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
