"""Plain and speculative decoding, local against a model split over two llama.cpp rpc-server processes.

    .venv-rpc/bin/python benchmarks/rpc_vs_local.py [--target MODEL.gguf] [--server PATH/rpc-server]
        [--prompts FILE.jsonl] [--max-tokens 128] [--repeat 3] [--ngram 3] [--k-max 16] [--netem-ms 1]
        [--json OUT.json]

Needs llama.cpp built with RPC (`python3 bootstrap.py --build rpc`) and rpc-server
(`python3 packaging/build_rpc_server`). Starts two rpc-server processes on loopback (one thread each), and one
engine worker (one thread) that loads the model locally, then split over the two servers, alternating which
goes first from repeat to repeat. Each prompt runs plain and speculative (the suffix drafter), alternating
which goes first. Prints the median decode tok/s with its spread per condition, whether every answer's
greedy tokens equal the local plain answer's, and the round trips per pass measured at load.

``--netem-ms N`` adds a third condition: the same split with N ms of delay on the loopback interface
(`tc qdisc add dev lo root netem delay Nms`, root only), removed again right after, also on failure. Every
process using the loopback sees that delay while it is on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.client import EngineClient  # noqa: E402
from app.events import BenchResult, EngineCrashed, EngineError, Event, Loaded  # noqa: E402
from app.measure.bench import WATCHDOG_SECONDS, read_prompts  # noqa: E402
from app.measure.bench_report import RunResult  # noqa: E402
from app.params import DraftSettings, LoadSettings, SamplingSettings  # noqa: E402
from tests.rpc.conftest import RpcServer, start_server  # noqa: E402


def await_event(client: EngineClient, kind: type) -> Event:
    for event in client.events(timeout=WATCHDOG_SECONDS):
        if isinstance(event, EngineError | EngineCrashed):
            raise SystemExit(f"the engine said: {event.message}")
        if isinstance(event, kind):
            return event
    raise SystemExit(f"the worker ended without a {kind.__name__}")


def default_server() -> str:
    out = subprocess.run([sys.executable, str(ROOT / "packaging" / "build_rpc_server"), "--print"],
                         capture_output=True, text=True)
    return out.stdout.strip()


def default_target() -> str:
    from app.library.demo_install import demo_model_paths

    return str(demo_model_paths()[0])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} ({min(values):.1f}–{max(values):.1f})"


class Netem:
    """N ms of delay on the loopback while the block runs; the qdisc is removed on the way out."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __enter__(self) -> Netem:
        if shutil.which("tc") is None:
            raise SystemExit("--netem-ms needs tc (iproute2)")
        subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{self.ms}ms"], check=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="GGUF model (default: the first demo model)")
    parser.add_argument("--server", default=None, help="rpc-server binary (default: packaging/build_rpc_server's)")
    parser.add_argument("--prompts", default=str(ROOT / "resources" / "prompts" / "edit.jsonl"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--k-max", type=int, default=16, help="largest draft depth (the load times each width)")
    parser.add_argument("--netem-ms", type=float, default=0.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    target = args.target or default_target()
    server = Path(args.server or default_server())
    if not server.is_file():
        raise SystemExit(f"no rpc-server at {server}: run python3 packaging/build_rpc_server")
    prompts = read_prompts(Path(args.prompts))
    sampling = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens).validate()
    logs = Path(tempfile.mkdtemp(prefix="specdeck-rpc-bench-"))
    servers: list[RpcServer] = [start_server(server, logs) for _ in range(2)]
    endpoints = tuple(s.endpoint for s in servers)
    base = LoadSettings(target_path=target, n_ctx=4096, n_threads=1,
                        draft=DraftSettings(ngram=args.ngram, k_max=args.k_max))
    conditions: dict[str, LoadSettings] = {"local": base, "rpc": replace(base, rpc_servers=endpoints)}
    if args.netem_ms:
        conditions[f"rpc+{args.netem_ms:g}ms"] = conditions["rpc"]
    rates: dict[tuple[str, str], list[float]] = {(c, m): [] for c in conditions for m in ("plain", "spec")}
    network_ms: dict[str, list[float]] = {c: [] for c in conditions}
    reference: dict[int, tuple[int, ...]] = {}  # the local plain answer per prompt
    identical: dict[str, bool] = dict.fromkeys(conditions, True)
    client = EngineClient(watchdog_seconds=WATCHDOG_SECONDS)
    try:
        names = list(conditions)
        for r in range(args.repeat):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                delay = Netem(args.netem_ms) if name.startswith("rpc+") else None
                if delay is not None:
                    delay.__enter__()
                try:
                    client.load(conditions[name])
                    loaded = await_event(client, Loaded)
                    assert isinstance(loaded, Loaded)
                    network_ms[name].append(loaded.network_seconds * 1e3)
                    for index, messages in enumerate(prompts):
                        for mode in (("plain", "spec") if (index + r) % 2 == 0 else ("spec", "plain")):
                            client.bench_run(messages, sampling, mode == "plain")
                            event = await_event(client, BenchResult)
                            assert isinstance(event, BenchResult)
                            rates[(name, mode)].append(RunResult.of(event).decode_tps)
                            print(f"repeat {r + 1} {name} {mode}: {rates[(name, mode)][-1]:.1f} tok/s",
                                  file=sys.stderr, flush=True)
                            if name == "local" and mode == "plain":
                                reference.setdefault(index, event.token_ids)
                            elif index in reference and event.token_ids != reference[index]:
                                identical[name] = False
                finally:
                    if delay is not None:
                        delay.__exit__()
            print(f"repeat {r + 1} of {args.repeat} done", file=sys.stderr, flush=True)
    finally:
        client.close()
        for s in servers:
            s.stop()
    print(f"{Path(target).name}, {len(prompts)} prompts × {args.repeat} repeats, {args.max_tokens} tokens, "
          f"suffix drafter {args.ngram}, one engine thread, rpc-server --threads 1 ×2 on loopback")
    print(f"{'condition':<12} {'plain tok/s (min–max)':>24} {'spec tok/s (min–max)':>24} {'round trips/pass':>17} "
          f"{'same tokens':>11}")
    report: dict[str, Any] = {"target": target, "prompts": args.prompts, "repeat": args.repeat,
                              "max_tokens": args.max_tokens, "ngram": args.ngram, "conditions": {}}
    for name in conditions:
        plain, spec = rates[(name, "plain")], rates[(name, "spec")]
        net = statistics.median(network_ms[name]) if network_ms[name] else 0.0
        print(f"{name:<12} {spread(plain):>24} {spread(spec):>24} {net:>14.3f} ms {identical[name]!s:>11}")
        report["conditions"][name] = {"plain_tok_s": plain, "spec_tok_s": spec, "network_ms_per_pass": network_ms[name],
                                      "identical_to_local_plain": identical[name]}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
