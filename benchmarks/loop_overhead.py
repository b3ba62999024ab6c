"""The decode loop's own cost: the time each pass spends outside ``llama_decode``, SpecDeck's loop against bare
llama_decode loops on the same context, at k = 0 and at a fixed depth k (8 by default), in one process,
alternating, with repeats.

    .venv/bin/python benchmarks/loop_overhead.py [--target MODEL.gguf] [--tokens 192] [--k 8] [--repeat 5]

Per repeat, each on a cleared KV cache after the same prompt:
- **bare w1**: one-token ``llama_decode`` calls straight through llama-cpp-python (one batch built once, logits
  read as a NumPy view, argmax): llama.cpp's own pass with the least Python around it;
- **Context.decode w1**: the same through the engine's context wrapper (``Context.decode``);
- **SpecDeck k=0**: the session's plain decoder answering greedily (sampling, stop checks, events);
- **bare wN** (N = k + 1): passes that decode N tokens with logits for every row and take each row's argmax,
  keeping them all (as a pass whose drafts were all accepted);
- **SpecDeck k=N-1**: the session with the target as its own drafter at fixed depth k (``p_min`` 1e-9, so every
  pass drafts k tokens, the confidence still checked, and, greedy, all are accepted).

``llama_cpp.llama_decode`` is wrapped to time each call, so a pass splits into the time inside llama.cpp and the
time outside it: the loop's own cost, Python and all, between one pass's start and the next's
(``PassStats.t_start`` for the session). The outside time hardly moves when another program slows llama.cpp
down, so it is compared directly: SpecDeck's outside time per pass less the bare loop's of the same kind of pass,
as a share of SpecDeck's whole pass (drafting included at k). Each figure: median (min–max) over the repeats.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.session import EngineSession  # noqa: E402
from app.events import PassStats  # noqa: E402
from app.library.demo_install import installed_demo_models  # noqa: E402
from app.params import DraftSettings, LoadSettings, SamplingSettings  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
CALLS: list[tuple[float, float]] = []  # (start, seconds) of every llama_decode call
_llama_decode = lc.llama_decode


def _timed_llama_decode(ctx: Any, batch: Any) -> int:
    start = time.perf_counter()
    rc = _llama_decode(ctx, batch)
    CALLS.append((start, time.perf_counter() - start))
    return int(rc)


lc.llama_decode = _timed_llama_decode  # the engine looks it up at each call (lc.llama_decode)


def spread(values: list[float], scale: float = 1.0, unit: str = "") -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.3f}{unit} ({min(v):.3f}–{max(v):.3f})"


def split(starts: list[float]) -> tuple[float, float]:
    """(seconds per pass, seconds outside llama_decode per pass) from the passes' start times."""
    first, last = starts[0], starts[-1]
    inside = sum(seconds for start, seconds in CALLS if first <= start < last)
    passes = len(starts) - 1
    return (last - first) / passes, (last - first - inside) / passes


def bare_passes(session: EngineSession, prompt: list[int], width: int, n_passes: int) -> tuple[float, float]:
    ctx = session.ctx
    session.decoder.reset_cache()
    first = int(np.argmax(ctx.prefill(prompt)[-1]))
    raw, n_vocab, pos = ctx.native.get(), ctx.n_vocab, len(prompt)
    batch = lc.llama_batch_init(width, 0, 1)
    starts = []
    try:
        for i in range(width):
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = width
        token = first
        for _ in range(n_passes):
            starts.append(time.perf_counter())
            for i in range(width):
                batch.token[i] = token
                batch.pos[i] = pos + i
            if lc.llama_decode(raw, batch) != 0:
                raise SystemExit("llama_decode failed in the bare loop")
            rows = np.ctypeslib.as_array(lc.llama_get_logits(raw), shape=(width, n_vocab))
            token = int(rows.argmax(axis=1)[-1])
            pos += width
        lc.llama_synchronize(raw)
    finally:
        lc.llama_batch_free(batch)
        session.decoder.reset_cache()
    return split(starts)


