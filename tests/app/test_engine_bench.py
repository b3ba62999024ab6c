"""`specdeck bench` end to end, as a user runs it: a subprocess, a prompts file, a JSON report."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from app.events import FROM_MODEL, FROM_NGRAM, PassStats, source_counts
from app.measure.bench_report import SECONDS_DIGITS
from app.measure.recommend import NGRAM_KEY
from app.storage.pair_stats import MIN_DRAFTED, load_measured
from tests.gguf_fixtures import write_tiny_model

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = [
    {"messages": [{"role": "user", "content": "Repeat: alpha beta gamma, alpha beta gamma, alpha beta"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]},
]


def number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.fixture(scope="module")
def report(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    folder = tmp_path_factory.mktemp("bench")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS) + "\n")
    out = folder / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(tiny_target), "--ngram", "2", "--repeat", "2",
           "--prompts", str(prompts), "--baseline", "--max-tokens", "40", "--threads", "1", "--json", str(out)]
    # A scratch SPECDECK_HOME: bench records the measured acceptance there, not in the user's data folder.
    env = dict(os.environ, SPECDECK_HOME=str(folder / "home"))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "speedup" in proc.stdout  # the human-readable summary
    assert "identical True" in proc.stdout
    return json.loads(out.read_text())


@pytest.mark.process
def test_bench_keeps_the_measured_acceptance_for_the_ranking(tiny_target: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "out.json"
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(tiny_target), "--ngram", "2", "--k", "4",
           "--prompts", str(prompts), "--max-tokens", "60", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = [p for p in json.loads(out.read_text())["prompts"] if p["drafted"] >= MIN_DRAFTED]
    assert kept  # a fixed depth drafts whenever the n-gram map has a continuation
    alpha = load_measured(tmp_path / "home" / "data" / "acceptance.json")[(str(tiny_target), NGRAM_KEY)]
    first = [p["per_position_acceptance"][0] for p in kept]
    assert min(first) - 1e-9 <= alpha <= max(first) + 1e-9  # a drafted-weighted mean of the runs' α


def test_report_header(report: dict, tiny_target: Path) -> None:  # type: ignore[type-arg]
    assert report["version"] == 1
    assert report["target"] == str(tiny_target)
    assert report["drafter"] is None
    assert report["ngram"] == 2
    assert report["adaptive"] is True
    assert report["temperature"] == 0.0
    assert report["max_tokens"] == 40
    assert isinstance(report["backend"], str)
    assert report["verify_cost_ms"]
    assert all(number(v) and v > 0 for v in report["verify_cost_ms"].values())


@pytest.mark.process
def test_a_model_drafter_reports_its_step_cost_and_c(tiny_target: Path, tmp_path: Path) -> None:
    """c = a drafter step over a one-token target pass, both from the engine's own cost model; no drafter, no c."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0]) + "\n")
    out = tmp_path / "out.json"
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(tiny_target), "--drafter", str(tiny_target),
           "--k", "3", "--prompts", str(prompts), "--max-tokens", "40", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with_drafter = json.loads(out.read_text())
    assert with_drafter["drafter_step_ms"] > 0
    # Both ms figures are rounded to 1 µs, which on a tiny model's ~0.1 ms passes moves their ratio by ~1 %.
    assert with_drafter["c"] == pytest.approx(with_drafter["drafter_step_ms"] / with_drafter["verify_cost_ms"]["1"],
                                              rel=0.03)


def test_no_drafter_means_no_c(report: dict) -> None:  # type: ignore[type-arg]
    assert "c" not in report
    assert "drafter_step_ms" not in report


def rate_of(run: dict) -> float:  # type: ignore[type-arg]
    """A run's decode rate recomputed from its own window."""
    return run["decode_tokens"] / run["decode_seconds"]


def rate_tolerance(run: dict) -> float:  # type: ignore[type-arg]
    """How far the written rate may sit from one recomputed from the written (rounded) seconds."""
    half_step = 0.5 * 10.0 ** -SECONDS_DIGITS
    return run["decode_tokens"] / (run["decode_seconds"] - half_step) - rate_of(run) + 0.01


