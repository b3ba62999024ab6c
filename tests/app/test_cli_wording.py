"""What the command line says about out-of-range settings, odd model files and long error lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.errors import SettingsError
from app.params import DraftSettings, LoadSettings
from tests.gguf_fixtures import write_tiny_model


def test_a_depth_out_of_range_names_its_own_limit() -> None:
    # --k 1000 used to be reported as a batch-size problem.
    with pytest.raises(SettingsError, match=r"Maximum draft depth must be between 0 and 32; 1000 is out of range\."):
        LoadSettings("m.gguf", DraftSettings(k_max=1000)).validate()
    with pytest.raises(SettingsError, match=r"Draft depth k must be between 0 and 32; 1000 is out of range\."):
        LoadSettings("m.gguf", DraftSettings(k=1000, adaptive=False)).validate()
    with pytest.raises(SettingsError, match=r"The batch size \(16\) must be larger than the maximum draft depth "
                                            r"\(20\)"):
        LoadSettings("m.gguf", DraftSettings(k_max=20), n_batch=16).validate()


def test_bench_k_1000_through_the_command(tmp_path: Path, tiny_target: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    code = main(["bench", "--target", str(tiny_target), "--prompts", str(prompts), "--k", "1000"])
    assert code == 1
    err = capsys.readouterr().err
    assert "between 0 and 32; 1000 is out of range" in err
    assert "batch size" not in err


def test_bench_refuses_a_report_path_in_a_missing_folder_before_running(tmp_path: Path, tiny_target: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    code = main(["bench", "--target", str(tiny_target), "--prompts", str(prompts), "--max-tokens", "4",
                 "--json", str(tmp_path / "missing" / "report.json")])
    assert code == 1
    captured = capsys.readouterr()
    assert "does not exist" in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""  # refused before the run: nothing was measured


def test_context_note() -> None:
    settings = LoadSettings("m.gguf", n_ctx=100)
    assert settings.context_note(256) == ("The context was raised from the 100 tokens asked for to 256, the "
                                          "smallest size llama.cpp allocates for it.")
    assert settings.context_note(100) is None


def test_models_escapes_metadata_and_caps_the_error_list(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        specdeck_home: Path) -> None:
    folder = tmp_path / "library"
    write_tiny_model(folder / "evil\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J.gguf")  # a file name is file-derived too
    for n in range(75):
        (folder / f"broken-{n:02}.gguf").write_bytes(b"GGUF" + bytes(20))
    # A newline in a name must not fake a line of the listing.
    (folder / "x\nSOURCE  MODEL  fake-row.gguf").write_bytes(b"junk")
    assert main(["models", "--folder", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\\x1b]52;c;" in out
    assert "Cannot be used (76):" in out
    assert "… and 26 more (`specdeck models --json` lists them all)." in out
    assert len(out.splitlines()) < 70
    assert not any(line.startswith("SOURCE  MODEL  fake-row") for line in out.splitlines())


def test_bench_names_a_refused_template_once_and_escapes_metadata(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_model(tmp_path / "evil.gguf", name="evil\x1b[2J\nFAKE ROW", chat_template="{{ ''.__class__ }}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n'
                       '{"messages": [{"role": "user", "content": "yo"}]}\n')
    assert main(["bench", "--target", str(model), "--prompts", str(prompts), "--max-tokens", "4"]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out
    assert "target evil\\x1b[2J\\nFAKE ROW" in captured.out
    assert captured.err.count("chat template tried to reach Python internals") == 1
    assert "Answering with the plain ChatML format instead." in captured.err


def test_bench_says_when_the_context_was_raised(tmp_path: Path, tiny_target: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert main(["bench", "--target", str(tiny_target), "--prompts", str(prompts), "--max-tokens", "4",
                 "--ctx", "100"]) == 0
    assert "The context was raised from the 100 tokens asked for to 256" in capsys.readouterr().err
