#!/usr/bin/env python3
"""What the GGUF header reader costs on malformed and hostile files and on the demo models: the time to its
refusal (or description) and the memory it takes, each case read in fresh processes, for one or more trees.

    .venv/bin/python benchmarks/gguf_guard.py [--tree DIR ...] [--runs 5] [--repeats 20] [--reference]

Cases, built with the tests' own builders: every file of tests/app/test_gguf_reader.py's MALFORMED; the
hostile files the tests write (an HTML architecture and name as in tests/ui/test_ui_safety.py, a name of
terminal escapes as in tests/app/test_terminal_chat.py, a template that reaches for Python's classes as in
tests/app/test_serve_faults.py); a FIFO and a split model whose second part is a FIFO (test_bad_input.py);
and, when installed, the two demo models (read_gguf_info and read_token_texts).

Each tree (default: this one) is put first on PYTHONPATH of a fresh interpreter per case and run, the trees
taking turns so they share the machine's load. Per case it prints the outcome (the error's class), the
median over the runs of the first read's time and of the median of ``--repeats`` further reads, their spread
(min-max over the runs), the tracemalloc peak of one read, and how much the read grew the process's peak RSS
(VmHWM); and per tree the reader's import time and the peak RSS after it. Compare two trees:
``--tree /tmp/before --tree .``.

``--reference`` also times gguf.GGUFReader itself on the demo models and on a 64-byte file whose one array
declares 2^40 one-byte elements (``--reference-timeout`` and 3 GiB at most): why the bounded walk reads the
header, and gguf gives the types.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# One case in a fresh interpreter: argv = path, repeats, reader ("info" or "tokens"); prints one JSON line.
CHILD = r"""
import json, sys, time, tracemalloc
t0 = time.perf_counter()
import app.library.gguf_reader as gguf_reader
from app.library.gguf_format import GGUFError
import_s = time.perf_counter() - t0
path, repeats, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
read = gguf_reader.read_gguf_info if which == "info" else gguf_reader.read_token_texts

def peak_rss_kb():  # VmHWM: ru_maxrss would keep the parent's peak across fork and exec
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])

def once():
    try:
        read(path)
        return "ok", ""
    except GGUFError as exc:
        return type(exc).__name__, str(exc)

rss0 = peak_rss_kb()
t = time.perf_counter()
outcome, message = once()
first_s = time.perf_counter() - t
rss_kb = peak_rss_kb() - rss0
tracemalloc.start()
once()
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
times = []
for _ in range(repeats):
    t = time.perf_counter()
    once()
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"outcome": outcome, "message": message, "import_s": import_s, "first_s": first_s,
                  "warm_s": times[len(times) // 2] if times else first_s, "peak": peak, "rss_kb": rss_kb,
                  "rss0_kb": rss0, "module": gguf_reader.__file__}))
"""

REFERENCE = r"""
import resource, sys, time
import gguf
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # it appends to lists for every declared element
t = time.perf_counter()
try:
    gguf.GGUFReader(sys.argv[1])
    outcome = "read"
except Exception as exc:
    outcome = type(exc).__name__