def test_report_per_prompt(report: dict) -> None:  # type: ignore[type-arg]
    rows = report["prompts"]
    assert report["repeat"] == 2
    assert [r["index"] for r in rows] == list(range(len(PROMPTS)))
    for row in rows:
        assert isinstance(row["tokens"], int)
        assert 0 < row["tokens"] <= 40
        base = row["baseline"]
        assert base["tokens"] == row["tokens"]
        assert base["drafted"] == 0
        # One window on both sides: the plain first pass emits one token, a speculative one at least one.
        assert base["decode_tokens"] == base["tokens"] - 1
        assert row["decode_tokens"] <= row["tokens"] - 1
        for run in (row, base):
            assert run["tok_s"] == pytest.approx(rate_of(run), abs=rate_tolerance(run))
        assert len(row["runs"]) == 2
        assert row["runs"][0]["tok_s"] == row["tok_s"]
        assert row["runs"][0]["baseline_tok_s"] == base["tok_s"]
        for run in row["runs"]:
            assert run["speedup"] == pytest.approx(run["tok_s"] / run["baseline_tok_s"], rel=0.01)
        speedups = [run["speedup"] for run in row["runs"]]
        assert row["speedup_min"] == min(speedups)
        assert row["speedup_max"] == max(speedups)
        assert row["speedup"] == pytest.approx(statistics.median(speedups), abs=0.002)
        assert 0.0 <= row["acceptance"] <= 1.0
        assert row["acceptance"] == pytest.approx(row["accepted"] / row["drafted"] if row["drafted"] else 0.0,
                                                  abs=1e-4)
        assert row["tokens_per_pass"] == pytest.approx(row["tokens"] / row["passes"], abs=1e-3)
        assert row["accepted"] <= row["drafted"]
        assert isinstance(row["per_position_acceptance"], list)
        assert all(0.0 <= a <= 1.0 for a in row["per_position_acceptance"])
        assert isinstance(row["k_history"], list)
        assert len(row["k_history"]) == row["passes"]
        assert all(isinstance(k, int) and 0 <= k <= report["k_max"] for k in row["k_history"])
        assert number(row["overhead_ms_median"])
        assert row["overhead_ms_median"] >= 0
        assert row["identical"] is True  # greedy: speculation changes the speed, never the text
        assert row["agree_prefix"] == row["tokens"]
        assert row["stop_reason"] in ("max_tokens", "eog")
    # The speculative and plain runs alternate in alternating order, within a prompt and across prompts.
    assert [run["first"] for run in rows[0]["runs"]] == ["speculative", "plain"]
    assert [run["first"] for run in rows[1]["runs"]] == ["plain", "speculative"]
    # The repetitive prompt gave the n-gram drafter something to draft.
    assert rows[0]["drafted"] > 0
    assert rows[0]["per_position_acceptance"]


def test_report_totals(report: dict) -> None:  # type: ignore[type-arg]
    total, rows = report["total"], report["prompts"]
    # Totals are over every repeat: sums of counts, and rates of those sums.
    assert total["tokens"] == 2 * sum(r["tokens"] for r in rows)
    assert total["tok_s"] == pytest.approx(rate_of(total), rel=0.01)
    assert total["baseline"]["tok_s"] == pytest.approx(rate_of(total["baseline"]), rel=0.01)
    assert len(total["speedups"]) == 2
    assert total["speedup_min"] == min(total["speedups"])
    assert total["speedup_max"] == max(total["speedups"])
    assert total["speedup"] == pytest.approx(statistics.median(total["speedups"]), abs=0.002)
    assert total["identical"] is True
    assert 0.0 <= total["acceptance"] <= 1.0
    assert total["tokens_per_pass"] >= 1.0
    assert number(total["overhead_ms_median"])
    assert "ceiling" in report


@pytest.mark.process
def test_a_model_that_aborts_llama_cpp_is_one_sentence(tmp_path: Path) -> None:
    """The decode runs in the worker: llama.cpp's abort ends the bench with one line and a small exit code."""
    bad = write_tiny_model(tmp_path / "tiny-aborts.gguf", name="tiny-aborts", aborting=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0]) + "\n")
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    env.pop("GGML_NO_BACKTRACE", None)
    proc = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(bad), "--prompts", str(prompts),
                           "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert 1 <= proc.returncode <= 123, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "SIGABRT" in lines[0]
    assert "GGML" in lines[0] or "llama.cpp" in lines[0]
    for noise in ("Traceback", "gdb", "#0 ", "backtrace"):
        assert noise not in proc.stderr + proc.stdout


