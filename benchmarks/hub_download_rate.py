"""Download rate of `specdeck pull` against `curl -L -o` for the same file from the Hub look-alike on loopback
(tests/hub_lookalike.py, unthrottled): one file, the runs alternating, each a fresh download into an empty folder.

`pull (CLI)` is `python -m app pull REPO` timed from start to exit: interpreter start, listing, resolve, the
transfer with its sha256 and fsync, the rename. `pull (transfer)` is app.hub.transfer.pull alone, timed in a
child (the server keeps this process's GIL to itself). curl follows the same 302 and writes the same bytes.

    .venv/bin/python benchmarks/hub_download_rate.py [--size-mib 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.hub_lookalike import HubLookalike  # noqa: E402

REPO = "bench/Rate-GGUF"
NAME = "Rate-Q8_0.gguf"
MB = 1e6

TRANSFER_ONLY = """
import sys, time
from app.hub.client import list_files
from app.hub.files import group_files
from app.hub.transfer import choose, pull
group = choose(group_files(list_files(sys.argv[1])), file=sys.argv[2], quant=None, repo=sys.argv[1])
t = time.perf_counter()
done = pull(sys.argv[1], group)
print(time.perf_counter() - t)
assert done.verified
"""


def payload(size: int) -> bytes:
    # Not all zeros: nothing on the way may compress or skip it.
    block = os.urandom(1 << 20)
    return (block * (size // len(block) + 1))[:size]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return seconds, r.stdout


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the downloads go (default: a temp folder)")
    args = parser.parse_args()
    curl = shutil.which("curl")
    if curl is None:
        raise SystemExit("curl is not installed")
    size = args.size_mib << 20
    data = payload(size)
    want = hashlib.sha256(data).hexdigest()
    hub = HubLookalike()
    hub.add_file(REPO, NAME, data)
    del data
    scratch = Path(tempfile.mkdtemp(prefix="hub-rate-", dir=args.dir))
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(scratch / "hf"), SPECDECK_HOME=str(scratch / "home"),
               SPECDECK_MODELS_DIR=str(scratch / "models"), PYTHONPATH=str(ROOT))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(name, None)
    url = f"{hub.url}/{REPO}/resolve/main/{NAME}"
    pulled = scratch / "models" / "bench" / "Rate-GGUF" / NAME
    curled = scratch / "curl" / NAME
    rates: dict[str, list[float]] = {"pull (CLI)": [], "pull (transfer)": [], "curl": []}
    try:
        print(f"{args.size_mib} MiB from {url} into {scratch}, {args.repeats} repeats, alternating")
        for i in range(args.repeats):
            shutil.rmtree(scratch / "models", ignore_errors=True)
            s, _ = timed([sys.executable, "-m", "app", "pull", REPO, "--file", NAME], env)
            assert sha(pulled) == want, "pull wrote the wrong bytes"
            rates["pull (CLI)"].append(size / s / MB)

            shutil.rmtree(scratch / "models", ignore_errors=True)
            _, out = timed([sys.executable, "-c", TRANSFER_ONLY, REPO, NAME], env)
            rates["pull (transfer)"].append(size / float(out.strip().splitlines()[-1]) / MB)

            shutil.rmtree(scratch / "curl", ignore_errors=True)
            curled.parent.mkdir(parents=True)
            s, _ = timed([curl, "-sS", "-f", "-L", "-o", str(curled), url], env)
            assert curled.stat().st_size == size, "curl wrote the wrong size"
            rates["curl"].append(size / s / MB)
            print(f"  run {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f} MB/s" for k, v in rates.items()))
    finally:
        hub.close()
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"{k:16} median {med[k]:7.0f} MB/s  (min {min(v):.0f}, max {max(v):.0f})")
    print(f"ratio pull (CLI) / curl: {med['pull (CLI)'] / med['curl']:.2f}; "
          f"pull (transfer) / curl: {med['pull (transfer)'] / med['curl']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
