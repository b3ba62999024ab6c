"""Recurrent and hybrid targets in every command, as a user runs them: `bench`, `doctor --decode-check`,
`chat` over two turns, and `serve` with the official `openai` client; each with the n-gram drafter on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.app.test_serve import start_server
from tests.app.test_terminal_chat import Chat
from tests.gguf_fixtures import write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
# A pure recurrent model, a hybrid with llama.cpp's state snapshots, and a hybrid without them.
ARCHS = ("mamba", "qwen35", "granitehybrid")
PROMPTS = [{"messages": [{"role": "user", "content": "Repeat: alpha beta gamma, alpha beta gamma, alpha beta"}]}]


@pytest.fixture(scope="module", params=ARCHS)
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(f"recurrent-{request.param}")
    return write_tiny_model(folder / f"tiny-{request.param}.gguf", arch=request.param, n_layer=4,
                            name=f"tiny-{request.param}")


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "SPECDECK_HOME": str(home), "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("rollback", ["auto", "checkpoints"])
@pytest.mark.process
def test_bench_speculates_and_matches_plain_decoding(model: Path, tmp_path: Path, rollback: str) -> None:
    """A drafter of the same architecture (about half its drafts accepted) stacked with the n-gram drafter."""
    arch = model.stem.removeprefix("tiny-")
    drafter = write_tiny_model(tmp_path / "drafter.gguf", arch=arch, n_layer=4, perturb=0.05, perturb_seed=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(model), "--drafter", str(drafter),
           "--ngram", "3", "--k", "4",
           "--prompts", str(prompts), "--baseline", "--max-tokens", "48", "--threads", "1",
           "--recurrent-rollback", rollback, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "identical True" in proc.stdout
    report = json.loads(out.read_text())
    [prompt] = report["prompts"]
    assert prompt["drafted"] > 0
    assert prompt["accepted"] > 0


@pytest.mark.process
def test_doctor_counts_the_state_and_the_decode_check_passes(model: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "app", "doctor", "--model", str(model), "--decode-check"],
                          capture_output=True, text=True, env=env_for(tmp_path), cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "recurrent layers" in done.stdout
    assert "read and written every pass" in done.stdout
    js = subprocess.run([sys.executable, "-m", "app", "doctor", "--json", "--model", str(model)],
                        capture_output=True, text=True, env=env_for(tmp_path), cwd=ROOT, timeout=600)
    target = json.loads(js.stdout)["target"]
    assert target["recurrent_state_bytes"] > 0
    assert target["recurrent_state_allocated"] >= 2 * target["recurrent_state_bytes"]
    if model.stem.endswith("mamba"):
        assert target["kv_layer_count"] == 0
        assert target["kv_bytes_per_token"] == 0
        assert "KV cache     none" in done.stdout


@pytest.mark.process
def test_chat_answers_two_turns_with_the_ngram_drafter_on(model: Path, tmp_path: Path) -> None:
    chat = Chat(model, "--ngram", "3", env={"SPECDECK_HOME": str(tmp_path)})
    try:
        chat.wait_for(lambda: chat.prompts() >= 1, "first prompt")
        chat.ask("alpha beta gamma, alpha beta gamma")
        chat.ask("and once more: alpha beta gamma")
        assert chat.prompts() >= 3
        assert chat.finish() == 0
        assert b"Traceback" not in chat.stderr
        assert b"turn the drafters off" not in chat.stderr.lower()
    finally:
        chat.close()


@pytest.mark.server
def test_serve_answers_over_the_api(model: Path, tmp_path: Path) -> None:
    server = start_server(model, tmp_path / "history.sqlite3")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    try:
        for _ in range(2):
            reply = client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "abc abc abc abc abc abc"}], max_tokens=24,
                temperature=0.0)
            assert reply.usage is not None
            assert reply.usage.completion_tokens > 0
    finally:
        client.close()  # its connection pool, before the server goes
        server.stop()


@pytest.mark.process
def test_tune_sweeps_a_hybrid(tmp_path: Path) -> None:
    """tune's settings sweep on a hybrid without snapshots (every drafting pass checkpoints)."""
    model = write_tiny_model(tmp_path / "tiny-granitehybrid.gguf", arch="granitehybrid", n_layer=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "tune.json"
    cmd = [sys.executable, "-m", "app", "tune", "--target", str(model), "--prompts", str(prompts),
           "--max-tokens", "32", "--threads", "1", "--budget-s", "60", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    measured = [r for r in report["results"] if r["settings"]["drafter"] != "none"]
    assert measured
    assert all(r["identical"] is True and r["tok_s"] > 0 for r in measured)  # greedy: the text never changes