print(f"{time.perf_counter() - t:.3f} s ({outcome})")
"""


def build_cases(folder: Path) -> dict[str, tuple[Path, str]]:
    """case -> (file, reader): the tests' malformed and hostile files, written into ``folder``."""
    import numpy as np
    from gguf import GGUFWriter

    from tests.app.test_gguf_reader import MALFORMED, write
    from tests.app.test_terminal_chat import HOSTILE_NAME
    from tests.gguf_fixtures import save, write_tiny_model

    cases: dict[str, tuple[Path, str]] = {}
    for i, (name, (make, _error, _says)) in enumerate(sorted(MALFORMED.items())):
        cases[f"malformed: {name}"] = (write(folder / f"m{i:02d}" / "bad.gguf", make()), "info")

    def html_arch(path: Path) -> Path:  # tests/ui/test_ui_safety.py's _hostile_gguf
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = GGUFWriter(path, '<img src="file:///usr/share/pixmaps/debian-logo.png"><h1>✓ Verified</h1>')
        writer.add_name("<b>bold name</b>")
        writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
        save(writer)
        return path

    hostile: dict[str, Callable[[Path], Path]] = {
        "hostile: HTML architecture and name": html_arch,
        "hostile: terminal escapes in the name": lambda p: write_tiny_model(p, name=HOSTILE_NAME),
        "hostile: template reaching for classes": lambda p: write_tiny_model(
            p, chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    }
    for i, (name, make) in enumerate(hostile.items()):
        cases[name] = (make(folder / f"h{i}" / "hostile.gguf"), "info")

    fifo = folder / "fifo" / "pipe.gguf"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    cases["hostile: a FIFO"] = (fifo, "info")
    split = folder / "split"
    split.mkdir()
    os.mkfifo(split / "y-00002-of-00002.gguf")
    first = split / "y-00001-of-00002.gguf"
    writer = GGUFWriter(first, "llama")
    writer.add_uint16("split.no", 0)
    writer.add_uint16("split.count", 2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    save(writer)
    cases["hostile: split model, second part a FIFO"] = (first, "info")
    return cases


def demo_cases(demo_dir: Path) -> dict[str, tuple[Path, str]]:
    cases: dict[str, tuple[Path, str]] = {}
    for path in sorted(demo_dir.glob("*.gguf")):
        cases[f"demo: {path.name}"] = (path, "info")
        cases[f"demo tokens: {path.name}"] = (path, "tokens")
    return cases


def run_child(tree: Path, path: Path, repeats: int, which: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # and the working folder: `python -c` puts it first
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(repeats), which], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {path}: the reader process failed:\n{proc.stderr}")
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def spread(values: list[float], scale: float, unit: str) -> str:
    return (f"{statistics.median(values) * scale:8.2f} {unit} "
            f"[{min(values) * scale:.2f}-{max(values) * scale:.2f}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", type=Path, help="a source tree to time (repeatable)")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per case and tree")
    ap.add_argument("--repeats", type=int, default=20, help="further reads per process (warm time)")
    ap.add_argument("--demo-dir", type=Path, default=Path.home() / ".local/share/SpecDeck/models")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--reference", action="store_true", help="also time gguf.GGUFReader itself")
    ap.add_argument("--reference-timeout", type=float, default=120.0, help="seconds per GGUFReader run")
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [REPO])]

    with tempfile.TemporaryDirectory(prefix="gguf-guard-") as tmp:
        cases = {**build_cases(Path(tmp)), **demo_cases(args.demo_dir)}
        cases = {k: v for k, v in cases.items() if args.only in k}
        results: dict[tuple[Path, str], list[dict[str, object]]] = {}
        for _ in range(args.runs):
            for case, (path, which) in cases.items():
                for tree in trees:  # the trees take turns, so they share the machine's load
                    results.setdefault((tree, case), []).append(run_child(tree, path, args.repeats, which))

        print(f"python {sys.version.split()[0]}, {args.runs} fresh processes per case and tree, "
              f"{args.repeats} warm reads each; median [min-max over the processes]")
        for tree in trees if cases else []:
            runs = results[(tree, next(iter(cases)))]
            print(f"\n== tree {tree} (reader {runs[0]['module']})")
            imports = [float(r["import_s"]) for rs in (results[(tree, c)] for c in cases) for r in rs]
            print(f"import of app.library.gguf_reader: {spread(imports, 1e3, 'ms')}")
            rss0 = [float(r["rss0_kb"]) for rs in (results[(tree, c)] for c in cases) for r in rs]
            print(f"peak RSS after that import:        {spread(rss0, 1 / 1024, 'MiB')}")
            print(f"{'case':58} {'outcome':24} {'first read':>26} {'warm read':>26} {'tracemalloc peak':>24} "
                  f"{'peak RSS growth':>22}")
            for case in cases:
                rs = results[(tree, case)]
                outcomes = {str(r["outcome"]) for r in rs}
                print(f"{case[:58]:58} {'/'.join(sorted(outcomes))[:24]:24} "
                      f"{spread([float(r['first_s']) for r in rs], 1e3, 'ms'):>26} "
                      f"{spread([float(r['warm_s']) for r in rs], 1e3, 'ms'):>26} "
                      f"{spread([float(r['peak']) for r in rs], 1 / 1024, 'KiB'):>24} "
                      f"{spread([float(r['rss_kb']) for r in rs], 1 / 1024, 'MiB'):>22}")
        if len(trees) > 1:
            print("\n== messages that differ between the trees")
            same = True
            for case in cases:
                messages = {str(results[(t, case)][0]["message"]).replace(str(t), "TREE") for t in trees}
                if len(messages) > 1:
                    same = False
                    print(f"{case}:\n  " + "\n  ".join(sorted(messages)))
            if same:
                print("none: every case ends with the same sentence in every tree")

        if args.reference:
            limit = f"{args.reference_timeout:.0f} s and 3 GiB at most"
            print(f"\n== gguf.GGUFReader itself (a fresh process each, {limit})")
            huge = Path(tmp) / "declares-2^40-bytes.gguf"
            from tests.app.test_gguf_reader import ARRAY, U8, build, gstr

            huge.write_bytes(build([gstr("big") + struct.pack("<IIQ", ARRAY, U8, 1 << 40)], tensors=[]))
            targets = [huge, *sorted(args.demo_dir.glob("*.gguf"))]
            for path in targets:
                try:
                    proc = subprocess.run([sys.executable, "-c", REFERENCE, str(path)], capture_output=True,
                                          text=True, timeout=args.reference_timeout, check=False)
                    said = proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]
                except subprocess.TimeoutExpired:
                    said = f"no answer within {args.reference_timeout:.0f} s (killed)"
                print(f"{path.name} ({path.stat().st_size:,} bytes): {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
