"""The engine worker process, driven through EngineClient as the GUI drives it: cancellation within a pass,
and a worker that dies (SIGKILL, SIGABRT, a GGML abort inside llama.cpp) reported as EngineCrashed while the
client itself carries on and a restarted worker loads and answers again."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.engine.client import EngineClient
from app.events import EngineCrashed, Event, Finished, Loaded, LoadProgress, PassStats, Token
from app.params import DraftSettings, LoadSettings, SamplingSettings
from tests.gguf_fixtures import write_tiny_model

TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def no_core_dumps() -> Iterator[None]:
    """Workers killed by SIGABRT must not leave core files behind (the limit is inherited by children)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[EngineClient]:
    c = EngineClient(log_dir=tmp_path / "logs", watchdog_seconds=TIMEOUT)
    yield c
    c.close()


def load_settings(path: Path, n_ctx: int = 512, **draft: object) -> LoadSettings:
    return LoadSettings(str(path), DraftSettings(**draft), n_ctx=n_ctx, n_threads=1)  # type: ignore[arg-type]


def until(client: EngineClient, done: Callable[[Event], bool], timeout: float = TIMEOUT) -> list[Event]:
    """Events up to and including the first one ``done`` accepts (or an EngineCrashed)."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = client.poll(0.1)
        if event is None:
            continue
        events.append(event)
        if done(event) or isinstance(event, EngineCrashed):
            return events
    raise AssertionError(f"no matching event within {timeout:.0f} s; got {[type(e).__name__ for e in events]}")


def load(client: EngineClient, settings: LoadSettings) -> Loaded:
    client.load(settings)
    event = until(client, lambda e: isinstance(e, Loaded))[-1]
    assert isinstance(event, Loaded), event
    return event


def short_answer_works(client: EngineClient, path: Path) -> None:
    load(client, load_settings(path, ngram=2))
    client.generate([{"role": "user", "content": "hello"}], SamplingSettings(temperature=0.0, max_tokens=8))
    finished = until(client, lambda e: isinstance(e, Finished))[-1]
    assert isinstance(finished, Finished), finished
    assert finished.reason in ("max_tokens", "eog")
    assert finished.stats.completion_tokens > 0


LONG = SamplingSettings(temperature=0.0, max_tokens=4000)
CHAT = [{"role": "user", "content": "Count: one two three, one two three, one two"}]


def test_cancel_takes_effect_within_a_pass(client: EngineClient, tiny_target: Path) -> None:
    load(client, load_settings(tiny_target, n_ctx=4096, ngram=2))
    request = client.generate(CHAT, LONG)
    seen = until(client, lambda e: isinstance(e, PassStats) and e.context_tokens > 100)
    assert not isinstance(seen[-1], EngineCrashed)
    # perf_counter is the system's monotonic clock, so it compares with PassStats.t_start from the worker.
    t_cancel = time.perf_counter()
    client.cancel(request)
    events = until(client, lambda e: isinstance(e, Finished))
    finished = events[-1]
    assert isinstance(finished, Finished), finished
    assert finished.request_id == request
    assert finished.reason == "cancelled"
    assert finished.stats.completion_tokens < LONG.max_tokens
    # The worker looks for a cancel before every pass: at most the pass already under way when the
    # request left (plus one that started while it was in the pipe) may begin after it.
    late = [e for e in events if isinstance(e, PassStats) and e.t_start > t_cancel]
    assert len(late) <= 2, len(late)
    # The worker is ready for the next request.
    client.generate([{"role": "user", "content": "again"}], SamplingSettings(temperature=0.0, max_tokens=5))
    again = until(client, lambda e: isinstance(e, Finished))[-1]
    assert isinstance(again, Finished)
    assert again.reason in ("max_tokens", "eog")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT], ids=["SIGKILL", "SIGABRT"])
def test_worker_killed_during_generation(client: EngineClient, tiny_target: Path, sig: signal.Signals) -> None:
    load(client, load_settings(tiny_target, n_ctx=4096, ngram=2))
    client.generate(CHAT, LONG)
    until(client, lambda e: isinstance(e, Token))
    pid = client.pid
    assert pid is not None
    os.kill(pid, sig)
    crashed = until(client, lambda e: False)[-1]
    assert isinstance(crashed, EngineCrashed), crashed
    assert crashed.signal_name == sig.name
    assert crashed.exit_code == -sig
    assert crashed.during == "generate"
    assert sig.name in crashed.message
    assert "restart" in crashed.message
    assert not client.alive
    client.restart()
    short_answer_works(client, tiny_target)


@pytest.mark.demo
def test_worker_aborted_during_load(client: EngineClient, demo_models: tuple[Path, Path],
                                    tiny_target: Path) -> None:
    """SIGABRT at the first progress report of a real model's load (the weights are still being read)."""
    client.load(load_settings(demo_models[0]))
    first = until(client, lambda e: isinstance(e, LoadProgress))[-1]
    assert isinstance(first, LoadProgress), first
    pid = client.pid
    assert pid is not None
    os.kill(pid, signal.SIGABRT)
    crashed = until(client, lambda e: False)[-1]
    assert isinstance(crashed, EngineCrashed), crashed
    assert crashed.signal_name == "SIGABRT"
    assert crashed.during == "load"
    assert client.crashes_on_load == 1
    client.restart()
    short_answer_works(client, tiny_target)
    assert client.crashes_on_load == 0


