"""One save policy (app.storage.measured): what an answer and a bench keep for the drafter ranking, the same
from bench, tune, the terminal chat, serve and the window."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from app.events import MessageStats
from app.params import DraftSettings, LoadSettings, SamplingSettings
from app.storage import pair_stats, verify_cost
from app.storage.measured import keep_answer, keep_pass_costs

ROOT = Path(__file__).resolve().parents[2]
TARGET, DRAFTER = "/m/target.gguf", "/m/drafter.gguf"
STEEP = {"1": 19.1, "2": 36.1, "4": 59.2, "8": 96.2}


def answer(drafted: int, accepted: int, model_drafted: int = -1, model_accepted: int = -1,
           passes: int = 40) -> MessageStats:
    rate = accepted / drafted if drafted else 0.0
    return MessageStats(prompt_tokens=10, completion_tokens=passes, ttft_seconds=0.1, prefill_tps=100.0,
                        decode_tps=50.0, decode_seconds=1.0, passes=passes, drafted=drafted, accepted=accepted,
                        acceptance=rate, tokens_per_pass=1.5, per_position_acceptance=(rate, rate / 2) if drafted
                        else (), k_history=(), speedup_estimate=1.0, model_drafted=model_drafted,
                        model_accepted=model_accepted)


def test_an_answer_is_kept_for_the_drafter_that_drafted_it(specdeck_home: Path) -> None:
    keep_answer(TARGET, DRAFTER, 0, answer(40, 30))  # the model drafter alone
    keep_answer(TARGET, None, 3, answer(40, 10))  # the suffix drafter alone
    keep_answer(TARGET, None, 0, answer(0, 0))  # plain decoding: nothing to keep
    measured = pair_stats.load_measured()
    assert set(measured) == {(TARGET, DRAFTER), (TARGET, pair_stats.NGRAM_KEY)}
    assert measured[(TARGET, DRAFTER)] > measured[(TARGET, pair_stats.NGRAM_KEY)]


def test_a_stacked_answer_keeps_the_trained_drafters_own_share(specdeck_home: Path) -> None:
    keep_answer(TARGET, DRAFTER, 3, answer(60, 40, model_drafted=20, model_accepted=15))
    assert pair_stats.load_measured() == {(TARGET, DRAFTER): 0.75}  # 15 of its own 20, not 40 of 60
    keep_answer(TARGET, DRAFTER, 3, answer(30, 20, model_drafted=0, model_accepted=0))
    assert pair_stats.load_idle() == {(TARGET, DRAFTER): 1}


def test_a_bench_keeps_its_pass_costs_and_the_drafters_step(specdeck_home: Path) -> None:
    keep_pass_costs(TARGET, "cpu", STEEP, DRAFTER, 0, 0.4)
    assert verify_cost.load_curves()[TARGET].widths_ms[8] == STEEP["8"]
    assert pair_stats.load_step_costs() == {(TARGET, DRAFTER): 0.4}
    keep_pass_costs("/m/other.gguf", "cpu", {}, DRAFTER, 2, 0.5)  # no curve; two drafters shared the drafts
    assert set(verify_cost.load_curves()) == {TARGET}
    assert set(pair_stats.load_step_costs()) == {(TARGET, DRAFTER)}


def test_nothing_outside_the_policy_saves_measurements() -> None:
    """Only app.storage.measured calls pair_stats' and verify_cost's writers; every front end goes through it."""
    writers = {"record", "record_trained_share", "record_step_cost"}
    offenders = []
    for path in [*(ROOT / "app").rglob("*.py"), *(ROOT / "ui").rglob("*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("app/storage/measured.py", "app/storage/pair_stats.py", "app/storage/verify_cost.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("app.storage.pair_stats",
                                                                   "app.storage.verify_cost"):
                offenders += [f"{rel}: {a.name}" for a in node.names if a.name in writers]
    assert offenders == []


def _pair_is_known(target: Path, drafter: Path) -> bool:
    """The answer left a figure for the pair: its acceptance, or that the drafter drafted nothing."""
    pair = (str(target), str(drafter))
    return pair in pair_stats.load_measured() or pair in pair_stats.load_idle()


def _fixed_pair(target: Path, drafter: Path) -> LoadSettings:
    return LoadSettings(target_path=str(target), n_ctx=512, n_threads=1,
                        draft=DraftSettings(drafter_path=str(drafter), ngram=0, adaptive=False, k=2))


@pytest.mark.process
def test_the_terminal_chat_keeps_its_answers(specdeck_home: Path, tiny_target: Path,
                                             tiny_drafter_same: Path) -> None:
    from app.cli.chat import TerminalChat
    from app.engine.client import EngineClient

    client = EngineClient()
    client.start()
    try:
        chat = TerminalChat(client, _fixed_pair(tiny_target, tiny_drafter_same),
                            SamplingSettings(temperature=0.0, max_tokens=40), False)
        assert chat.load()
        assert not _pair_is_known(tiny_target, tiny_drafter_same)
        assert chat.ask("Say something.")
    finally:
        client.close()
    assert _pair_is_known(tiny_target, tiny_drafter_same)


@pytest.mark.server
def test_serve_keeps_its_answers(specdeck_home: Path, tmp_path: Path, tiny_target: Path,
                                 tiny_drafter_same: Path) -> None:
    import httpx
    import openai

    from app.serve.metrics import ServeMetrics
    from app.serve.protocol import Limits
    from app.serve.runner import EngineRunner
    from app.serve.server import ServeOptions, Server

    metrics = ServeMetrics()
    runner = EngineRunner(_fixed_pair(tiny_target, tiny_drafter_same), metrics, history_path=tmp_path / "h.sqlite3")
    server = Server(runner, metrics, ServeOptions(port=0, limits=Limits(max_tokens=64)))
    server.start_in_thread()
    try:
        deadline = time.monotonic() + 120
        while httpx.get(server.base_url + "/health").status_code != 200:
            assert runner.state in ("loading", "ready"), runner.message
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say something."}],
                                       max_tokens=40, temperature=0.0)
        deadline = time.monotonic() + 30  # saved off the engine thread, after the client has its answer
        while not _pair_is_known(tiny_target, tiny_drafter_same):
            assert time.monotonic() < deadline, "the answer was not kept"
            time.sleep(0.05)
    finally:
        server.stop()
