"""One set of load options for chat, bench, serve, tune and doctor: one per LoadSettings field, with its default,
llama-server's spellings as aliases, and each bad value refused in LoadSettings.validate()'s own sentence."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import fields
from pathlib import Path

import pytest

from app.cli import SUBCOMMANDS, doctor, main
from app.cli.load_options import NOT_LOAD_OPTIONS, OPTIONS, load_settings
from app.errors import SettingsError
from app.params import ALL_GPU_LAYERS, AUTO_GPU_LAYERS, LoadSettings

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("chat", "bench", "serve", "tune", "doctor")
REQUIRED = {"chat": ["--target", "t.gguf"], "serve": ["--target", "t.gguf"], "doctor": [],
            "bench": ["--target", "t.gguf", "--prompts", "p.jsonl"], "tune": ["--target", "t.gguf", "--prompts", "p"]}


def parser_of(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"specdeck {command}", exit_on_error=False)
    importlib.import_module(SUBCOMMANDS[command][0]).add_arguments(parser)
    return parser


def parse(command: str, *argv: str) -> argparse.Namespace:
    return parser_of(command).parse_args([*REQUIRED[command], *argv])


def test_every_load_setting_has_one_option_and_nothing_else_does() -> None:
    """A new LoadSettings field fails here until it has its option (or is named as set another way)."""
    assert set(OPTIONS) | set(NOT_LOAD_OPTIONS) == {f.name for f in fields(LoadSettings)}
    assert not set(OPTIONS) & set(NOT_LOAD_OPTIONS)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_takes_every_load_option_with_the_settings_default(command: str) -> None:
    actions = {a.dest: a for a in parser_of(command)._actions}
    for dest, aliases in OPTIONS.values():
        assert dest in actions, f"{command} has no --{dest.replace('_', '-')}"
        assert set(actions[dest].option_strings) == {"--" + dest.replace("_", "-"), *aliases}
    if command == "doctor":
        return  # its --ctx defaults to the model's own context where that is shorter
    assert load_settings(parse(command), "t.gguf") == LoadSettings("t.gguf")


def test_no_command_writes_a_default_of_its_own() -> None:
    for command in COMMANDS:
        source = (ROOT / "app" / "cli" / f"{command}.py").read_text()
        assert "4096" not in source, command
        assert '"--ctx"' not in source, command
        assert '"--rpc"' not in source, command


@pytest.mark.parametrize("command", COMMANDS)
def test_llama_servers_spellings_mean_the_same(command: str) -> None:
    ours = parse(command, "--ctx", "2048", "--batch", "256", "--threads", "3", "--gpu-layers", "20",
                 "--main-gpu", "1", "--kv-type", "q8_0", "--flash-attn", "on", "--recurrent-rollback", "checkpoints")
    theirs = parse(command, "-c", "2048", "-b", "256", "-t", "3", "-ngl", "20", "-mg", "1", "-ctk", "q8_0",
                   "-fa", "on", "--recurrent-rollback", "checkpoints")
    long = parse(command, "--ctx-size", "2048", "--batch-size", "256", "--n-gpu-layers", "20",
                 "--cache-type-k", "q8_0")
    expected = LoadSettings("t.gguf", n_ctx=2048, n_batch=256, n_threads=3, n_gpu_layers=20, main_gpu=1,
                            kv_type="q8_0", flash_attn="on", recurrent_rollback="checkpoints")
    assert load_settings(ours, "t.gguf") == load_settings(theirs, "t.gguf") == expected
    assert load_settings(long, "t.gguf") == LoadSettings("t.gguf", n_ctx=2048, n_batch=256, n_gpu_layers=20,
                                                         kv_type="q8_0")


def test_gpu_layers_take_auto_all_or_a_count() -> None:
    assert load_settings(parse("chat", "--gpu-layers", "auto"), "t.gguf").n_gpu_layers == AUTO_GPU_LAYERS
    assert load_settings(parse("chat", "--gpu-layers", "all"), "t.gguf").n_gpu_layers == ALL_GPU_LAYERS
    assert load_settings(parse("chat", "-ngl", "-1"), "t.gguf").n_gpu_layers == ALL_GPU_LAYERS
    assert load_settings(parse("chat", "-ngl", "0"), "t.gguf").n_gpu_layers == 0
    assert load_settings(parse("chat", "-ngl", "99"), "t.gguf").n_gpu_layers == 99
    assert load_settings(parse("chat"), "t.gguf").n_gpu_layers == AUTO_GPU_LAYERS


def test_rpc_servers_are_read_as_endpoints() -> None:
    settings = load_settings(parse("serve", "--rpc", "10.0.0.2:50052, 10.0.0.3:50052"), "t.gguf")
    assert settings.rpc_servers == ("10.0.0.2:50052", "10.0.0.3:50052")


BAD = [
    (["--ctx", "lots"], "Context size must be a number, not 'lots'."),
    (["-c", "8"], "Context size must be between 16 and 1048576; 8 is out of range."),
    (["--batch", "8"], "Batch size must be between 16 and 65536; 8 is out of range."),
    (["--threads", "-2"], "Threads must be between 0 and 1024; -2 is out of range."),
    (["--gpu-layers", "most"], "GPU layers must be auto, all or a number from 0 to 10000, not most."),
    (["-ngl", "-5"], "GPU layers must be auto, all or a number from 0 to 10000, not -5."),
    (["--main-gpu", "first"], "Main GPU must be a number, not 'first'."),
    (["--kv-type", "q3"], "KV cache type must be one of "),
    (["--flash-attn", "maybe"], "Flash attention must be auto, on or off, not 'maybe'."),
    (["--kv-type", "q8_0", "-fa", "off"], "A quantized KV cache needs flash attention: set it to auto or on."),
    (["--recurrent-rollback", "never"], "Recurrent rollback must be one of auto, checkpoints, not 'never'."),
    (["--rpc", "nohost"], "An RPC server is written host:port, such as 192.168.1.20:50052, not 'nohost'."),
]


@pytest.mark.parametrize(("argv", "sentence"), BAD)
def test_a_bad_value_is_one_sentence_from_the_settings(argv: list[str], sentence: str) -> None:
    for command in COMMANDS[:-1]:
        with pytest.raises(SettingsError) as err:
            load_settings(parse(command, *argv), "t.gguf")
        assert str(err.value).startswith(sentence)
        assert "\n" not in str(err.value)
    with pytest.raises(SettingsError) as err:
        doctor.options_from(parse("doctor", *argv))  # its --ctx may be left to the model
    assert str(err.value).startswith(sentence)


def test_a_bad_value_is_refused_by_each_command_before_anything_loads(
        tmp_path: Path, tiny_target: Path, capsys: pytest.CaptureFixture[str], specdeck_home: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    target = str(tiny_target)
    runs = {
        "chat": ["chat", "--target", target],
        "bench": ["bench", "--target", target, "--prompts", str(prompts)],
        "serve": ["serve", "--target", target, "--port", "0"],
        "tune": ["tune", "--target", target, "--prompts", str(prompts)],
        "doctor": ["doctor", "--model", target],
    }
    for command, argv in runs.items():
        code = main([*argv, "--gpu-layers", "most"])
        err = capsys.readouterr().err
        assert code != 0, command
        assert f"specdeck {command}: GPU layers must be auto, all or a number from 0 to 10000, not most." in err
