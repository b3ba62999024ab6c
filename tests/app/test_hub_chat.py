"""A model pulled from the Hub look-alike (tests/hub_lookalike.py) loads and answers in `specdeck chat`: the real
huggingface_hub client and downloader, then the real worker and llama.cpp on the file that landed in the models
folder. Only that it answers and ends cleanly is asserted, never what it writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from tests.gguf_fixtures import write_tiny_model
from tests.hub_lookalike import HubLookalike

ROOT = Path(__file__).resolve().parents[2]
REPO = "acme/Tiny-GGUF"
Q8 = "Tiny-Q8_0.gguf"
CHAT_TIMEOUT_S = 180  # a bound on a hung child, not a measurement
STATS_LINE = re.compile(r"^\[\d+\.\d tok/s, acceptance \S+, \S+ tokens/pass, \w+\]$", re.MULTILINE)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, specdeck_home: Path) -> Iterator[HubLookalike]:
    server = HubLookalike()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved token
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(tmp_path / "models"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.close()


def test_a_pulled_model_answers_in_chat(hub: HubLookalike, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, write_tiny_model(tmp_path / "src" / "tiny.gguf", name="tiny"))
    assert main(["pull", REPO]) == 0, capsys.readouterr().err
    pulled = tmp_path / "models" / "acme" / "Tiny-GGUF" / Q8
    assert pulled.is_file()

    done = subprocess.run(
        [sys.executable, "-m", "app", "chat", "--target", str(pulled), "--max-tokens", "8", "--ngram", "0",
         "--threads", "1", "--stats"],
        input=b"hello\n", capture_output=True, cwd=ROOT, timeout=CHAT_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert len(STATS_LINE.findall(err)) == 1, err  # one answer, finished (the line follows each answer)
    assert done.stdout.count(b"> ") >= 2  # the prompt before the answer and the one after it
    assert "Traceback" not in err