def test_model_that_aborts_llama_cpp(client: EngineClient, tmp_path: Path, tiny_target: Path) -> None:
    bad = write_tiny_model(tmp_path / "tiny-f64.gguf", name="tiny-f64", aborting=True)
    client.load(load_settings(bad))
    # Loading measures a few target passes, so the first decode, and the abort, already happen while loading.
    crashed = until(client, lambda e: isinstance(e, Loaded | Finished))[-1]
    assert isinstance(crashed, EngineCrashed), crashed
    assert crashed.signal_name == "SIGABRT"
    assert crashed.during == "load"
    tail = "\n".join(crashed.last_log_lines)
    assert "fatal error" in tail or "GGML_ASSERT" in tail or "GGML_ABORT" in tail, tail
    # The client (the GUI's side) is untouched: a restarted worker loads a good model and answers.
    client.restart()
    short_answer_works(client, tiny_target)


def test_crash_advice_during_the_first_load_fits_the_build(client: EngineClient, tmp_path: Path) -> None:
    """The build's GPU support is known from the worker's first event, before any load: a crash while the
    very first model loads mentions GPU layers only on a build that can offload (and a load that asked)."""
    from app.ceiling.backend import probe_backend_isolated

    bad = write_tiny_model(tmp_path / "tiny-f64.gguf", name="tiny-f64", aborting=True)
    settings = load_settings(bad)
    assert settings.n_gpu_layers != 0  # the default asks for every layer on a GPU, when there is one
    client.load(settings)
    crashed = until(client, lambda e: isinstance(e, Loaded | Finished))[-1]
    assert isinstance(crashed, EngineCrashed), crashed
    assert crashed.during == "load"
    build_offloads = probe_backend_isolated().gpu_offload
    assert client.build_gpu_offload is build_offloads
    assert ("GPU" in crashed.message) is build_offloads, crashed.message
    assert "a smaller context" in crashed.message


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="POSIX priorities")
@pytest.mark.process
def test_a_lower_priority_worker_has_it_from_its_start_and_in_every_thread(tmp_path: Path,
                                                                           tiny_target: Path) -> None:
    """The worker's interpreter start and imports must not compete with the window at full priority (the soak
    saw the GUI thread wait for a core while workers restarted), and llama.cpp's threads inherit the priority."""
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)  # ten steps below the window, whatever its own
    c = EngineClient(log_dir=tmp_path / "logs", watchdog_seconds=TIMEOUT, nice=10)
    try:
        c.start()
        assert c.pid is not None
        assert os.getpriority(os.PRIO_PROCESS, c.pid) == expected  # before the child has run any code of ours
        load(c, load_settings(tiny_target))
        threads = Path(f"/proc/{c.pid}/task")
        if threads.is_dir():
            nices = set()
            for thread in threads.iterdir():
                with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                    nices.add(int((thread / "stat").read_text().rsplit(")", 1)[1].split()[16]))
            assert nices == {expected}
    finally:
        c.close()
