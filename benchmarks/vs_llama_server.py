#!/usr/bin/env python3
"""SpecDeck against llama.cpp's own speculative decoding, on the same prompts, in one sitting.

llama-server (built from the llama.cpp that llama-cpp-python vendors, with the CPU flags bootstrap chooses:
`python3 packaging/build_llama_server`) runs each prompt plain and with each of its drafting modes
(`--spec-type ngram-simple`, `ngram-map-k`, `ngram-mod`, and `draft-simple` when a drafter is given);
then `specdeck bench --baseline` runs the same prompts. Both engines get the same prompt tokens: each chat is
rendered and tokenized as SpecDeck renders it and sent to llama-server's `/completion`. Each speedup is
against that engine's own plain decoding, as the median of the repeats with its range. A fresh server
starts for every mode and repeat, so no mode drafts from an earlier repeat's answers (ngram-mod's pool
outlives a request).

    .venv/bin/python benchmarks/vs_llama_server.py --target MODEL.gguf [--target MODEL2.gguf] \\
        [--drafter DRAFTER.gguf] [--prompts resources/prompts/edit.jsonl] [--max-tokens 256] [--repeat 3]
    .venv/bin/python benchmarks/vs_llama_server.py --target MODEL.gguf --workloads   # every bundled workload

--prompts is repeatable; --workloads runs every file in WORKLOADS (edits, multi-turn edits, an agent loop,
a RAG summary, JSON extraction, prose), each one a row. Prints a Markdown table (the README's "Speed" table)
and, with --json, writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.llama import Model, init_backend  # noqa: E402
from app.engine.session import chat_prompt_tokens  # noqa: E402
from app.measure.bench import read_prompts  # noqa: E402
from app.params import NGRAM_KEY_LENGTH  # noqa: E402

NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod")
PROMPTS_DIR = ROOT / "resources" / "prompts"
WORKLOADS = ("edit", "multi_turn", "agent", "rag", "json", "prose")
READY_TIMEOUT_S = 120.0


def find_server() -> Path | None:
    proc = subprocess.run([sys.executable, str(ROOT / "packaging" / "build_llama_server"), "--print"],
                          capture_output=True, text=True)
    path = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    return path if path is not None and path.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One llama-server process for one mode; stopped on exit."""

    def __init__(self, binary: Path, target: Path, mode: str | None, drafter: Path | None, args: argparse.Namespace,
                 log: Path, extra: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        cmd = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port),
               "-c", str(args.ctx), "-np", "1", "--no-webui", *extra]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        if mode is not None:
            cmd += ["--spec-type", mode]
        if mode == "draft-simple" and drafter is not None:
            cmd += ["--spec-draft-model", str(drafter)]
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, GGML_NO_BACKTRACE="1"))
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited with status {self.proc.returncode}; its log: {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise SystemExit(f"llama-server did not become ready in {READY_TIMEOUT_S:.0f} s; its log: {self.log}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()

    def answer(self, prompt: list[int], max_tokens: int) -> dict[str, float]:
        """One greedy answer to these prompt tokens; llama-server's own decode timing (prompt excluded)."""
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "seed": 1234,
                "cache_prompt": False}
        reply = httpx.post(f"{self.url}/completion", json=body, timeout=1800).json()
        t = reply["timings"]
        return {"tokens": float(t["predicted_n"]), "ms": float(t["predicted_ms"]),
                "drafted": float(t.get("draft_n", 0)), "accepted": float(t.get("draft_n_accepted", 0))}


def prompt_tokens(target: Path, chats: list[list[dict[str, str]]]) -> list[list[int]]:
    """Each chat rendered and tokenized as SpecDeck renders it, so both engines decode from the same tokens.

    Sent through llama-server's chat endpoint instead, a chat is rendered with llama-server's own template
    choice: for a model without a chat template (the Gemma demo) that is ChatML, not Gemma's format, and the
    two engines then answer different prompts with different text.
    """
    init_backend()
    model = Model(target, vocab_only=True)
    try:
        return [chat_prompt_tokens(model, chat)[0] for chat in chats]
    finally:
        model.close()


def rate(answers: list[dict[str, float]]) -> float:
    ms = sum(a["ms"] for a in answers)
    return 1000 * sum(a["tokens"] for a in answers) / ms if ms else 0.0


def llama_server_modes(binary: Path, target: Path, drafter: Path | None, prompts: list[list[int]],
                       args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    modes: list[str | None] = [None, *NGRAM_MODES] + (["draft-simple"] if drafter else [])
    rates: dict[str, list[float]] = {m or "plain": [] for m in modes}
    acceptance: dict[str, list[float]] = {m or "plain": [] for m in modes}
    for r in range(args.repeat):
        # Alternate the order each repeat, so a machine that slows down drifts every mode alike.
        for mode in modes if r % 2 == 0 else list(reversed(modes)):
            name = mode or "plain"
            with Server(binary, target, mode, drafter, args, logs / f"{target.stem}-{name}-{r}.log") as server:
                answers = [server.answer(m, args.max_tokens) for m in prompts]
            rates[name].append(rate(answers))
            drafted = sum(a["drafted"] for a in answers)
            acceptance[name].append(sum(a["accepted"] for a in answers) / drafted if drafted else 0.0)
            print(f"  llama-server {name:<13} repeat {r + 1}: {rates[name][-1]:6.1f} tok/s", flush=True)
    out: dict[str, Any] = {"plain_tok_s": statistics.median(rates["plain"])}
    for name, values in rates.items():
        if name == "plain":
            continue
        ratios = [v / p for v, p in zip(values, rates["plain"], strict=True)]
        out[name] = {"speedup": statistics.median(ratios), "speedup_min": min(ratios),
                     "speedup_max": max(ratios), "tok_s": statistics.median(values),
                     "acceptance": statistics.median(acceptance[name])}
    return out


def specdeck_bench(target: Path, drafter: Path | None, prompts: Path, args: argparse.Namespace,
                   out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "app", "bench", "--target", str(target), "--ngram", str(args.ngram),
           "--prompts", str(prompts), "--baseline", "--repeat", str(args.repeat),
           "--max-tokens", str(args.max_tokens), "--ctx", str(args.ctx), "--json", str(out)]
    if drafter is not None:
        cmd += ["--drafter", str(drafter)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"specdeck bench failed: {proc.stderr.strip()[-2000:]}")
    print("  " + proc.stdout.strip().splitlines()[-1], flush=True)
    report = json.loads(out.read_text())
    total = report["total"]
    return {"plain_tok_s": total["baseline"]["tok_s"], "tok_s": total["tok_s"], "speedup": total["speedup"],
            "speedup_min": total["speedup_min"], "speedup_max": total["speedup_max"],
            "acceptance": total["acceptance"], "tokens_per_pass": total["tokens_per_pass"],
            "verify_cost_ms": report["verify_cost_ms"]}


def cell(m: dict[str, Any] | None) -> str:
    if not m:
        return "-"
    return f"{m['speedup']:.2f}× ({m['speedup_min']:.2f}–{m['speedup_max']:.2f})"


def table(rows: list[dict[str, Any]], with_drafter: bool) -> str:
    head = ["model", "workload", "llama.cpp plain tok/s", *NGRAM_MODES] + (["draft-simple"] if with_drafter else [])
    head += ["SpecDeck plain tok/s", "SpecDeck adaptive suffix" + (" + drafter" if with_drafter else "")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ls, sd = row["llama_server"], row["specdeck"]
        cells = [row["model"], row["workload"], f"{ls['plain_tok_s']:.1f}",
                 *(cell(ls.get(m)) for m in NGRAM_MODES)]
        if with_drafter:
            cells.append(cell(ls.get("draft-simple")))
        cells += [f"{sd['plain_tok_s']:.1f}", cell(sd)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, action="append", required=True, help="repeatable")
    parser.add_argument("--drafter", type=Path, help="drafter model for draft-simple and SpecDeck (one target)")
    parser.add_argument("--prompts", type=Path, action="append", help="repeatable (default: edit.jsonl)")
    parser.add_argument("--workloads", action="store_true", help="every bundled workload: " + ", ".join(WORKLOADS))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ngram", type=int, default=NGRAM_KEY_LENGTH, help="SpecDeck's shortest suffix match")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0, help="0: each engine's own default")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep each SpecDeck bench report here (for oracle_replay.py --bench)")
    args = parser.parse_args()
    binary = find_server()
    if binary is None:
        print("llama-server is not built yet. Build it once (about 10 minutes on 2 cores) with\n"
              "    python3 packaging/build_llama_server\n"
              "and run this again; it is cached under ~/.cache/specdeck/tools/.", file=sys.stderr)
        return 2
    if args.drafter is not None and len(args.target) > 1:
        parser.error("--drafter goes with one --target")
    files = [PROMPTS_DIR / f"{name}.jsonl" for name in WORKLOADS] if args.workloads else []
    files += args.prompts or ([] if files else [PROMPTS_DIR / "edit.jsonl"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-llama-server-") as scratch:
        logs = Path(scratch)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
        for target in args.target:
            for path in files:
                prompts = read_prompts(path)
                print(f"{target.name}, {path.name}: {len(prompts)} prompts, {args.max_tokens} tokens, "
                      f"{args.repeat} repeats", flush=True)
                ls = llama_server_modes(binary, target, args.drafter, prompt_tokens(target, prompts), args, logs)
                report = (args.keep or logs) / f"{target.stem}-{path.stem}.json"
                sd = specdeck_bench(target, args.drafter, path, args, report)
                rows.append({"model": target.stem, "workload": path.stem, "llama_server": ls, "specdeck": sd})
    print()
    print(f"{', '.join(p.name for p in files)} (the same prompt tokens in both engines), greedy, {args.max_tokens} "
          f"tokens, median of {args.repeat} (range); each speedup against that engine's own plain decoding:")
    print(table(rows, args.drafter is not None))
    if args.json:
        args.json.write_text(json.dumps({"prompts": [str(p) for p in files], "max_tokens": args.max_tokens,
                                         "repeat": args.repeat, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