@pytest.mark.process
def test_bad_prompts_file_is_a_clear_error(tiny_target: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user"}]}\n')
    proc = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(tiny_target), "--prompts",
                           str(bad), "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "bad.jsonl:1" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_the_bare_loop_starts_after_the_same_prompt_as_the_engine(tiny_target: Path) -> None:
    """bench --raw compares the bare llama_decode loop with plain decoding through the engine; a pass is
    cheaper at a shorter context, so the loop is prefilled with the bench's first prompt, rendered as a chat
    answer would be, not with the BOS token alone (which made the engine look 21 % slower on SmolLM2)."""
    from app.engine.client import EngineClient
    from app.engine.session import EngineSession
    from app.events import Loaded, RawDecoded
    from app.measure.bench import _await
    from app.params import LoadSettings

    messages = [{"role": "user", "content": "Rename x to count in: for x in range(3): print(x)"}]
    settings = LoadSettings(str(tiny_target), n_ctx=256, n_threads=1)
    session = EngineSession(settings)
    try:
        expected, _warning = session.prompt_tokens(messages)
    finally:
        session.close()
    client = EngineClient()
    try:
        client.load(settings)
        _await(client, Loaded)
        client.raw_decode(4, messages=messages)
        with_prompt = _await(client, RawDecoded)
        client.raw_decode(4)
        bos_only = _await(client, RawDecoded)
    finally:
        client.close()
    assert with_prompt.prompt_tokens == len(expected) > 1
    assert bos_only.prompt_tokens == 1
    assert with_prompt.tokens == bos_only.tokens == 4


def stacked_pass(drafted: int, drafted_ngram: int, accepted: tuple[bool, ...]) -> PassStats:
    return PassStats(request_id=1, t_start=0.0, draft_seconds=0.0, verify_seconds=0.0, k=drafted, drafted=drafted,
                     accepted=accepted, emitted=sum(accepted) + 1, from_ngram=0, from_model=0, context_tokens=0,
                     kv_bytes_used=0, verify_width=drafted + 1, drafted_ngram=drafted_ngram)


def test_each_source_is_counted_by_position_within_its_part_of_the_draft() -> None:
    ngram, trained = source_counts([
        stacked_pass(3, 2, (True, True, False)),  # 2 n-gram tokens accepted, the trained one rejected
        stacked_pass(3, 1, (False,)),  # the n-gram token rejected: the trained ones were never reached
        stacked_pass(2, 0, (True, True)),  # the trained drafter alone
        stacked_pass(0, 0, ()),  # plain
    ])
    assert (ngram.drafted, ngram.accepted) == (3, 2)
    assert ngram.position_drafted == (2, 1)
    assert ngram.per_position_acceptance == (0.5, 1.0)
    assert (trained.drafted, trained.accepted) == (5, 2)
    assert trained.position_drafted == (2, 1)  # the pass whose n-gram token was rejected is not held against it
    assert trained.per_position_acceptance == (0.5, 1.0)
    both = trained + trained
    assert (both.drafted, both.accepted, both.position_drafted, both.position_accepted) == (10, 4, (4, 2), (2, 2))


@pytest.mark.process
def test_bench_json_reports_each_source(tiny_target: Path, tmp_path: Path) -> None:
    """A drafter model (the target's own weights, so every trained token it drafts is right) stacked with the
    n-gram drafter: the report splits drafted, accepted and per-position acceptance by source."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0]) + "\n")
    out = tmp_path / "out.json"
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(tiny_target), "--drafter", str(tiny_target),
           "--ngram", "2", "--k", "3", "--prompts", str(prompts), "--max-tokens", "40", "--threads", "1",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    row, total = report["prompts"][0], report["total"]
    for figures in (row, total):
        sources = figures["sources"]
        assert set(sources) == {FROM_NGRAM, FROM_MODEL}
        assert sum(s["drafted"] for s in sources.values()) == row["drafted"]
        assert sum(s["accepted"] for s in sources.values()) == row["accepted"]
        trained = sources[FROM_MODEL]
        assert trained["drafted"] > 0
        # The target's own weights as drafter: every trained token the target reached was accepted.
        assert trained["per_position_acceptance"]
        assert all(a == 1.0 for a in trained["per_position_acceptance"])
        for figure in sources.values():
            assert len(figure["per_position_acceptance"]) == len(figure["per_position_drafted"])
            assert all(0.0 <= a <= 1.0 for a in figure["per_position_acceptance"])
