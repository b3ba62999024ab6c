"""`specdeck tune`: structure of its results, what it saves and loads, cancelling and the time budget.

Tiny fixture models only; no test asserts a speed (speed is measured by `specdeck bench`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.measure.bench import BENCH_SAMPLING
from app.measure.tune import (
    DEFAULT_K_MAX,
    DEFAULT_NGRAM,
    PLAIN,
    Candidate,
    Progress,
    TuneConfig,
    save_winner,
    tune,
)
from app.params import DraftSettings, LoadSettings
from app.storage.tuned import TunedSettings, load_tuned, save_tuned

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = [
    {"messages": [{"role": "user", "content": "Repeat: alpha beta gamma, alpha beta gamma, alpha beta"}]},
    {"messages": [{"role": "user", "content": "Copy: one two three four, one two three four"}]},
]


def write_prompts(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def base_config(target: Path, repeat: int = 2, *, budget_s: float | None = None,
                replay: bool = True) -> TuneConfig:
    """A sweep of ``PROMPTS`` on ``target``, with short answers on one thread."""
    return TuneConfig(LoadSettings(str(target), n_ctx=512, n_threads=1), tuple(p["messages"] for p in PROMPTS),
                      "test", replace(BENCH_SAMPLING, max_tokens=24), repeat=repeat, budget_s=budget_s,
                      replay=replay)


@pytest.fixture(scope="module")
def cli_run(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """One whole `specdeck tune` as a user runs it: (its JSON, its SPECDECK_HOME, its stdout)."""
    folder = tmp_path_factory.mktemp("tune")
    out = folder / "tune.json"
    env = dict(os.environ, SPECDECK_HOME=str(folder / "home"))
    cmd = [sys.executable, "-m", "app", "tune", "--target", str(tiny_target), "--prompts",
           str(write_prompts(folder)), "--max-tokens", "24", "--repeat", "2", "--threads", "1", "--ctx", "512",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), folder / "home", proc.stdout


def test_results_are_ranked_with_speedup_tok_s_and_spread(cli_run: tuple[dict[str, Any], Path, str]) -> None:
    report, _, _ = cli_run
    results = report["results"]
    assert report["stopped"] == "done"
    assert report["prompts"] == len(PROMPTS)
    speedups = [r["speedup"] for r in results]
    assert speedups == sorted(speedups, reverse=True)
    for r in results:
        assert set(r["settings"]) == {"drafter", "ngram", "adaptive", "k", "k_max"}
        assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        assert r["tok_s"] > 0
        assert r["baseline_tok_s"] > 0
        if r["settings"]["drafter"] != "none":
            assert len(r["speedups"]) == 2  # one ratio per repeat
            assert r["identical"] is True  # greedy: speculation never changes the text
    first = next(r for r in results if r["settings"]["ngram"] == DEFAULT_NGRAM and r["settings"]["adaptive"]
                 and r["settings"]["k_max"] == DEFAULT_K_MAX)  # the window's defaults, measured first
    # The fastest by median wins, unless its slowest repeat does not beat the defaults' median.
    expected = results[0] if results[0]["speedup_min"] > first["speedup"] or first["speedup"] < 1 else first
    assert report["best"] == expected


def test_the_sweep_replays_every_setting_and_confirms_the_winner_for_real(
        cli_run: tuple[dict[str, Any], Path, str]) -> None:
    """The first run's plain answers are replayed under key length × depth cap × fixed depth; the replay's
    winner is the one other setting measured with the bench."""
    report, _, stdout = cli_run
    settings = [r["settings"] for r in report["results"]]
    assert {"drafter": "n-gram", "ngram": DEFAULT_NGRAM, "adaptive": True, "k": None,
            "k_max": DEFAULT_K_MAX} in settings  # the window's defaults are always measured
    assert {"drafter": "none", "ngram": 0, "adaptive": True, "k": None, "k_max": DEFAULT_K_MAX} in settings
    replayed = report["replayed"]
    swept = [r["settings"] for r in replayed]
    assert len({s["ngram"] for s in swept}) >= 3
    assert len({s["k_max"] for s in swept if s["adaptive"]}) >= 3
    assert any(not s["adaptive"] for s in swept)
    assert all(r["predicted_speedup"] > 0 and r["tau"] >= 1 for r in replayed)
    predicted = [r["predicted_speedup"] for r in replayed]
    assert predicted == sorted(predicted, reverse=True)
    assert replayed[0]["settings"] in settings  # confirmed with a real run
    assert len(settings) <= 3  # the default, the winner and the plain reference: nothing else was measured
    assert "replayed offline" in stdout
    assert "left" in stdout  # progress with the time left


def test_the_replay_ranks_a_copy_above_plain_and_keeps_the_default_first_among_equals() -> None:
    from app.measure.tune import replay_candidates, replay_grid

    phrase = list(range(100, 140))
    traces = [{"prompt": [1, *phrase, 2], "answer": [*phrase, 3]}]  # the answer copies the prompt
    default = Candidate(use_model=False, ngram=DEFAULT_NGRAM)
    curve = {"1": 10.0, "2": 11.0, "4": 12.0, "8": 14.0, "16": 18.0, "33": 26.0}  # wide passes cheap
    ranked = replay_candidates(traces, curve, replay_grid(default))
    assert len(ranked) == len(replay_grid(default))
    assert ranked[0].speedup > 2.0
    assert all(p.tau >= 1.0 for p in ranked)
    assert replay_candidates([], curve, [default]) == []  # nothing recorded: no replay
    assert replay_candidates(traces, {"2": 11.0}, [default]) == []  # no one-token cost: no replay
    novel = [{"prompt": [1, 2, 3], "answer": list(range(200, 260))}]  # nothing to copy: every setting ties
    flat = replay_candidates(novel, curve, replay_grid(default))
    assert flat[0].candidate == default
    assert {round(p.speedup, 6) for p in flat} == {1.0}


def test_winner_is_saved_for_the_pair_and_loads_as_draft_settings(
        cli_run: tuple[dict[str, Any], Path, str], tiny_target: Path) -> None:
    report, home, _ = cli_run
    saved = home / "data" / "tuned.json"
    assert report["saved_to"] == str(saved)
    tuned = load_tuned(str(tiny_target), None, saved)
    assert tuned is not None
    best = report["best"]
    assert tuned.speedup == best["speedup"]
    assert tuned.prompts == len(PROMPTS)
    expected_ngram = best["settings"]["ngram"]
    assert tuned.draft.ngram == expected_ngram
    assert tuned.draft.drafter_path is None
    assert tuned.summary() == f"tuned: {best['speedup']:.2f}× on your prompts"
    assert load_tuned(str(tiny_target), "/some/drafter.gguf", saved) is None  # another pair: nothing tuned


def test_tune_records_the_verify_cost_curve(cli_run: tuple[dict[str, Any], Path, str], tiny_target: Path) -> None:
    from app.storage.verify_cost import load_curve

    _, home, _ = cli_run
    curve = load_curve(str(tiny_target), home / "data" / "verify_cost.json")
    assert curve is not None
    assert 1 in curve.widths_ms
    assert len(curve.widths_ms) > 2


def test_cancel_keeps_what_was_measured(tiny_target: Path, specdeck_home: Path) -> None:
    seen: list[Progress] = []
    report = tune(base_config(tiny_target, replay=False), on_progress=seen.append,
                  cancelled=lambda: len(seen) >= 2)
    assert report.stopped == "cancelled"
    assert len(report.results) == 2
    assert [p.done for p in seen] == [1, 2]
    assert all(p.left_s >= 0 and p.planned >= p.done for p in seen)
    tuned = save_winner(report)
    assert tuned is not None
    assert report.best is not None
    assert load_tuned(str(tiny_target), None) == tuned
    assert tuned.speedup == max(m.speedup for m in report.ranked)


def test_interrupt_from_progress_keeps_what_was_measured(tiny_target: Path, specdeck_home: Path) -> None:
    def interrupt(_p: Progress) -> None:
        raise KeyboardInterrupt

    report = tune(base_config(tiny_target, repeat=1), on_progress=interrupt)
    assert report.stopped == "cancelled"
    assert [m.candidate for m in report.results] == [Candidate(use_model=False, ngram=DEFAULT_NGRAM)]


def test_budget_stops_before_a_setting_that_would_end_past_it(tiny_target: Path, specdeck_home: Path) -> None:
    report = tune(base_config(tiny_target, repeat=1, budget_s=1e-3, replay=False))
    assert report.stopped == "budget"
    assert len(report.results) == 1  # the first setting always runs: there is no estimate before it


@pytest.mark.process
def test_ctrl_c_saves_and_writes_what_was_measured(tiny_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    cmd = [sys.executable, "-m", "app", "tune", "--target", str(tiny_target), "--prompts",
           str(write_prompts(tmp_path)), "--max-tokens", "24", "--repeat", "10", "--threads", "1", "--ctx", "512",
           "--json", str(out)]
    # Ten repeats make the settings after the first take tens of seconds: on a busy machine this process may
    # read the first progress line late, and with one repeat the sweep could end before the signal lands.
    # A child inherits an ignored SIGINT, and Python then never raises KeyboardInterrupt: give it the default,
    # as a terminal's Ctrl-C finds it (in the full suite something before this test leaves SIGINT ignored).
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        lines = []
        while not any(line.startswith("[") for line in lines):  # the first progress line: one result is in
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            lines.append(line)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "cancelled" in rest
    report = json.loads(out.read_text())
    assert report["stopped"] == "cancelled"
    assert len([r for r in report["results"] if r["settings"]["drafter"] != "none"]) >= 1
    assert load_tuned(str(tiny_target), None, tmp_path / "home" / "data" / "tuned.json") is not None


def test_the_default_stays_the_winner_unless_beaten_beyond_the_spread() -> None:
    from app.measure.tune import Measured, TuneReport

    default = Measured(Candidate(use_model=False, ngram=3), 1.40, 1.30, 1.50, [1.30, 1.50], 9.0, 6.4, 0.9, True, 1.0)
    noisy = Measured(Candidate(use_model=False, ngram=2), 1.50, 1.20, 1.80, [1.20, 1.80], 9.6, 6.4, 0.9, True, 1.0)
    clear = Measured(Candidate(use_model=False, ngram=4), 1.60, 1.45, 1.75, [1.45, 1.75], 10.2, 6.4, 0.9, True, 1.0)
    assert TuneReport("/m/t.gguf", None, "test", 1, [default, noisy]).best is default
    assert TuneReport("/m/t.gguf", None, "test", 1, [default, noisy, clear]).best is clear


def test_plain_reference_is_ranked_but_never_measured() -> None:
    from app.measure.tune import Measured, TuneReport

    slow = Measured(Candidate(use_model=False, ngram=3), 0.8, 0.7, 0.9, [0.7, 0.9], 8.0, 10.0, 0.2, True, 1.0)
    report = TuneReport("/m/t.gguf", None, "test", 1, [slow])
    assert report.best is not None
    assert report.best.candidate == PLAIN
    tuned = report.tuned()
    assert tuned is not None
    assert tuned.draft.ngram == 0
    assert not tuned.draft.speculative


def test_tuned_file_keeps_other_pairs_and_ignores_damage(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    a = TunedSettings(DraftSettings(ngram=4, k_max=16), 1.5, 1.4, 1.6, 3, "p.jsonl", 1.0)
    b = TunedSettings(DraftSettings(drafter_path="/m/d.gguf", ngram=0, adaptive=False, k=4, k_max=4),
                      1.2, 1.1, 1.3, 3, "history", 2.0)
    save_tuned("/m/t.gguf", None, a, path)
    save_tuned("/m/t.gguf", "/m/d.gguf", b, path)
    assert load_tuned("/m/t.gguf", None, path) == a
    assert load_tuned("/m/t.gguf", "/m/d.gguf", path) == b
    raw = json.loads(path.read_text())
    raw["/m/t.gguf\n"]["k_max"] = 999  # out of DraftSettings' range
    raw["/m/t.gguf\n/m/d.gguf"]["speedup"] = "fast"
    path.write_text(json.dumps(raw))
    assert load_tuned("/m/t.gguf", None, path) is None
    assert load_tuned("/m/t.gguf", "/m/d.gguf", path) is None
    path.write_text("{not json")
    assert load_tuned("/m/t.gguf", None, path) is None


def test_history_prompts_end_at_the_last_user_message(specdeck_home: Path) -> None:
    from app.errors import SettingsError
    from app.measure.tune import history_prompts
    from app.storage.history import HistoryStore

    with pytest.raises(SettingsError, match="no chat"):
        history_prompts(3)
    with HistoryStore() as store:
        old = store.new_chat("old", system_prompt="Be brief.")
        store.add_message(old, "user", "first question")
        store.add_message(old, "assistant", "first answer")
        store.add_message(old, "user", "second question")
        store.add_message(old, "assistant", "second answer")
        empty = store.new_chat("empty")
        assert empty
    prompts = history_prompts(5)
    assert prompts == [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first question"},
                        {"role": "assistant", "content": "first answer"},
                        {"role": "user", "content": "second question"}]]


def test_with_a_drafter_the_sweep_tries_each_drafter_choice() -> None:
    from app.measure.tune import planned_count, stages

    default = Candidate(use_model=True, ngram=DEFAULT_NGRAM)
    tried = {c for stage in stages(has_model=True) for c in stage(default)}
    assert {c.drafter for c in tried} == {"model", "both", "n-gram"}
    assert planned_count(has_model=True) > planned_count(has_model=False)
    settings = Candidate(use_model=True, ngram=0, adaptive=False, k=4, k_max=4).draft_settings("/m/d.gguf")
    assert (settings.drafter_path, settings.ngram, settings.adaptive, settings.k) == ("/m/d.gguf", 0, False, 4)
    assert Candidate(use_model=False, ngram=3).draft_settings("/m/d.gguf").drafter_path is None


def test_a_missing_chat_template_is_told_once_for_the_whole_sweep(
        tiny_model_factory: Any, specdeck_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from app.measure.bench import bench

    base_model = tiny_model_factory("no-template.gguf", chat_template=None)
    config = base_config(base_model, repeat=1, replay=False)
    bench(config.bench_config(PLAIN), io.StringIO())  # one bench alone names the template's absence
    alone = capsys.readouterr().err
    warnings = [line for line in alone.splitlines() if "chat template" in line]
    assert len(warnings) == 1, alone

    seen: list[Progress] = []
    report = tune(config, on_progress=seen.append, cancelled=lambda: len(seen) >= 3)
    assert len(report.results) == 3
    err = capsys.readouterr().err
    assert err.count(warnings[0]) == 1, err
