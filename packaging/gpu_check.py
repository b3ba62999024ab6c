"""One-shot GPU check: synthetic llama models, plain decode against the bandwidth ceiling, verify cost per
width, greedy exactness of speculative decoding; one JSON report.

Run by `packaging/gpu_check` after it has built llama.cpp for the GPU; on its own it uses whatever
llama-cpp-python is importable (the CPU build in .venv, for a dry run):

    python packaging/gpu_check.py --models tiny,small --out /tmp/gpu-check

Models are llama-architecture GGUFs with random Q8_0 weights, written tensor by tensor (an 8 GB model never
sits in memory), with the shapes of real models of that size so the bytes streamed per token are realistic.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_vocab: int

    @property
    def n_params(self) -> int:
        head_dim = self.n_embd // self.n_head
        attn = self.n_embd * self.n_embd * 2 + 2 * self.n_embd * self.n_head_kv * head_dim
        return 2 * self.n_vocab * self.n_embd + self.n_layer * (attn + 3 * self.n_embd * self.n_ff)


# Shapes of real models: TinyLlama-1.1B (1.2 GB in Q8_0) and Llama-2-7B with grouped-query attention
# (8.0 GB); tiny and small are for a dry run on a CPU.
SHAPES = {
    "tiny": Shape(n_embd=256, n_ff=768, n_layer=4, n_head=4, n_head_kv=2, n_vocab=1024),
    "small": Shape(n_embd=768, n_ff=2048, n_layer=8, n_head=12, n_head_kv=4, n_vocab=8192),
    "1gb": Shape(n_embd=2048, n_ff=5632, n_layer=22, n_head=32, n_head_kv=4, n_vocab=32000),
    "8gb": Shape(n_embd=4096, n_ff=14336, n_layer=32, n_head=32, n_head_kv=8, n_vocab=32000),
}

Q8_0_BLOCK = 32
Q8_0_BYTES = 34  # f16 scale + 32 int8
POOL_BLOCKS = 1 << 20  # 32 MiB of random quants, reused at random offsets
SPECIALS = ("<|bos|>", "<|eos|>")
MERGE = "Ġ t"  # llama.cpp refuses a BPE vocabulary without merges


def _vocab(n_vocab: int) -> tuple[list[str], list[int]]:
    """Byte-level BPE tokens: two control tokens, the 256 GPT-2 byte tokens, one merge, then filler tokens."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    byte_tokens = [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]
    tokens = [*SPECIALS, *byte_tokens, MERGE.replace(" ", "")]
    tokens += [f"<f{i}>" for i in range(n_vocab - len(tokens))]
    types = [3] * len(SPECIALS) + [1] * (n_vocab - len(SPECIALS))
    return tokens, types


