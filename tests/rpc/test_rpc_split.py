"""A model split over two real rpc-server processes on this machine: the same greedy tokens as a local load,
speculation on top (the suffix drafter), memory per server through llama.cpp's device API, the network's
round trips measured at load, and a server that refuses or dies mid-answer in one sentence, without a hang.

What llama.cpp placed where is read from its own load log ('RPC0[host:port] model buffer size = ...'); that the servers
did the work, from their logs ('Accepted client connection')."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.ceiling.rpc import PROBE_TIMEOUT_S, probe_server, rpc_failure
from app.engine.client import EngineClient
from app.events import BenchResult, Devices, EngineCrashed, EngineError, Event, Finished, Loaded, Token
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.gguf_fixtures import write_tiny_model
from tests.rpc.conftest import RpcServer

TIMEOUT = 300.0
CHAT = [{"role": "user", "content": "Count with me: one two three, one two three, one two three."}]
GREEDY = SamplingSettings(temperature=0.0, max_tokens=48)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[EngineClient]:
    c = EngineClient(log_dir=tmp_path / "logs", watchdog_seconds=TIMEOUT)
    yield c
    c.close()


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four layers, so that each server holds some."""
    return write_tiny_model(tmp_path_factory.mktemp("rpc") / "tiny-4-layers.gguf", n_layer=4, name="tiny-4-layers")


def until(client: EngineClient, done: Callable[[Event], bool], timeout: float = TIMEOUT) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = client.poll(0.1)
        if event is None:
            continue
        events.append(event)
        if done(event) or isinstance(event, EngineCrashed | EngineError):
            return events
    raise AssertionError(f"no answer within {timeout:.0f} s; got {[type(e).__name__ for e in events]}")


def load(client: EngineClient, settings: LoadSettings) -> Loaded:
    client.load(settings)
    event = until(client, lambda e: isinstance(e, Loaded))[-1]
    assert isinstance(event, Loaded), event
    return event


def answer(client: EngineClient, *, plain: bool) -> BenchResult:
    client.bench_run(CHAT, GREEDY, plain)
    event = until(client, lambda e: isinstance(e, BenchResult))[-1]
    assert isinstance(event, BenchResult), event
    return event


def settings_for(model: Path, servers: list[RpcServer]) -> LoadSettings:
    return LoadSettings(str(model), DraftSettings(ngram=3), n_ctx=512, n_threads=1,
                        rpc_servers=tuple(s.endpoint for s in servers))


def test_a_split_answers_like_a_local_load_and_speculates(client: EngineClient, rpc_servers: list[RpcServer],
                                                          four_layers: Path) -> None:
    settings = settings_for(four_layers, rpc_servers)
    over_rpc = load(client, settings)
    assert [d.name for d in over_rpc.devices] == ["RPC0", "RPC1"]
    assert [d.description for d in over_rpc.devices] == [s.endpoint for s in rpc_servers]
    assert all(d.memory_total and d.memory_free for d in over_rpc.devices)  # through ggml_backend_dev_memory
    assert over_rpc.network_seconds > 0
    log = client.log_path.read_text() if client.log_path else ""
    for server in rpc_servers:  # llama.cpp's own account: "RPC0[127.0.0.1:38427] model buffer size = ..."
        assert f"[{server.endpoint}] model buffer size" in log
        assert f"[{server.endpoint}] KV buffer size" in log
    plain_rpc, spec_rpc = answer(client, plain=True), answer(client, plain=False)

    local = load(client, replace(settings, rpc_servers=()))  # the same worker: the servers stay registered
    assert local.devices == ()
    assert local.network_seconds == 0
    plain_local, spec_local = answer(client, plain=True), answer(client, plain=False)

    assert len(plain_local.token_ids) > 8
    assert plain_rpc.token_ids == plain_local.token_ids
    assert spec_rpc.token_ids == plain_rpc.token_ids
    assert spec_local.token_ids == plain_local.token_ids
    assert spec_rpc.stats.drafted > 0
    assert spec_rpc.stats.accepted > 0
    for server in rpc_servers:
        assert "Accepted client connection" in server.log.read_text()


def test_the_probe_speaks_the_servers_protocol(rpc_servers: list[RpcServer]) -> None:
    """The handshake and the timed requests that SpecDeck sends before ggml, against the real server."""
    probe = probe_server(rpc_servers[0].endpoint)
    assert probe.devices == 1  # rpc-server's CPU device
    assert 0 < probe.round_trip_s < PROBE_TIMEOUT_S
    again = probe_server(rpc_servers[0].endpoint)  # the server took the next client: the probe let go
    assert again.devices == 1


def test_the_worker_lists_memory_per_server(client: EngineClient, rpc_servers: list[RpcServer]) -> None:
    client.list_devices(tuple(s.endpoint for s in rpc_servers))
    event = list(client.events(timeout=TIMEOUT))[-1]
    assert isinstance(event, Devices), event
    assert event.error is None
    assert event.rpc_available
    rpc = [d for d in event.devices if d.backend == "RPC"]
    assert [d.description for d in rpc] == [s.endpoint for s in rpc_servers]
    assert all(d.type == "gpu" and d.memory_total and d.memory_free for d in rpc)


def test_a_server_that_is_gone_at_load_is_one_sentence(client: EngineClient, rpc_servers: list[RpcServer],
                                                        four_layers: Path) -> None:
    rpc_servers[1].stop()
    client.load(settings_for(four_layers, rpc_servers))
    event = until(client, lambda e: isinstance(e, Loaded))[-1]
    assert isinstance(event, EngineError), event
    assert event.message == (f"Nothing listens at {rpc_servers[1].endpoint}: start rpc-server there, or correct "
                             "the address.")
    assert client.alive  # refused before ggml could abort


def test_a_server_that_dies_mid_answer_is_one_sentence_and_no_hang(
        client: EngineClient, rpc_servers: list[RpcServer], four_layers: Path) -> None:
    load(client, replace(settings_for(four_layers, rpc_servers), n_ctx=4096))
    client.generate(CHAT, SamplingSettings(temperature=0.0, max_tokens=4000))
    first = until(client, lambda e: isinstance(e, Token | Finished))[-1]
    assert isinstance(first, Token), first
    rpc_servers[0].stop()
    t0 = time.monotonic()
    events = until(client, lambda e: isinstance(e, Finished), timeout=60)
    crashed = events[-1]
    assert isinstance(crashed, EngineCrashed), f"the answer ended without the server: {crashed}"
    assert time.monotonic() - t0 < 60
    assert crashed.message == rpc_failure(crashed.last_log_lines, "generate")
    assert crashed.message.startswith("An RPC server stopped answering while answering")
