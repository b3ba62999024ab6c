"""Remote engines: figures from recorded vLLM and SGLang /metrics texts (tests/data, names and their sources
in tests/data/README.md), and real HTTP servers on 127.0.0.1 that answer well, answer garbage, or die in the
middle of an answer. What a server does not expose must come back as None (not reported), never as 0.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.events import Finished, PromptProcessed, Token
from app.remote.client import RemoteEngine, RemoteModel
from app.remote.scrape import RemoteError, kv_usage_from_slots, parse_metrics, rates, read_scrape, reported

DATA = Path(__file__).resolve().parent.parent / "data"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


# --- figures from recorded texts ------------------------------------------------------------------


def test_vllm_rates_come_from_counter_deltas() -> None:
    before = read_scrape(recorded("metrics_vllm_1.txt"), t=100.0)
    after = read_scrape(recorded("metrics_vllm_2.txt"), t=110.0)
    assert before.prefix == after.prefix == "vllm"
    r = rates(before, after)
    # Written so that: +2000 tokens, +200 drafts, +600 draft tokens, +360 accepted (160/120/80 per position),
    # +2e12 bytes read per GPU, over 10 s.
    assert r.tokens_per_second == pytest.approx(200.0)
    assert r.acceptance == pytest.approx(0.6)
    assert r.mean_accepted_length == pytest.approx(2.8)
    assert r.per_position_acceptance == pytest.approx((0.8, 0.6, 0.4))
    assert r.read_bytes_per_second == pytest.approx(2e11)
    assert r.kv_usage == pytest.approx(0.25)
    assert r.plain_tokens_per_second is None
    assert "vllm:generation_tokens_total" in r.sources["tokens_per_second"]
    assert "vllm:spec_decode_num_accepted_tokens_total" in r.sources["acceptance"]
    assert r.sources["kv_usage"] == "vllm:kv_cache_usage_perc"


def test_old_vllm_name_and_what_it_does_not_report() -> None:
    scrape = read_scrape(recorded("metrics_vllm_v0.txt"), t=0.0)
    r = rates(scrape, read_scrape(recorded("metrics_vllm_v0.txt"), t=5.0))
    assert r.kv_usage == pytest.approx(0.5)
    assert r.sources["kv_usage"] == "vllm:gpu_cache_usage_perc"
    # Nothing drafted, nothing generated in the interval, no MFU counter: not reported, not zero.
    assert r.acceptance is None
    assert r.per_position_acceptance is None
    assert r.tokens_per_second is None
    assert r.read_bytes_per_second is None
    exposed = reported(scrape)
    assert exposed["tokens_per_second"]
    assert exposed["acceptance"]
    assert not exposed["read_bytes_per_second"]
    assert not exposed["plain_tokens_per_second"]


def test_sglang_prefers_its_counter_and_reads_speculation_from_gauges() -> None:
    before = read_scrape(recorded("metrics_sglang_1.txt"), t=0.0)
    after = read_scrape(recorded("metrics_sglang_2.txt"), t=10.0)
    assert after.prefix == "sglang"
    r = rates(before, after)
    assert r.tokens_per_second == pytest.approx(150.0)  # +1500 generation tokens over 10 s, not the gauge
    assert r.acceptance == pytest.approx(0.6667)
    assert r.mean_accepted_length == pytest.approx(3.0)
    assert "gauge" in r.sources["acceptance"]
    assert r.per_position_acceptance is None  # SGLang has no per-position counter
    assert not reported(after)["per_position_acceptance"]
    assert r.kv_usage == pytest.approx(0.3)


def test_a_counter_that_goes_back_gives_no_rate() -> None:
    """A restarted server starts its counters at 0: that interval has no rate rather than a negative one."""
    r = rates(read_scrape(recorded("metrics_vllm_2.txt"), t=0.0), read_scrape(recorded("metrics_vllm_1.txt"), t=1.0))
    assert r.tokens_per_second is None
    assert r.acceptance is None


def test_garbage_metrics_text_is_a_message() -> None:
    with pytest.raises(RemoteError, match="Prometheus"):
        parse_metrics("this is {not metrics\n")


def test_llama_server_rates_from_a_real_scrape() -> None:
    """Two real scrapes around one answer whose timings were predicted_n 200 in 10810.387 ms, draft_n 162,
    draft_n_accepted 108 (tests/data/README.md): the rates are that answer's own."""
    before = read_scrape(recorded("metrics_llamacpp_1.txt"), 0.0)
    after = read_scrape(recorded("metrics_llamacpp_2.txt"), 30.0, kv_from_slots=0.0)
    assert after.prefix == "llamacpp"
    figures = rates(before, after)
    # The counter rounds the seconds to 10.8104 (six significant digits).
    assert figures.tokens_per_second == pytest.approx(200 / 10.810387, rel=1e-5)
    assert figures.acceptance == 108 / 162
    assert figures.mean_accepted_length == 1 + 108 / 4  # 4 verify steps that drafted
    assert figures.per_position_acceptance is not None
    assert figures.per_position_acceptance[0] == 1.0
    assert sum(figures.per_position_acceptance) * 4 == 108
    exposed = reported(after)
    assert not exposed["read_bytes_per_second"]
    assert not exposed["plain_tokens_per_second"]
    assert exposed["kv_usage"]  # from /slots
    assert figures.read_bytes_per_second is None
    assert figures.plain_tokens_per_second is None


def test_remote_model_labels() -> None:
    """llama-server without --alias names its model by the file's path: the picker shows the file name."""
    served = RemoteModel("/models/SmolLM2-135M-Instruct.Q4_1.gguf", "http://127.0.0.1:8080", "llama-server")
    assert served.label == "SmolLM2-135M-Instruct.Q4_1.gguf — remote, 127.0.0.1:8080"
    assert served.model == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # what requests name
    hub = RemoteModel("Qwen/Qwen3-8B", "https://gpu.example:8000/", "vLLM")
    assert hub.label == "Qwen/Qwen3-8B — remote, gpu.example:8000"


