#!/usr/bin/env python3
"""A coding agent's conversation through `specdeck serve` and llama-server, turn by turn, with tools.

    .venv/bin/python benchmarks/agent_serve.py --target MODEL.gguf [--repeat 3] [--max-tokens 256]

The conversation is an agent's: the user asks for an edit, the agent calls `read_file`, the tool returns a
file of about 2,000 tokens, and each turn after that asks for the whole file again with one more rename, so
every answer re-emits text that is already in the conversation. Each turn is sent to `/v1/chat/completions`
with the tools, as an agent sends it (the whole conversation every time, streamed, greedy), and the answer
is appended before the next turn. Engines and modes: SpecDeck with speculation (the suffix drafter, adaptive
depth) and without; llama-server (`--jinja`, built by `packaging/build_llama_server`) plain and with each of
its n-gram modes. A fresh server per mode and repeat; the order alternates between repeats.

Per turn it records the time to the first streamed token seen by the client (turn 1 prefills the whole
conversation; later turns reuse the KV prefix of the one before) and the engine's own decode rate
(`timings.predicted_per_second`). Each speedup is against the same engine's plain decoding in the same repeat:
medians of the repeats with their ranges.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.params import NGRAM_KEY_LENGTH, DraftSettings, LoadSettings  # noqa: E402
from app.serve.metrics import ServeMetrics  # noqa: E402
from app.serve.protocol import Limits  # noqa: E402
from app.serve.runner import EngineRunner  # noqa: E402
from app.serve.server import ServeOptions, Server  # noqa: E402
from benchmarks.vs_llama_server import NGRAM_MODES, find_server  # noqa: E402
from benchmarks.vs_llama_server import Server as LlamaServer  # noqa: E402

SOURCE = ROOT / "app" / "serve" / "protocol.py"
RENAMES = [("max_tokens", "token_limit"), ("limits", "bounds"), ("messages", "turns"), ("sampling", "draws")]
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the project.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a whole file.",
                                      "parameters": {"type": "object",
                                                     "properties": {"path": {"type": "string"},
                                                                    "text": {"type": "string"}},
                                                     "required": ["path", "text"]}}},
]


def source_text(lines: int) -> str:
    return "\n".join(SOURCE.read_text().splitlines()[:lines])


def opening(lines: int) -> list[dict[str, Any]]:
    old, new = RENAMES[0]
    return [
        {"role": "system", "content": "You are a coding agent. Use the tools to read files. When you change a "
                                      "file, output the whole new file in one code block."},
        {"role": "user", "content": f"In app/serve/protocol.py, rename `{old}` to `{new}`."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "read_file", "arguments": json.dumps({"path": "app/serve/protocol.py"})}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": source_text(lines)},
    ]


def stream_turn(url: str, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """One streamed, greedy turn: the answer, the client's time to the first token and the engine's timings."""
    body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    text: list[str] = []
    timings: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(piece)
    return {"text": "".join(text), "ttft": ttft or 0.0, "tok_s": float(timings.get("predicted_per_second", 0.0)),
            "tokens": int(timings.get("predicted_n", 0)), "prompt_n": int(timings.get("prompt_n", 0)),
            "drafted": int(timings.get("draft_n", 0)), "accepted": int(timings.get("draft_n_accepted", 0))}


def conversation(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    messages = opening(args.lines)
    turns = []
    for i in range(args.turns):
        turn = stream_turn(url, messages, args.max_tokens)
        turns.append(turn)
        old, new = RENAMES[(i + 1) % len(RENAMES)]
        messages += [{"role": "assistant", "content": turn["text"]},
                     {"role": "user", "content": f"Now also rename `{old}` to `{new}` and output the whole file "
                                                 "again."}]
    return turns


class SpecDeckServer:
    def __init__(self, target: Path, speculate: bool, args: argparse.Namespace, home: Path) -> None:
        draft = DraftSettings(ngram=NGRAM_KEY_LENGTH if speculate else 0, adaptive=True)
        settings = LoadSettings(target_path=str(target), n_ctx=args.ctx, draft=draft,
                                n_threads=args.threads or LoadSettings.n_threads)
        metrics = ServeMetrics()
        self.runner = EngineRunner(settings, metrics, history_path=home / "history.sqlite3")
        self.server = Server(self.runner, metrics, ServeOptions(port=0, limits=Limits(max_tokens=args.max_tokens)))

    def __enter__(self) -> SpecDeckServer:
        self.server.start_in_thread()
        deadline = time.monotonic() + 600
        while httpx.get(self.server.base_url + "/health").status_code != 200:
            if self.runner.state == "error" or time.monotonic() > deadline:
                raise SystemExit(f"specdeck serve did not load the model: {self.runner.message}")
            time.sleep(0.2)
        self.url = self.server.base_url
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def summary(runs: dict[str, list[list[dict[str, Any]]]], plain_of: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for name, repeats in runs.items():
        rates = [statistics.fmean(t["tok_s"] for t in turns[1:] or turns) for turns in repeats]
        plain = [statistics.fmean(t["tok_s"] for t in turns[1:] or turns) for turns in runs[plain_of[name]]]
        ratios = [r / p for r, p in zip(rates, plain, strict=True) if p]
        drafted = sum(t["drafted"] for turns in repeats for t in turns)
        accepted = sum(t["accepted"] for turns in repeats for t in turns)
        rows.append({
            "mode": name, "tok_s": statistics.median(rates), "tok_s_min": min(rates), "tok_s_max": max(rates),
            "speedup": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
            "ttft_turn1": statistics.median(turns[0]["ttft"] for turns in repeats),
            "ttft_turn2": statistics.median(turns[1]["ttft"] for turns in repeats) if len(repeats[0]) > 1 else 0,
            "prompt_turn1": repeats[0][0]["prompt_n"],
            "acceptance": accepted / drafted if drafted else 0.0,
        })
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| engine, mode | decode tok/s | speedup over own plain | turn-1 TTFT s | turn-2 TTFT s | acceptance |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['tok_s']:.1f} ({r['tok_s_min']:.1f}–{r['tok_s_max']:.1f}) | "
                     f"{r['speedup']:.2f}× ({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | "
                     f"{r['ttft_turn1']:.2f} | {r['ttft_turn2']:.2f} | {r['acceptance']:.0%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--lines", type=int, default=170, help="lines of the file the tool returns")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--no-llama-server", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    binary = None if args.no_llama_server else find_server()
    if binary is None and not args.no_llama_server:
        print("llama-server is not built (python3 packaging/build_llama_server); running SpecDeck only.",
              file=sys.stderr)
    modes: list[tuple[str, str | None]] = [("specdeck plain", None), ("specdeck speculative", "suffix")]
    if binary is not None:
        modes += [("llama-server plain", None)] + [(f"llama-server {m}", m) for m in NGRAM_MODES]
    plain_of = {name: name.split(" ")[0] + " plain" for name, _ in modes}
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _ in modes}
    with tempfile.TemporaryDirectory(prefix="agent-serve-") as scratch:
        for r in range(args.repeat):
            for name, mode in modes if r % 2 == 0 else list(reversed(modes)):
                home = Path(scratch) / f"{r}-{name.replace(' ', '-')}"
                home.mkdir()
                if name.startswith("specdeck"):
                    with SpecDeckServer(args.target, mode is not None, args, home) as sd:
                        turns = conversation(sd.url, args)
                else:
                    assert binary is not None
                    llama_args = argparse.Namespace(ctx=args.ctx, threads=args.threads)
                    # --jinja: the model's own template renders the tools, as an agent needs
                    with LlamaServer(binary, args.target, mode, None, llama_args, home / "log.txt",
                                     ("--jinja",)) as ls:
                        turns = conversation(ls.url, args)
                runs[name].append(turns)
                print(f"  repeat {r + 1} {name:<26} " + "  ".join(
                    f"turn {i + 1}: {t['tok_s']:5.1f} tok/s, TTFT {t['ttft']:.2f} s" for i, t in enumerate(turns)),
                    flush=True)
    rows = summary(runs, plain_of)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