def _q8_0(rng: np.random.Generator, pool: np.ndarray, rows: int, cols: int, std: float) -> np.ndarray:
    """A (rows, cols) Q8_0 tensor as GGUF bytes, (rows, cols / 32 * 34) uint8, with weights of about ``std``."""
    n_blocks = rows * cols // Q8_0_BLOCK
    start = int(rng.integers(POOL_BLOCKS))
    out = np.empty((n_blocks, Q8_0_BYTES), dtype=np.uint8)
    idx = (np.arange(n_blocks, dtype=np.int64) + start) % POOL_BLOCKS
    out[:, 2:] = np.take(pool, idx, axis=0).view(np.uint8)
    # Uniform int8 in [-127, 127] has a standard deviation of about 73.6.
    out[:, :2] = np.frombuffer(np.float16(std / 73.6).tobytes(), dtype=np.uint8)
    return out.reshape(rows, cols // Q8_0_BLOCK * Q8_0_BYTES)


def write_model(path: Path, shape: Shape, seed: int = 0, *, sparse: bool = False) -> Path:
    """A llama GGUF with random Q8_0 weights, written one tensor at a time.

    ``sparse``: the quantized tensors are left as holes in the file instead (all-zero weights, no disk
    space, written in milliseconds): a model of any size for tests that only need its size.
    """
    import gguf

    rng = np.random.default_rng(seed)
    pool = rng.integers(-127, 128, size=(POOL_BLOCKS, Q8_0_BLOCK), dtype=np.int8)
    head_dim = shape.n_embd // shape.n_head
    kv_dim = shape.n_head_kv * head_dim
    e, f = shape.n_embd, shape.n_ff
    # (name, rows, cols, std) per quantized tensor; None rows: an F32 norm of length cols.
    plan: list[tuple[str, int | None, int, float]] = [("token_embd.weight", shape.n_vocab, e, 1.0)]
    for i in range(shape.n_layer):
        plan += [
            (f"blk.{i}.attn_norm.weight", None, e, 1.0),
            (f"blk.{i}.attn_q.weight", e, e, e ** -0.5),
            (f"blk.{i}.attn_k.weight", kv_dim, e, e ** -0.5),
            (f"blk.{i}.attn_v.weight", kv_dim, e, e ** -0.5),
            (f"blk.{i}.attn_output.weight", e, e, e ** -0.5),
            (f"blk.{i}.ffn_norm.weight", None, e, 1.0),
            (f"blk.{i}.ffn_gate.weight", f, e, e ** -0.5),
            (f"blk.{i}.ffn_up.weight", f, e, e ** -0.5),
            (f"blk.{i}.ffn_down.weight", e, f, f ** -0.5),
        ]
    # Logits with a standard deviation of about 4: peaked, so greedy ties are rare.
    plan += [("output_norm.weight", None, e, 1.0), ("output.weight", shape.n_vocab, e, 4.0 * e ** -0.5)]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_context_length(4096)
    w.add_embedding_length(e)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(f)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.n_vocab)
    tokens, types = _vocab(shape.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([MERGE])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    for name, rows, cols, _ in plan:
        if rows is None:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        else:
            nbytes = rows * cols // Q8_0_BLOCK * Q8_0_BYTES
            w.add_tensor_info(name, (rows, cols // Q8_0_BLOCK * Q8_0_BYTES), np.dtype(np.uint8), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, rows, cols, std in plan:
        if rows is None:
            w.write_tensor_data(np.full(cols, std, dtype=np.float32))
        elif sparse:
            # write_tensor_data's bookkeeping and padding, with a hole for the data.
            fout = w.fout[0]  # type: ignore[index]
            info = w.tensors[0].pop(next(iter(w.tensors[0])))
            w.write_padding(fout, fout.tell())
            fout.seek(info.nbytes, 1)
            w.write_padding(fout, info.nbytes)
            fout.truncate(fout.tell())
        else:
            w.write_tensor_data(_q8_0(rng, pool, rows, cols, std))
    w.close()
    return path


def _median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_decode(ctx: Any, prompt: list[int], n_tokens: int, repeats: int) -> dict[str, Any]:
    """Plain greedy decode tok/s: the bare llama_decode loop after a short prompt, ``repeats`` times."""
    rates = []
    for _ in range(repeats):
        ctx.clear()
        logits = ctx.prefill(prompt)
        first = int(np.argmax(logits[-1]))
        ctx.greedy_loop(first, 4)  # warm-up: first decodes after a prefill build their graphs
        done, seconds = ctx.greedy_loop(first, n_tokens)
        rates.append(done / seconds)
    return {"tokens": n_tokens, "context": len(prompt), "tokens_per_second": _median_spread(rates)}


def measure_verify(ctx: Any, prompt: list[int], widths: range, repeats: int) -> dict[str, Any]:
    """Seconds of one target pass of each width (all logits returned, as a verify pass needs)."""
    ctx.clear()
    ctx.prefill(prompt)
    n_keep = ctx.n_past
    probe = [prompt[i % len(prompt)] for i in range(max(widths))]
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats):
        for w in widths:
            t0 = time.perf_counter()
            ctx.decode(probe[:w], all_logits=True)
            ctx.synchronize()
            times[w].append(time.perf_counter() - t0)
            ctx.truncate(n_keep)
    one = statistics.median(times[1])
    return {
        "context": n_keep,
        "repeats": repeats,
        "ms": {str(w): round(statistics.median(t) * 1e3, 4) for w, t in times.items()},
        "ratio_to_width_1": {str(w): round(statistics.median(t) / one, 4) for w, t in times.items()},
    }


def check_exactness(model: Any, params: Any, prompt: list[int], n_tokens: int, k: int) -> dict[str, Any]:
    """Greedy speculative decoding (the model drafting for itself at depth k, so every verify pass is k + 1
    wide) against plain greedy decoding. Where they diverge, the divergence must be a near-tie: the top-2 gap
    in single-token logits within the batched-vs-single difference measured at that position."""
    from app.engine.adaptive import DepthController
    from app.engine.drafters import ModelDrafter
    from app.engine.llama import Context
    from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
    from app.events import Token
    from app.params import SamplingSettings

    greedy = SamplingSettings(temperature=0.0, max_tokens=n_tokens)
    target_ctx, draft_ctx = Context(model, params), Context(model, params)
    try:
        answers = []
        totals = RunTotals()
        for decoder in (
            SpeculativeDecoder(model, target_ctx),
            SpeculativeDecoder(model, target_ctx, drafter=ModelDrafter(model, draft_ctx, p_min=0.0),
                               controller=DepthController(k_max=k, fixed=k)),
        ):
            decoder.reset_cache()
            totals = RunTotals()
            tokens: list[int] = []
            for event in decoder.generate(prompt, greedy, totals=totals, stop=StopReason()):
                if isinstance(event, Token):
                    tokens += event.token_ids
            answers.append(tokens)
    finally:
        target_ctx.close()
        draft_ctx.close()
    plain, spec = answers
    n = min(len(plain), len(spec))
    agree = next((i for i in range(n) if plain[i] != spec[i]), n)
    result: dict[str, Any] = {
        "tokens": len(plain), "agree": agree, "k": k, "drafted": totals.drafted, "accepted": totals.accepted,
        "identical": plain == spec,
    }
    if agree < n:
        gap, noise = _near_tie(model, params, prompt + plain[:agree], plain[agree], spec[agree])
        result.update(gap=gap, batched_vs_single=noise, near_tie=0.0 <= gap <= noise + 1e-3)
    result["ok"] = bool(result["identical"] or result.get("near_tie")) and totals.drafted > 0
    return result


def _near_tie(model: Any, params: Any, prefix: list[int], plain_tok: int, spec_tok: int) -> tuple[float, float]:
    from app.engine.llama import Context

    single_ctx, batch_ctx = Context(model, params), Context(model, params)
    try:
        single_ctx.prefill(prefix[:-1])
        single = np.array(single_ctx.decode([prefix[-1]])[-1], dtype=np.float64)
        batch_ctx.prefill(prefix[:-2])
        batched = np.array(batch_ctx.decode(prefix[-2:], all_logits=True)[-1], dtype=np.float64)
    finally:
        single_ctx.close()
        batch_ctx.close()
    return float(single[plain_tok] - single[spec_tok]), float(np.abs(single - batched).max())


def ceiling_for(path: Path, context: int) -> dict[str, Any]:
    """SpecDeck's own plain-decode ceiling for this model on this machine (NVML bandwidth for an NVIDIA GPU)."""
    from app.ceiling.backend import probe_backend
    from app.ceiling.hardware import probe_hardware, roofline_devices
    from app.ceiling.roofline import ModelShape, estimate_pass
    from app.library.gguf_reader import read_gguf_info

    hw = probe_hardware(backend=probe_backend())
    devices = roofline_devices(hw)
    est = estimate_pass(ModelShape.from_gguf(read_gguf_info(path)), devices, context)
    return {
        "tokens_per_second": est.tokens_per_second,
        "bytes_per_pass": est.bytes,
        "binding": est.binding,
        "devices": [{"key": d.key, "name": d.name, "kind": d.kind, "bandwidth": d.bandwidth} for d in devices],
        "gpus": [asdict(g) for g in hw.gpus],
        "nvml_status": hw.nvml_status,
    }


def check_model(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    from app.engine.llama import Context, ContextParams, Model

    t0 = time.perf_counter()
    model = Model(path, n_gpu_layers=-1)
    load_s = time.perf_counter() - t0
    params = ContextParams(n_ctx=args.ctx, n_batch=512, n_threads=args.threads)
    rng = np.random.default_rng(1)
    prompt = [model.bos, *(int(t) for t in rng.integers(2, 258, size=args.prompt_tokens - 1))]
    ctx = Context(model, params)
    try:
        decode = measure_decode(ctx, prompt, args.decode_tokens, args.repeats)
        verify = measure_verify(ctx, prompt, range(1, args.max_width + 1), args.verify_repeats)
    finally:
        ctx.close()
    exact = check_exactness(model, params, prompt, args.exact_tokens, args.exact_k)
    ceiling = ceiling_for(path, decode["context"] + args.decode_tokens // 2)
    measured = decode["tokens_per_second"]["median"]
    model_bytes = model.size_bytes
    model.close()
    ratio8 = verify["ratio_to_width_1"].get("8")
    return {
        "file": path.name, "file_bytes": path.stat().st_size, "model_bytes": model_bytes, "load_seconds": load_s,
        "decode": decode, "ceiling": ceiling,
        "fraction_of_ceiling": measured / ceiling["tokens_per_second"] if ceiling["tokens_per_second"] else None,
        "verify": verify, "exactness": exact,
        "goals": {
            "decode_at_least_85_percent_of_ceiling": measured >= 0.85 * ceiling["tokens_per_second"],
            "verify_8_at_most_1.3x_width_1": ratio8 is not None and ratio8 <= 1.3,
        },
    }


def system_block() -> dict[str, Any]:
    import llama_cpp

    from app.ceiling.backend import probe_backend

    backend = probe_backend()
    return {
        "python": platform.python_version(), "machine": platform.machine(), "platform": platform.platform(),
        "llama_cpp_python": getattr(llama_cpp, "__version__", ""), "backend": backend.backend,
        "gpu_offload": backend.gpu_offload, "system_info": backend.system_info,
        "devices": [asdict(d) for d in backend.devices],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="1gb,8gb", help=f"comma-separated sizes: {', '.join(SHAPES)}")
    parser.add_argument("--out", type=Path, required=True, help="folder for the models and report.json")
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: physical cores)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-width", type=int, default=16)
    parser.add_argument("--verify-repeats", type=int, default=10)
    parser.add_argument("--exact-tokens", type=int, default=64)
    parser.add_argument("--exact-k", type=int, default=8)
    parser.add_argument("--require-gpu", action="store_true", help="fail unless llama.cpp offloads to a GPU")
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in SHAPES]
    if unknown:
        parser.error(f"unknown model size {unknown[0]!r}; choose from {', '.join(SHAPES)}")
    if args.prompt_tokens < 2 or args.max_width < 1 or args.max_width + args.prompt_tokens > args.ctx:
        parser.error("need --prompt-tokens >= 2 and --prompt-tokens + --max-width <= --ctx")

    from app.engine.llama import init_backend

    args.out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []
    init_backend(log_lines.append)
    t_start = time.perf_counter()
    report: dict[str, Any] = {"schema": 1, "system": system_block(), "args": {k: str(v) for k, v in vars(args).items()},
                              "models": {}}
    if args.require_gpu and not report["system"]["gpu_offload"]:
        print("gpu_check: this llama.cpp build cannot offload to a GPU", file=sys.stderr)
        return 2
    ok = True
    for name in names:
        path = args.out / f"synthetic-llama-{name}-q8_0.gguf"
        t0 = time.perf_counter()
        if not path.exists():
            write_model(path.with_suffix(".tmp"), SHAPES[name]).replace(path)
        write_s = time.perf_counter() - t0
        print(f"gpu_check: {path.name} ({path.stat().st_size / 1e9:.2f} GB) written in {write_s:.1f}s", flush=True)
        result = check_model(path, args)
        result["write_seconds"] = write_s
        report["models"][name] = result
        ok = ok and result["exactness"]["ok"]
        d, c, v = result["decode"]["tokens_per_second"], result["ceiling"], result["verify"]["ratio_to_width_1"]
        print(f"gpu_check: {name}: plain decode {d['median']:.1f} tok/s (min {d['min']:.1f}, max {d['max']:.1f}), "
              f"ceiling {c['tokens_per_second']:.1f} tok/s ({result['fraction_of_ceiling']:.0%}); verify cost "
              f"x width 1: " + ", ".join(f"{w}: {r:.2f}" for w, r in v.items())
              + f"; exactness {'ok' if result['exactness']['ok'] else 'FAILED'} "
              f"({result['exactness']['agree']}/{result['exactness']['tokens']} agree)", flush=True)
    report["seconds"] = time.perf_counter() - t_start
    report["llama_log_tail"] = "".join(log_lines)[-4000:]
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_check: report in {args.out / 'report.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
