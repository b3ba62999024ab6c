"""What the model's own MTP heads cost against a target pass: a synthetic Qwen3.5-architecture target with one
MTP block, its verify pass timed by width (with the MTP context reading each batch, as in speculation, and
without), and one MTP draft step. Prints one JSON object.

    python benchmarks/mtp_cost.py --folder /tmp/mtp                       # small, on this machine's CPU
    python benchmarks/mtp_cost.py --folder /tmp/mtp --n-embd 2048 --n-layer 24 --gpu-layers -1   # on a GPU

The weights are random (f32): only the costs mean anything, not the drafts. c is a draft step over a one-token
pass with the MTP context following; the issue's GPU check reads ``verify_ms`` and ``c`` from the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (1, 2, 3, 5, 9, 17)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="where the synthetic target is written")
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-layer", type=int, default=8, help="trunk layers (the MTP block comes on top)")
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache while timing")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from app.engine.llama import Context, ContextParams, Model, init_backend
    from app.engine.mtp import MTPContext, MTPDrafter
    from tests.gguf_fixtures import write_tiny_model

    n_head = max(4, args.n_embd // 128)
    path = args.folder / f"qwen35-mtp-{args.n_embd}x{args.n_layer}.gguf"
    t0 = time.perf_counter()
    if not path.exists():
        write_tiny_model(path, arch="qwen35", n_layer=args.n_layer, n_embd=args.n_embd, n_head=n_head,
                         n_head_kv=max(1, n_head // 4), n_ff=args.n_embd * 3, mtp_layers=1, name=path.stem)
    write_seconds = time.perf_counter() - t0

    log: list[str] = []
    init_backend(log.append)
    model = Model(path, n_gpu_layers=args.gpu_layers, load_mtp=True)
    params = ContextParams(n_ctx=args.context + 64, n_batch=64, n_threads=args.threads)
    ctx = Context(model, params)
    drafter = MTPDrafter(ctx, MTPContext(model, ctx, params), p_min=0.0)
    prefix = [model.bos if model.bos >= 0 else 0] * args.context

    def pass_ms(width: int, follow: bool) -> float:
        drafter.follow(follow)
        times = []
        for _ in range(args.repeat):
            n_keep = ctx.n_past
            ctx.prepare_rollback(width, width)
            start = time.perf_counter()
            ctx.decode(prefix[:width], all_logits=True)
            ctx.synchronize()
            times.append(time.perf_counter() - start)
            ctx.truncate(n_keep)
        return 1e3 * statistics.median(times)

    ctx.prefill(prefix)  # read through both caches: the MTP context follows from the start
    pass_ms(1, True)  # warm-up
    verify = {w: pass_ms(w, True) for w in WIDTHS}
    plain = {w: pass_ms(w, False) for w in WIDTHS}
    drafter.follow(True)  # the plain passes were all taken back: both caches hold the prefix still
    mtp = drafter.ctx
    row = drafter._h[ctx.n_past - 1]
    steps = []
    for _ in range(args.repeat):
        mtp.truncate(ctx.n_past)
        start = time.perf_counter()
        mtp.step(prefix[0], row)
        mtp.synchronize()
        steps.append(time.perf_counter() - start)
    step_ms = 1e3 * statistics.median(steps)
    kv_lines = [line.strip() for line in "".join(log).splitlines() if "buffer size" in line]
    print(json.dumps({
        "model": path.name, "write_seconds": round(write_seconds, 1), "gpu_layers": args.gpu_layers,
        "verify_ms": {str(w): round(t, 3) for w, t in verify.items()},
        "plain_pass_ms": {str(w): round(t, 3) for w, t in plain.items()},
        "mtp_step_ms": round(step_ms, 3),
        "c": round(step_ms / verify[1], 4),
        "c_vs_plain_pass": round(step_ms / plain[1], 4),
        "llama_cpp_buffers": kv_lines,
    }, indent=2))
    drafter.detach()
    drafter.ctx.close()
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