def wrapper_passes(session: EngineSession, prompt: list[int], n_tokens: int) -> tuple[float, float]:
    ctx = session.ctx
    session.decoder.reset_cache()
    starts = []
    try:
        token = int(np.argmax(ctx.prefill(prompt)[-1]))
        for _ in range(n_tokens):
            starts.append(time.perf_counter())
            token = int(np.argmax(ctx.decode([token])[-1]))
        ctx.synchronize()
    finally:
        session.decoder.reset_cache()
    return split(starts)


def specdeck_passes(session: EngineSession, n_tokens: int, *, plain: bool, width: int) -> tuple[float, float]:
    session.decoder.reset_cache()
    sampling = SamplingSettings(temperature=0.0, max_tokens=n_tokens).validate()
    decoder = session.plain_decoder if plain else session.decoder
    passes = [e for e in session.generate(0, PROMPT, sampling, decoder=decoder) if isinstance(e, PassStats)]
    session.decoder.reset_cache()
    # The longest run of consecutive passes of this width (the first pass after the prompt may differ).
    runs = [list(g) for w, g in itertools.groupby(passes, key=lambda p: p.verify_width) if w == width]
    if not runs or len(max(runs, key=len)) < 3:
        raise SystemExit(f"too few passes of width {width} (widths seen: {sorted({p.verify_width for p in passes})})")
    return split([p.t_start for p in max(runs, key=len)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="default: the SmolLM2 demo model")
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    target = args.target or next((str(p) for p in installed_demo_models() if "SmolLM2" in p.name), None)
    if target is None:
        raise SystemExit("no target: pass --target or install the demo models (specdeck demo-models)")
    # A confidence cut no draft falls below: every pass drafts k tokens, and the cut is checked as by default.
    draft = DraftSettings(drafter_path=target, adaptive=False, k=args.k, p_min=1e-9)
    session = EngineSession(LoadSettings(target_path=target, n_ctx=2048, draft=draft).validate())
    width = args.k + 1
    names = ("bare w1", "Context.decode w1", "SpecDeck k=0", f"bare w{width}", f"SpecDeck k={args.k}")
    passes: dict[str, list[float]] = {name: [] for name in names}
    outside: dict[str, list[float]] = {name: [] for name in names}
    prompt, _ = session.prompt_tokens(PROMPT)
    measure: dict[str, Callable[[], tuple[float, float]]] = {
        "bare w1": lambda: bare_passes(session, prompt, 1, args.tokens),
        "Context.decode w1": lambda: wrapper_passes(session, prompt, args.tokens),
        "SpecDeck k=0": lambda: specdeck_passes(session, args.tokens, plain=True, width=1),
        f"bare w{width}": lambda: bare_passes(session, prompt, width, max(args.tokens // width, 4)),
        f"SpecDeck k={args.k}": lambda: specdeck_passes(session, args.tokens, plain=False, width=width),
    }
    try:
        for r in range(args.repeat):
            for name in names if r % 2 == 0 else reversed(names):
                CALLS.clear()
                pass_seconds, outside_seconds = measure[name]()
                passes[name].append(pass_seconds)
                outside[name].append(outside_seconds)
            print(f"repeat {r + 1} done", flush=True)
    finally:
        session.close()
    print(f"target {Path(target).name}, {args.tokens} tokens a run, {args.repeat} repeats; ms per pass, "
          "median (min–max)")
    print(f"  {'':<20} {'whole pass':<26} outside llama_decode")
    for name in names:
        print(f"  {name:<20} {spread(passes[name], 1e3):<26} {spread(outside[name], 1e3)}")
    for spec, bare in (("Context.decode w1", "bare w1"), ("SpecDeck k=0", "bare w1"),
                       (f"SpecDeck k={args.k}", f"bare w{width}")):
        share = [(o - b) / p for o, b, p in zip(outside[spec], outside[bare], passes[spec], strict=True)]
        print(f"  {spec} over {bare}: {spread(share, 100, ' %')} of a pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
