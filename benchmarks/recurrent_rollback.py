"""What taking back rejected drafts costs a hybrid target per pass: llama.cpp's state snapshots against
SpecDeck's checkpoints, measured with `specdeck bench` in alternating order.

Greedy drafts and verification are deterministic, so both settings verify the same drafts and accept the same
tokens (bench checks the text against plain decoding); only the time per pass differs: the snapshot path
writes a state copy per token inside the pass, the checkpoint path copies the state before each drafting pass,
restores it on a partial accept and decodes the accepted tokens again at the front of the next pass.

    python benchmarks/recurrent_rollback.py --write-tiny /tmp/rb --rounds 4 --repeat 3
    python benchmarks/recurrent_rollback.py --target T.gguf --drafter D.gguf

With --write-tiny a Qwen3.5-architecture hybrid (8 layers, 256 wide; Gated DeltaNet beside attention) and a
drafter of its weights plus noise are written there first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = {"messages": [{"role": "user", "content": "Write a story about a fox and a dog who become friends."}]}
MODES = ("auto", "checkpoints")


def write_tiny(folder: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from tests.gguf_fixtures import write_tiny_model

    shape = {"arch": "qwen35", "n_layer": 8, "n_embd": 256, "n_head": 8, "n_head_kv": 4, "n_ff": 512}
    target = write_tiny_model(folder / "hybrid-target.gguf", name="hybrid-target", **shape)  # type: ignore[arg-type]
    drafter = write_tiny_model(folder / "hybrid-drafter.gguf", name="hybrid-drafter", perturb=0.05,
                               perturb_seed=1, **shape)  # type: ignore[arg-type]
    return target, drafter


def bench(target: Path, drafter: Path, mode: str, args: argparse.Namespace, folder: Path) -> list[float]:
    """Milliseconds per pass of each repeat (tokens per pass over tokens per second)."""
    prompts = folder / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPT) + "\n")
    out = folder / f"{mode}.json"
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(target), "--drafter", str(drafter),
           "--k", str(args.k), "--prompts", str(prompts), "--max-tokens", str(args.max_tokens),
           "--threads", str(args.threads), "--repeat", str(args.repeat), "--recurrent-rollback", mode,
           "--json", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    report = json.loads(out.read_text())
    [prompt] = report["prompts"]
    tau = prompt["tokens_per_pass"]
    return [1e3 * tau / run["tok_s"] for run in prompt["runs"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path)
    parser.add_argument("--drafter", type=Path)
    parser.add_argument("--write-tiny", type=Path, metavar="DIR", help="write a tiny hybrid and drafter here first")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of both settings")
    parser.add_argument("--repeat", type=int, default=3, help="bench repeats per round")
    parser.add_argument("--k", type=int, default=4, help="fixed draft depth")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.write_tiny:
        args.write_tiny.mkdir(parents=True, exist_ok=True)
        args.target, args.drafter = write_tiny(args.write_tiny)
    if not args.target or not args.drafter:
        parser.error("give --target and --drafter, or --write-tiny DIR")
    per_pass: dict[str, list[float]] = {mode: [] for mode in MODES}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            got = {mode: bench(args.target, args.drafter, mode, args, Path(tmp)) for mode in order}
            for mode in MODES:
                per_pass[mode] += got[mode]
            ratios.append(statistics.median(got["checkpoints"]) / statistics.median(got["auto"]))
    for mode in MODES:
        ms = per_pass[mode]
        print(f"{mode:<12} {statistics.median(ms):7.3f} ms per pass (min {min(ms):.3f}, max {max(ms):.3f}, "
              f"{len(ms)} runs)")
    print(f"checkpoints / snapshots per pass: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
