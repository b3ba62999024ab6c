"""The probes' own entry point, run as a child process by ``app.ceiling.child.run_probe``:

    python -m app.ceiling.probe cpu --threads N --bytes B   the CPU's bandwidth and peak (one JSON line)
    python -m app.ceiling.probe backend [--rpc H:P,...]     llama.cpp's build, backend and devices

Inside the frozen app the executable takes ``--ceiling-probe`` instead of ``-m app.ceiling.probe``
(packaging/entry.py). Each prints one JSON object on stdout and exits 0. (The decode check runs in the
engine worker, like every other decode: ``app.measure.decode_check``.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="app.ceiling.probe", description="SpecDeck's hardware probes")
    sub = parser.add_subparsers(dest="probe", required=True)
    cpu = sub.add_parser("cpu", help="measure the CPU's memory bandwidth and peak FLOP/s")
    cpu.add_argument("--threads", type=int, default=1)
    cpu.add_argument("--bytes", type=int, default=128 << 20)
    backend = sub.add_parser("backend", help="describe llama.cpp's build, backend and devices")
    backend.add_argument("--rpc", default="", help="RPC servers to register first (their devices are listed too)")
    args = parser.parse_args(argv)
    answer: dict[str, Any]
    if args.probe == "cpu":
        from app.ceiling.cpu import measure_cpu_rates

        answer = measure_cpu_rates(args.threads, args.bytes)
    else:
        from app.ceiling.backend import probe_backend
        from app.ceiling.rpc import connect_servers
        from app.errors import AppError

        servers = [s for s in args.rpc.split(",") if s]
        try:
            connect_servers(servers)  # probed first: ggml aborts on a server it cannot use
        except AppError as exc:  # no RPC backend in this build, a server gone since: the sentence is the answer
            answer = {"available": False, "error": str(exc)}
        else:
            answer = probe_backend(servers if servers else None).to_dict()
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
