"""Measured acceptance per pair: kept across runs, folded as a drafted-weighted mean, used by the ranking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.events import MessageStats
from app.library.gguf_reader import read_gguf_info
from app.measure.recommend import NGRAM_KEY, recommend_drafters
from app.storage.pair_stats import drafter_key, load_measured, record


def stats(alpha: float, drafted: int) -> MessageStats:
    return MessageStats(prompt_tokens=10, completion_tokens=50, ttft_seconds=0.1, prefill_tps=100.0,
                        decode_tps=50.0, decode_seconds=1.0, passes=20, drafted=drafted,
                        accepted=int(alpha * drafted), acceptance=alpha, tokens_per_pass=2.5,
                        per_position_acceptance=(alpha, alpha / 2), k_history=(), speedup_estimate=1.0)


def test_only_a_single_drafter_run_is_attributed() -> None:
    assert drafter_key("/m/draft.gguf", 0) == "/m/draft.gguf"
    assert drafter_key(None, 3) == NGRAM_KEY
    assert drafter_key("/m/draft.gguf", 3) is None  # stacked: the figure belongs to neither alone
    assert drafter_key(None, 0) is None


def test_running_mean_weighted_by_drafted_tokens(tmp_path: Path) -> None:
    path = tmp_path / "acceptance.json"
    assert record("/t.gguf", "/d.gguf", stats(0.8, 100), path) == 0.8
    assert abs(record("/t.gguf", "/d.gguf", stats(0.2, 300), path) - 0.35) < 1e-9  # type: ignore[operator]
    assert record("/t.gguf", "/d.gguf", stats(0.9, 3), path) is None  # too few drafted tokens to say much
    assert load_measured(path) == {("/t.gguf", "/d.gguf"): 0.35}


def test_damaged_file_reads_as_nothing_measured(tmp_path: Path) -> None:
    path = tmp_path / "acceptance.json"
    path.write_bytes(b"\x00\xffnot json")
    assert load_measured(path) == {}
    assert record("/t.gguf", NGRAM_KEY, stats(0.5, 40), path) == 0.5
    assert load_measured(path) == {("/t.gguf", NGRAM_KEY): 0.5}


def test_ranking_uses_the_measured_acceptance(tiny_target: Path, tiny_drafter_same: Path) -> None:
    target, drafter = read_gguf_info(tiny_target), read_gguf_info(tiny_drafter_same)
    default = {r.drafter_path: r for r in recommend_drafters(target, [drafter])}
    measured = {r.drafter_path: r for r in recommend_drafters(
        target, [drafter], {(target.path, drafter.path): 0.95, (target.path, NGRAM_KEY): 0.1})}
    assert default[drafter.path].acceptance_source == "default"
    assert measured[drafter.path].acceptance_source == "measured"
    assert measured[drafter.path].acceptance == 0.95
    assert measured[None].acceptance == 0.1


def test_a_loaded_pair_starts_its_model_drafter_from_the_measured_acceptance(
        specdeck_home: Path, tiny_target: Path, tiny_drafter_same: Path) -> None:
    """What the window, chat and serve do: look the pair up and pass it in the load settings."""
    from app.engine.adaptive import MODEL_PRIOR
    from app.engine.session import EngineSession
    from app.params import DraftSettings, LoadSettings
    from app.storage.pair_stats import measured_start

    target, drafter = str(tiny_target), str(tiny_drafter_same)

    def load(start: float | None, logs: list[str]) -> float:
        draft = DraftSettings(drafter_path=drafter, model_start=start)
        session = EngineSession(LoadSettings(target, draft, n_ctx=256, n_batch=64, n_threads=1), log=logs.append)
        try:
            return session.decoder.controller.model.rate(0)
        finally:
            session.close()

    assert measured_start(target, drafter) is None  # nothing measured for this pair yet
    assert load(measured_start(target, drafter), []) == MODEL_PRIOR
    record(target, drafter, stats(0.95, 100))
    assert measured_start(target, drafter) == 0.95
    assert measured_start(target, None) is None  # the n-gram drafter's figure is not a model drafter's start
    logs: list[str] = []
    assert load(measured_start(target, drafter), logs) == 0.95
    assert any("measured acceptance 0.95" in line for line in logs)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.timeout(20)
def test_a_fifo_in_place_of_the_file_reads_as_nothing_measured(tmp_path: Path) -> None:
    path = tmp_path / "acceptance.json"
    os.mkfifo(path)  # read_text() on it would wait for a writer for ever
    assert load_measured(path) == {}


def idle_stats(passes: int, model_drafted: int, model_accepted: int = 0, drafted: int = 0) -> MessageStats:
    return MessageStats(prompt_tokens=10, completion_tokens=passes, ttft_seconds=0.1, prefill_tps=100.0,
                        decode_tps=50.0, decode_seconds=1.0, passes=passes, drafted=drafted,
                        accepted=model_accepted, acceptance=0.0, tokens_per_pass=1.0,
                        per_position_acceptance=(), k_history=(), speedup_estimate=0.0,
                        model_drafted=model_drafted, model_accepted=model_accepted)


def test_a_drafter_that_drafted_nothing_predicts_plain_decoding(tmp_path: Path, tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    """Issue 38: a drafter never measured kept its default prediction (1.28×) after answers in which it
    drafted nothing. A long answer without one of its tokens is counted, and the ranking then predicts 1.0×
    for it and says why; a short one, or one from before these counts (-1), says nothing."""
    from app.storage.pair_stats import IDLE_PASSES, load_idle

    path = tmp_path / "acceptance.json"
    # A same-vocabulary drafter a sixteenth of the target's size: its default prediction pays by construction.
    target = read_gguf_info(tiny_model_factory("big-target.gguf", n_embd=256, n_layer=4, n_ff=512, name="big"))
    drafter = read_gguf_info(tiny_model_factory("small-drafter.gguf", name="small"))
    assert record(target.path, drafter.path, idle_stats(IDLE_PASSES - 1, 0), path) is None
    assert record(target.path, drafter.path, idle_stats(IDLE_PASSES, -1), path) is None
    assert load_idle(path) == {}
    assert record(target.path, drafter.path, idle_stats(IDLE_PASSES, 0), path) is None
    assert record(target.path, NGRAM_KEY, idle_stats(IDLE_PASSES, 0), path) is None  # the suffix drafter: never
    assert load_idle(path) == {(target.path, drafter.path): 1}
    before = {r.drafter_path: r for r in recommend_drafters(target, [drafter], idle={})}
    after = {r.drafter_path: r for r in recommend_drafters(target, [drafter], idle=load_idle(path))}
    assert before[drafter.path].acceptance_source == "default"
    assert before[drafter.path].speedup > 1.0  # the guess the window once auto-picked on
    assert after[drafter.path].acceptance_source == "measured: drafted nothing"
    assert after[drafter.path].speedup == 1.0
    assert "drafted nothing in 1 answer here" in after[drafter.path].note
    # Once it drafts, what it drafted is its measurement, and the idle count no longer decides.
    record(target.path, drafter.path, stats(0.9, 100), path)
    assert load_idle(path) == {(target.path, drafter.path): 1}
    measured = {r.drafter_path: r for r in recommend_drafters(target, [drafter], load_measured(path),
                                                              idle=load_idle(path))}
    assert measured[drafter.path].acceptance_source == "measured"


def test_a_stacked_answer_measures_the_trained_drafter_by_its_own_tokens(tmp_path: Path) -> None:
    from app.storage.pair_stats import IDLE_PASSES, load_idle, record_trained_share

    path = tmp_path / "acceptance.json"
    assert record_trained_share("/t", "/d", idle_stats(IDLE_PASSES, 40, 30, drafted=200), path) == 0.75
    assert record_trained_share("/t", "/d", idle_stats(IDLE_PASSES, 120, 30, drafted=300), path) == pytest.approx(
        (30 + 30) / (40 + 120))
    assert record_trained_share("/t", "/d", idle_stats(IDLE_PASSES, 3, 3, drafted=90), path) is None  # too few
    assert record_trained_share("/t", "/e", idle_stats(IDLE_PASSES, 0, drafted=90), path) is None
    assert load_idle(path) == {("/t", "/e"): 1}
    assert load_measured(path) == {("/t", "/d"): pytest.approx(0.375)}


def test_the_engine_counts_the_trained_drafters_own_tokens(tiny_target: Path, tiny_drafter_same: Path) -> None:
    """MessageStats.model_drafted / model_accepted: all of a model drafter's drafts when it drafts alone, none
    when the suffix drafter drafts alone, a part of them when both do."""
    from app.engine.session import EngineSession
    from app.params import DraftSettings, LoadSettings, SamplingSettings

    prompt = [{"role": "user", "content": "one two three four five one two three four five one two three"}]
    for draft, kind in ((DraftSettings(drafter_path=str(tiny_drafter_same), ngram=0, adaptive=False, k=3), "model"),
                        (DraftSettings(ngram=2, adaptive=False, k=3), "suffix"),
                        (DraftSettings(drafter_path=str(tiny_drafter_same), ngram=2, adaptive=False, k=3), "both")):
        session = EngineSession(LoadSettings(str(tiny_target), draft, n_ctx=256, n_batch=64, n_threads=1))
        try:
            done = [e for e in session.generate(1, prompt, SamplingSettings(temperature=0.0, max_tokens=40))
                    if type(e).__name__ == "Finished"]
        finally:
            session.close()
        final = done[-1].stats  # type: ignore[attr-defined]
        assert 0 <= final.model_accepted <= final.model_drafted <= final.drafted, kind
        assert final.accepted - final.model_accepted >= 0, kind
        if kind == "model":
            assert final.model_drafted == final.drafted > 0
            assert final.model_accepted == final.accepted
        elif kind == "suffix":
            assert final.model_drafted == 0
