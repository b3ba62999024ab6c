#!/usr/bin/env python3
"""What the open window and its live dashboard cost in decode speed.

Alternates, in one run, the same prompt (plain greedy decoding, so both produce the same tokens):
  A. the real window (offscreen), driven by its autopilot: engine worker + bridge + chat + dashboard;
  B. `specdeck bench --k 0`: the engine alone, in-process.
Prints decode tok/s of each pair and the median ratio A / B.

    .venv/bin/python benchmarks/dashboard_cost.py [--model smollm2|gemma] [--rounds 3] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.library.demo_install import install_demo_models  # noqa: E402

PROMPTS = ROOT / "resources" / "prompts" / "prose.jsonl"


def window_run(model: Path, prompt: str, max_tokens: int, home: str) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        report = Path(fh.name)
    env = dict(os.environ, SPECDECK_HOME=home, SPECDECK_MODELS_DIR=str(model.parent), QT_QPA_PLATFORM="offscreen")
    env["SPECDECK_AUTOPILOT"] = json.dumps({"target": str(model), "ngram": 0, "prompts": [prompt],
                                            "max_tokens": max_tokens, "report": str(report)})
    subprocess.run([sys.executable, "-c", "import sys; from ui.launch import main; sys.exit(main([]))"],
                   cwd=ROOT, env=env, capture_output=True, timeout=600, check=True)
    result = json.loads(report.read_text())
    report.unlink()
    return float(result[0]["decode_tps"])


def bench_run(model: Path, prompts_file: Path, max_tokens: int) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = Path(fh.name)
    subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(model), "--k", "0",
                    "--prompts", str(prompts_file), "--max-tokens", str(max_tokens), "--json", str(out)],
                   cwd=ROOT, capture_output=True, timeout=600, check=True)
    result = json.loads(out.read_text())
    out.unlink()
    return float(result["total"]["tok_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "gemma"), default="smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    smollm2, gemma = install_demo_models()
    model = smollm2 if args.model == "smollm2" else gemma
    line = PROMPTS.read_text().splitlines()[0]
    prompt = json.loads(line)["messages"][0]["content"]
    ratios = []
    with tempfile.TemporaryDirectory() as home:
        one = Path(home) / "one.jsonl"
        one.write_text(line + "\n")
        for i in range(args.rounds):
            a = window_run(model, prompt, args.max_tokens, home)
            b = bench_run(model, one, args.max_tokens)
            ratios.append(a / b)
            print(f"round {i + 1}: window {a:.1f} tok/s, bench {b:.1f} tok/s, ratio {a / b:.3f}", flush=True)
    print(f"median ratio window / bench: {statistics.median(ratios):.3f} "
          f"(dashboard and window cost {100 * (1 - statistics.median(ratios)):.1f} % of decode speed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