def test_kv_from_llama_server_slots() -> None:
    slots = [
        {"id": 0, "n_ctx": 4096, "is_processing": True, "n_prompt_tokens": 1000, "next_token": [{"n_decoded": 24}]},
        {"id": 1, "n_ctx": 4096, "is_processing": False, "n_prompt_tokens": 3000, "next_token": [{"n_decoded": 5}]},
    ]
    assert kv_usage_from_slots(slots) == pytest.approx(1024 / 4096)
    assert kv_usage_from_slots({"error": "slots disabled"}) is None
    assert kv_usage_from_slots([{"n_ctx": "x"}]) is None


# --- real HTTP servers ----------------------------------------------------------------------------

Handler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def http_server() -> Iterator[Callable[[dict[str, Handler]], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(routes: dict[str, Handler]) -> str:
        class H(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _route(self) -> None:
                handler = routes.get(self.path)
                if handler is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                handler(self)

            do_GET = do_POST = _route

        server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def send(body: bytes | str, status: int = 200, ctype: str = "application/json") -> Handler:
    data = body.encode() if isinstance(body, str) else body

    def handler(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return handler


MODELS = json.dumps({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]})


def test_discovers_a_vllm_server(http_server: Callable[[dict[str, Handler]], str]) -> None:
    metrics = send(recorded("metrics_vllm_1.txt"), ctype="text/plain")
    url = http_server({"/v1/models": send(MODELS), "/metrics": metrics})
    with RemoteEngine(url + "/v1/") as remote:
        info = remote.discover()
        assert info.engine == "vLLM"
        assert info.models == ("Qwen/Qwen3-8B",)
        assert info.has_metrics
        assert not info.has_slots
        assert info.n_ctx is None
        assert "configured on the server" in info.speculation


def test_a_server_answering_garbage_gives_a_message(http_server: Callable[[dict[str, Handler]], str]) -> None:
    url = http_server({
        "/v1/models": send("<html>not an API</html>", ctype="text/html"),
        "/metrics": send(b"\x00\xff garbage", ctype="text/plain"),
        "/v1/chat/completions": send("data: {not json}\n\n", ctype="text/event-stream"),
    })
    with RemoteEngine(url) as remote:
        with pytest.raises(RemoteError, match="did not answer JSON"):
            remote.discover()
        with pytest.raises(RemoteError, match="metrics"):
            remote.scrape()
        with pytest.raises(RemoteError, match="not JSON"):
            list(remote.chat([{"role": "user", "content": "hi"}]))


def test_a_stream_that_is_not_server_sent_events_is_a_message(
        http_server: Callable[[dict[str, Handler]], str]) -> None:
    url = http_server({"/v1/chat/completions": send(json.dumps({"choices": []}))})  # JSON, not a stream
    with RemoteEngine(url) as remote, pytest.raises(RemoteError, match="not server-sent events"):
        list(remote.chat([{"role": "user", "content": "hi"}]))


def test_a_server_that_dies_mid_stream(http_server: Callable[[dict[str, Handler]], str]) -> None:
    def dies(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]}
        h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)  # gone, without [DONE]

    url = http_server({"/v1/chat/completions": dies})
    got: list[object] = []

    def read_all() -> None:
        with RemoteEngine(url) as remote:
            got.extend(remote.chat([{"role": "user", "content": "hi"}]))

    with pytest.raises(RemoteError, match=r"before it finished|broke"):
        read_all()
    assert [e.text for e in got if isinstance(e, Token)] == ["Hello"]


def test_a_refusal_carries_the_server_message(http_server: Callable[[dict[str, Handler]], str]) -> None:
    error = json.dumps({"error": {"message": "model is loading", "type": "unavailable_error"}})
    url = http_server({"/v1/chat/completions": send(error, status=503), "/v1/models": send(error, status=401)})
    with RemoteEngine(url, api_key="k") as remote:
        with pytest.raises(RemoteError, match="model is loading"):
            list(remote.chat([{"role": "user", "content": "hi"}]))
        with pytest.raises(RemoteError, match="API key"):
            remote.discover()


def test_nothing_listening_is_a_message() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RemoteEngine(f"http://127.0.0.1:{port}", timeout=5) as remote, pytest.raises(RemoteError, match="reach"):
        remote.discover()
    with pytest.raises(RemoteError, match="http"):
        RemoteEngine("ftp://example")


def test_a_streamed_answer_becomes_token_and_finished_events(http_server: Callable[[dict[str, Handler]], str]) -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
         "timings": {"draft_n": 4, "draft_n_accepted": 3, "prompt_n": 2, "cache_n": 5, "prompt_ms": 30.0}},
        {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "stop"}],
         "timings": {"draft_n": 6, "draft_n_accepted": 4, "predicted_per_second": 50.0, "predicted_ms": 40.0}},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}},
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    url = http_server({"/v1/chat/completions": send(body, ctype="text/event-stream")})
    with RemoteEngine(url) as remote:
        events = list(remote.chat([{"role": "user", "content": "hi"}]))
    assert [e.text for e in events if isinstance(e, Token)] == ["Hi", " there"]
    # The prompt is what was processed plus what the server reused from its cache, said once.
    assert [(e.prompt_tokens, e.seconds) for e in events if isinstance(e, PromptProcessed)] == [(7, 0.03)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.reason == "eog"
    assert finished.text == "Hi there"
    assert finished.stats.drafted == 6
    assert finished.stats.accepted == 4
    assert finished.stats.completion_tokens == 2
    assert finished.stats.decode_tps == 50.0
