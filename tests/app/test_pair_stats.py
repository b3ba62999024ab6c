"""Measured acceptance per pair: kept across runs, folded as a drafted-weighted mean, used by the ranking."""

from __future__ import annotations

from pathlib import Path

from app.events import MessageStats
from app.library.gguf_reader import read_gguf_info
from app.library.pair_stats import drafter_key, load_measured, record
from app.library.recommend import NGRAM_KEY, recommend_drafters


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
    from app.engine.adaptive import MODEL_PRIOR
    from app.engine.params import DraftSettings, LoadSettings
    from app.engine.session import EngineSession

    settings = LoadSettings(str(tiny_target), DraftSettings(drafter_path=str(tiny_drafter_same)), n_ctx=256,
                            n_batch=64, n_threads=1)
    before = EngineSession(settings)
    try:
        assert before.decoder.controller.model.rate(0) == MODEL_PRIOR  # nothing measured for this pair yet
    finally:
        before.close()
    record(str(tiny_target), str(tiny_drafter_same), stats(0.95, 100))
    logs: list[str] = []
    after = EngineSession(settings, log=logs.append)
    try:
        assert after.decoder.controller.model.rate(0) == 0.95
        assert any("measured acceptance 0.95" in line for line in logs)
    finally:
        after.close()


def test_a_fifo_in_place_of_the_file_reads_as_nothing_measured(tmp_path: Path) -> None:
    import os

    path = tmp_path / "acceptance.json"
    os.mkfifo(path)  # read_text() on it would wait for a writer for ever
    assert load_measured(path) == {}
