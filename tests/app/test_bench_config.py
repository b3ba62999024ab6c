"""The typed engine API under `specdeck bench` and `specdeck tune`: the commands parse their options into a
BenchConfig or a TuneConfig at the edge, with the settings' own defaults; the engine takes the config and
returns a typed report; nothing inside builds argv or writes the prompts to a file."""

from __future__ import annotations

import argparse
import ast
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import bench as bench_cli
from app.cli import tune as tune_cli
from app.errors import SettingsError
from app.measure.bench import BENCH_SAMPLING, BenchConfig, bench
from app.measure.tune import PLAIN, Candidate, TuneConfig
from app.params import DraftSettings, LoadSettings, SamplingSettings

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Copy: one two three four, one two three four"}]


def write_prompts(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    return path


def parse(add_arguments: object, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    assert callable(add_arguments)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_bench_commands_defaults_are_the_configs_own(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path)
    args = parse(bench_cli.add_arguments, ["--target", "/m/t.gguf", "--prompts", str(prompts)])
    assert bench_cli.bench_config(args) == BenchConfig(LoadSettings(target_path="/m/t.gguf"), (MESSAGES,))


def test_the_bench_samples_with_the_sampling_settings_defaults() -> None:
    """One home for the sampling defaults: the bench changes the seed and the answer length, nothing else."""
    chat = SamplingSettings()
    assert chat != BENCH_SAMPLING
    assert replace(BENCH_SAMPLING, seed=chat.seed, max_tokens=chat.max_tokens) == chat


def test_the_bench_command_maps_each_option_onto_the_config(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path)
    args = parse(bench_cli.add_arguments, [
        "--target", "/m/t.gguf", "--drafter", "/m/d.gguf", "--ngram", "2", "--k", "0", "--prompts", str(prompts),
        "--max-tokens", "17", "--temperature", "0.5", "--top-k", "7", "--top-p", "0.9", "--min-p", "0.01",
        "--seed", "9", "--ctx", "1024", "--threads", "3", "--recurrent-rollback", "checkpoints", "--baseline",
        "--repeat", "4", "--raw", "--model-start", "0.4",
    ])
    config = bench_cli.bench_config(args)
    draft = DraftSettings(drafter_path="/m/d.gguf", ngram=2, adaptive=False, k=0, k_max=1, model_start=0.4)
    assert config.settings == LoadSettings("/m/t.gguf", draft, n_ctx=1024, n_threads=3,
                                           recurrent_rollback="checkpoints")
    assert config.sampling == SamplingSettings(temperature=0.5, top_k=7, top_p=0.9, min_p=0.01, seed=9,
                                               max_tokens=17)
    assert (config.baseline, config.repeat, config.raw, config.keep_traces) == (True, 4, True, False)
    adaptive = bench_cli.bench_config(parse(bench_cli.add_arguments, [
        "--target", "/m/t.gguf", "--prompts", str(prompts), "--k-max", "8", "--mtp"]))
    assert adaptive.settings.draft == DraftSettings(k_max=8, mtp=True)


def test_a_bad_option_is_named_before_the_prompts_file_is_read(tmp_path: Path) -> None:
    """As before the config: the settings are checked first, so a wrong number is named even when the prompts
    file is missing too."""
    missing = tmp_path / "missing.jsonl"
    args = parse(bench_cli.add_arguments, ["--target", "/m/t.gguf", "--prompts", str(missing), "--ctx", "1"])
    with pytest.raises(SettingsError, match="Context size"):
        bench_cli.bench_config(args)
    args = parse(bench_cli.add_arguments, ["--target", "/m/t.gguf", "--prompts", str(missing), "--repeat", "0"])
    with pytest.raises(SettingsError, match="--repeat must be at least 1, not 0"):
        bench_cli.bench_config(args)
    args = parse(bench_cli.add_arguments, ["--target", "/m/t.gguf", "--prompts", str(missing)])
    with pytest.raises(SettingsError, match=r"missing\.jsonl"):
        bench_cli.bench_config(args)


def test_the_tune_commands_defaults_are_the_configs_own(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path)
    args = parse(tune_cli.add_arguments, ["--target", "/m/t.gguf", "--prompts", str(prompts)])
    assert tune_cli.tune_config(args) == TuneConfig(LoadSettings(target_path="/m/t.gguf"), (MESSAGES,),
                                                    str(prompts))
    args = parse(tune_cli.add_arguments, [
        "--target", "/m/t.gguf", "--drafter", "/m/d.gguf", "--prompts", str(prompts), "--max-tokens", "20",
        "--repeat", "3", "--temperature", "0.7", "--threads", "2", "--ctx", "2048", "--budget-s", "60",
        "--no-replay"])
    assert tune_cli.tune_config(args) == TuneConfig(
        LoadSettings("/m/t.gguf", DraftSettings(drafter_path="/m/d.gguf"), n_ctx=2048, n_threads=2), (MESSAGES,),
        str(prompts), replace(BENCH_SAMPLING, max_tokens=20, temperature=0.7), repeat=3, budget_s=60.0,
        replay=False)


def test_each_setting_of_a_sweep_is_a_bench_beside_plain_decoding() -> None:
    config = TuneConfig(LoadSettings("/m/t.gguf", DraftSettings(drafter_path="/m/d.gguf", ngram=5), n_ctx=1024),
                        (MESSAGES,), "test", repeat=3)
    fixed = Candidate(use_model=True, ngram=2, adaptive=False, k=8, k_max=8)
    bench_config = config.bench_config(fixed, keep_traces=True)
    assert bench_config == BenchConfig(replace(config.settings, draft=fixed.draft_settings("/m/d.gguf")),
                                       (MESSAGES,), BENCH_SAMPLING, baseline=True, repeat=3, keep_traces=True)
    assert config.bench_config(PLAIN).settings.draft == DraftSettings()  # the drafter model dropped, n-gram off


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_argv_and_no_prompts_file_are_made_inside_the_product() -> None:
    """The engine, the window's Tune and the tune command pass configs and prompts as data: none of them
    imports argparse (the commands' own option parsing is the edge) or writes a temporary file."""
    inside = [*sorted((ROOT / "app" / "engine").glob("*.py")), *sorted((ROOT / "ui" / "dashboard").glob("*.py")),
              ROOT / "app" / "cli" / "tune.py", ROOT / "app" / "cli" / "bench.py"]
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in inside for name in sorted(_imports(path))
                 if name == "tempfile" or (name == "argparse" and path.parent.name != "cli")]
    assert offenders == []
    assert {"argparse"} <= _imports(ROOT / "app" / "cli" / "bench.py")  # the scan sees what it looks for


def test_the_engine_returns_a_typed_report_that_agrees_with_its_json(tiny_target: Path,
                                                                     specdeck_home: Path) -> None:
    config = BenchConfig(LoadSettings(str(tiny_target), DraftSettings(ngram=2), n_ctx=512, n_threads=1),
                         (MESSAGES,), replace(BENCH_SAMPLING, max_tokens=16), baseline=True, keep_traces=True)
    out = io.StringIO()
    report = bench(config, out)
    document = report.as_json()
    total = document["total"]
    assert isinstance(total, dict)
    assert report.total.tok_s == total["tok_s"] > 0
    assert report.total.acceptance == total["acceptance"]
    assert report.baseline is not None
    assert report.baseline.tok_s == total["baseline"]["tok_s"] > 0
    assert report.speedup is not None
    assert report.speedup.median == total["speedup"]
    assert report.speedup.speedups == total["speedups"]
    assert report.speedup.identical is total["identical"] is True  # greedy: speculation never changes the text
    assert report.verify_cost_ms == document["verify_cost_ms"]
    assert "traces" not in document  # the traces are for the tune; the JSON stays as it was
    [trace] = report.traces
    assert trace["prompt"]
    assert trace["answer"]
    assert document["target"] == str(tiny_target)
    assert "speedup" in out.getvalue().splitlines()[-1]  # the table and its summary went to the sink
    with pytest.raises(SettingsError, match="no prompt"):
        bench(replace(config, prompts=()), out)
