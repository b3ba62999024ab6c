"""One-shot GPU check: synthetic models, plain decode against the bandwidth ceiling, verify cost per width,
greedy exactness of speculative decoding, the MTP heads' step cost; one JSON report.

Run by `packaging/gpu_check` after it has built llama.cpp for the GPU; on its own it uses whatever
llama-cpp-python is importable (the CPU build in .venv, for a dry run):

    python packaging/gpu_check.py --cpu --out /tmp/gpu-check     # tiny, small and mtp-tiny

Models are GGUFs with random Q8_0 weights, written tensor by tensor (an 8 GB model never sits in memory),
with the shapes of real models of that size so the bytes streamed per token are realistic: llama ones, and a
Qwen3.5 (Gated DeltaNet beside gated attention) with one MTP block.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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



@dataclass(frozen=True)
class MtpShape:
    """A Qwen3.5 trunk (Gated DeltaNet layers, every ``interval``-th one gated attention) and its MTP block."""

    n_embd: int
    n_ff: int
    n_layer: int  # the trunk; block_count adds the MTP block
    n_head: int
    n_head_kv: int
    head_dim: int
    k_heads: int  # Gated DeltaNet: key heads (ssm.group_count)
    v_heads: int  # value heads (ssm.time_step_rank)
    state: int  # their head size (ssm.state_size)
    n_vocab: int
    interval: int = 4


# mtp-2b: the layer count and width llama.cpp's qwen35 loader names 2B (24 x 2048), gated attention with
# 256-wide heads and Qwen3.5's vocabulary, so the MTP step (one block and the output layer) weighs what it
# does in the real model against the trunk; mtp-tiny is for a dry run on a CPU.
MTP_SHAPES = {
    "mtp-tiny": MtpShape(n_embd=256, n_ff=768, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, k_heads=2,
                         v_heads=4, state=32, n_vocab=1024),
    "mtp-2b": MtpShape(n_embd=2048, n_ff=6144, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, k_heads=16,
                       v_heads=16, state=128, n_vocab=248320),
}
GPU_MODELS = "1gb,8gb,mtp-2b"
CPU_MODELS = "tiny,small,mtp-tiny"  # the same steps at sizes a CPU runs in a few minutes

# What the check imports beyond the standard library, SpecDeck and llama_cpp, by where it comes from: the
# GPU machine's own Python (packaging/README.md, "GPU check"), or a wheel in the kit (packaging/gpu_kit packs
# these distributions; pydantic-core for each Python it names). Anything else fails the check.
MACHINE_MODULES = frozenset(("numpy", "yaml", "requests", "urllib3", "idna", "certifi", "charset_normalizer",
                             "tqdm", "pynvml", "psutil", "jinja2", "markupsafe", "typing_extensions"))
KIT_WHEELS = {"gguf": "gguf", "platformdirs": "platformdirs", "diskcache": "diskcache", "pydantic": "pydantic",
              "pydantic-core": "pydantic_core", "annotated-types": "annotated_types",
              "typing-inspection": "typing_inspection"}
KIT_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
TRAVEL_CAP = 64 << 20  # what reaches the GPU machine: the tree and the kit together

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


# One tensor to write: (name, rows, cols, std). rows None: an F32 vector of cols, every value std (norms,
# biases, decay rates); cols not a multiple of 32: F32 noise of that std; else Q8_0 weights of about std.
Plan = list[tuple[str, int | None, int, float]]


def _llama_plan(shape: Shape) -> Plan:
    head_dim = shape.n_embd // shape.n_head
    kv_dim = shape.n_head_kv * head_dim
    e, f = shape.n_embd, shape.n_ff
    plan: Plan = [("token_embd.weight", shape.n_vocab, e, 1.0)]
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
    return [*plan, *_output(e, shape.n_vocab)]


def _output(e: int, n_vocab: int) -> Plan:
    # Logits with a standard deviation of about 4: peaked, so greedy ties are rare.
    return [("output_norm.weight", None, e, 1.0), ("output.weight", n_vocab, e, 4.0 * e ** -0.5)]


def _qwen35_plan(shape: MtpShape) -> Plan:
    """The tensors src/models/qwen35.cpp loads: the trunk, then one MTP block (blk.{n_layer}.nextn.*)."""
    e, f, hd = shape.n_embd, shape.n_ff, shape.head_dim
    q_dim, kv_dim = shape.n_head * hd, shape.n_head_kv * hd
    key_dim, value_dim = shape.k_heads * shape.state, shape.v_heads * shape.state

    def attention(i: int) -> Plan:
        return [
            (f"blk.{i}.attn_q.weight", 2 * q_dim, e, e ** -0.5),  # the query and its output gate
            (f"blk.{i}.attn_k.weight", kv_dim, e, e ** -0.5),
            (f"blk.{i}.attn_v.weight", kv_dim, e, e ** -0.5),
            (f"blk.{i}.attn_output.weight", e, q_dim, q_dim ** -0.5),
            (f"blk.{i}.attn_q_norm.weight", None, hd, 1.0),
            (f"blk.{i}.attn_k_norm.weight", None, hd, 1.0),
        ]

    def ffn(i: int) -> Plan:
        return [
            (f"blk.{i}.ffn_gate.weight", f, e, e ** -0.5),
            (f"blk.{i}.ffn_up.weight", f, e, e ** -0.5),
            (f"blk.{i}.ffn_down.weight", e, f, f ** -0.5),
        ]

    plan: Plan = [("token_embd.weight", shape.n_vocab, e, 1.0)]
    for i in range(shape.n_layer):
        plan += [(f"blk.{i}.attn_norm.weight", None, e, 1.0), (f"blk.{i}.post_attention_norm.weight", None, e, 1.0)]
        if (i + 1) % shape.interval == 0:
            plan += attention(i)
        else:
            plan += [
                (f"blk.{i}.attn_qkv.weight", 2 * key_dim + value_dim, e, e ** -0.5),
                (f"blk.{i}.attn_gate.weight", value_dim, e, e ** -0.5),
                (f"blk.{i}.ssm_conv1d.weight", 2 * key_dim + value_dim, 4, 0.5),
                (f"blk.{i}.ssm_dt.bias", None, shape.v_heads, 0.0),
                (f"blk.{i}.ssm_a", None, shape.v_heads, -1.0),  # a decaying state, as in a trained model
                (f"blk.{i}.ssm_beta.weight", shape.v_heads, e, e ** -0.5),
                (f"blk.{i}.ssm_alpha.weight", shape.v_heads, e, e ** -0.5),
                (f"blk.{i}.ssm_norm.weight", None, shape.state, 1.0),
                (f"blk.{i}.ssm_out.weight", e, value_dim, value_dim ** -0.5),
            ]
        plan += ffn(i)
    m = shape.n_layer
    plan += [(f"blk.{m}.attn_norm.weight", None, e, 1.0), (f"blk.{m}.post_attention_norm.weight", None, e, 1.0)]
    plan += attention(m) + ffn(m) + [
        (f"blk.{m}.nextn.eh_proj.weight", e, 2 * e, (2 * e) ** -0.5),
        (f"blk.{m}.nextn.enorm.weight", None, e, 1.0),
        (f"blk.{m}.nextn.hnorm.weight", None, e, 1.0),
        (f"blk.{m}.nextn.shared_head_norm.weight", None, e, 1.0),
    ]
    return [*plan, *_output(e, shape.n_vocab)]


def write_model(path: Path, shape: Shape | MtpShape, seed: int = 0, *, sparse: bool = False) -> Path:
    """A GGUF with random Q8_0 weights, written one tensor at a time: llama for a ``Shape``, Qwen3.5 with an
    MTP block for an ``MtpShape``.

    ``sparse``: the quantized tensors are left as holes in the file instead (all-zero weights, no disk
    space, written in milliseconds): a model of any size for tests that only need its size.
    """
    import gguf

    rng = np.random.default_rng(seed)
    pool = rng.integers(-127, 128, size=(POOL_BLOCKS, Q8_0_BLOCK), dtype=np.int8)
    e = shape.n_embd
    if isinstance(shape, MtpShape):
        plan, arch = _qwen35_plan(shape), "qwen35"
    else:
        plan, arch = _llama_plan(shape), "llama"

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_context_length(4096)
    w.add_embedding_length(e)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.n_vocab)
    if isinstance(shape, MtpShape):
        w.add_block_count(shape.n_layer + 1)
        w.add_nextn_predict_layers(1)
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
        rope = shape.head_dim // 4  # Qwen3.5 rotates a quarter of each head: 64 of 256 in sections 11, 11, 10
        third = (rope // 2 + 2) // 3
        w.add_rope_dimension_count(rope)
        w.add_rope_dimension_sections([third, third, rope // 2 - 2 * third, 0])
        w.add_full_attention_interval(shape.interval)
        w.add_ssm_conv_kernel(4)
        w.add_ssm_inner_size(shape.v_heads * shape.state)
        w.add_ssm_state_size(shape.state)
        w.add_ssm_time_step_rank(shape.v_heads)
        w.add_ssm_group_count(shape.k_heads)
    else:
        w.add_block_count(shape.n_layer)
        w.add_rope_dimension_count(e // shape.n_head)
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
        elif cols % Q8_0_BLOCK:
            w.add_tensor_info(name, (rows, cols), np.dtype(np.float32), rows * cols * 4)
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
        elif cols % Q8_0_BLOCK:
            w.write_tensor_data((rng.standard_normal((rows, cols)) * std).astype(np.float32))
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


def check_exactness(model: Any, params: Any, prompt: list[int], n_tokens: int, k: int,
                    make_drafter: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Greedy speculative decoding at depth k (every verify pass k + 1 wide; by default the model drafting
    for itself) against plain greedy decoding. Where they diverge, the divergence must be a near-tie: the top-2
    gap in single-token logits within the batched-vs-single difference measured at that position.
    ``make_drafter(target_ctx)`` gives another drafter (the MTP heads, which follow the target's context)."""
    from app.engine.adaptive import DepthController
    from app.engine.drafters import ModelDrafter
    from app.engine.llama import Context
    from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
    from app.events import Token
    from app.params import SamplingSettings

    greedy = SamplingSettings(temperature=0.0, max_tokens=n_tokens)

    def run(decoder: Any, totals: Any) -> list[int]:
        decoder.reset_cache()
        tokens: list[int] = []
        for event in decoder.generate(prompt, greedy, totals=totals, stop=StopReason()):
            if isinstance(event, Token):
                tokens += event.token_ids
        return tokens

    target_ctx = Context(model, params)
    draft_ctx = None
    drafter: Any = None
    try:
        plain = run(SpeculativeDecoder(model, target_ctx), RunTotals())
        if make_drafter is None:
            draft_ctx = Context(model, params)
            drafter = ModelDrafter(model, draft_ctx, p_min=0.0)
        else:
            drafter = make_drafter(target_ctx)  # attached after the plain answer, which it then does not slow
        controller = DepthController(k_max=k, fixed=k)
        totals = RunTotals()
        t0 = time.perf_counter()
        spec = run(SpeculativeDecoder(model, target_ctx, drafter=drafter, controller=controller), totals)
        spec_s = time.perf_counter() - t0
        mirror = getattr(drafter, "stats", None)
    finally:
        if make_drafter is not None and drafter is not None:
            drafter.detach()
            drafter.ctx.close()
        target_ctx.close()
        if draft_ctx is not None:
            draft_ctx.close()
    n = min(len(plain), len(spec))
    agree = next((i for i in range(n) if plain[i] != spec[i]), n)
    result: dict[str, Any] = {
        "tokens": len(plain), "agree": agree, "k": k, "drafted": totals.drafted, "accepted": totals.accepted,
        "passes": totals.passes, "identical": plain == spec, "speculative_seconds": spec_s,
        "draft_step_seconds": controller.cost.draft_step,  # the median over the answer's drafts
    }
    if mirror is not None:  # the MTP context reading each target batch: a cost per pass beside the steps
        result["mirror_seconds_per_batch"] = mirror.seconds / mirror.batches if mirror.batches else None
        result["mirror_gaps"] = mirror.gaps
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
    prompt = _prompt(model, args.prompt_tokens)
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


def check_mtp(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Plain decode, and the MTP heads drafting for the trunk: their step cost ``c`` (seconds per MTP step
    over seconds per plain token, the c of the speedup estimate), the mirror's cost per pass, exactness."""
    from app.engine.llama import Context, ContextParams, Model
    from app.engine.mtp import MTPContext, MTPDrafter, check_mtp_target
    from app.library.gguf_reader import read_gguf_info

    t0 = time.perf_counter()
    model = Model(path, n_gpu_layers=-1, load_mtp=True)
    load_s = time.perf_counter() - t0
    try:
        check_mtp_target(model, read_gguf_info(path))
        # Snapshots for the Gated DeltaNet state, one per draft position, as the app asks for qwen35.
        params = ContextParams(n_ctx=args.ctx, n_batch=512, n_threads=args.threads, rs_snapshots=args.exact_k)
        prompt = _prompt(model, args.prompt_tokens)
        ctx = Context(model, params)
        try:
            decode = measure_decode(ctx, prompt, args.decode_tokens, args.repeats)
        finally:
            ctx.close()

        def heads(target_ctx: Any) -> Any:
            return MTPDrafter(target_ctx, MTPContext(model, target_ctx, params), p_min=0.0)

        exact = check_exactness(model, params, prompt, args.exact_tokens, args.exact_k, heads)
        model_bytes = model.size_bytes
    finally:
        model.close()
    plain_s = 1.0 / decode["tokens_per_second"]["median"]
    mirror = exact.get("mirror_seconds_per_batch")
    ceiling = ceiling_for(path, decode["context"] + args.decode_tokens // 2)
    return {
        "file": path.name, "file_bytes": path.stat().st_size, "model_bytes": model_bytes, "load_seconds": load_s,
        "decode": decode, "ceiling": ceiling, "exactness": exact,
        "fraction_of_ceiling": 1.0 / plain_s / ceiling["tokens_per_second"] if ceiling["tokens_per_second"] else None,
        "mtp": {
            "step_ms": exact["draft_step_seconds"] * 1e3, "plain_token_ms": plain_s * 1e3,
            "c": exact["draft_step_seconds"] / plain_s,
            "mirror_ms_per_pass": mirror * 1e3 if mirror is not None else None,
            "acceptance": exact["accepted"] / exact["drafted"] if exact["drafted"] else None,
        },
    }


def _prompt(model: Any, n: int) -> list[int]:
    rng = np.random.default_rng(1)
    return [model.bos, *(int(t) for t in rng.integers(2, 258, size=n - 1))]


def travel_sizes(kit: Path) -> dict[str, Any]:
    """Bytes of what goes to the GPU machine: the kit, and the tree (tracked and untracked files git does not
    ignore) where this is a git checkout; ok while they stay within TRAVEL_CAP together."""
    kit_bytes = sum(f.stat().st_size for f in kit.rglob("*") if f.is_file()) if kit.is_dir() else None
    tree_bytes = None
    if (ROOT / ".git").exists():
        try:
            listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                    cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            listed = None
        if listed is not None:
            names = {n for n in listed.decode("utf-8", "surrogateescape").split("\0") if n}
            tree_bytes = sum((ROOT / n).stat().st_size for n in names if (ROOT / n).is_file())
    total = (kit_bytes or 0) + (tree_bytes or 0)
    return {"kit": str(kit), "kit_bytes": kit_bytes, "tree_bytes": tree_bytes, "cap_bytes": TRAVEL_CAP,
            "ok": kit_bytes is not None and total <= TRAVEL_CAP}


def imports_outside_kit() -> list[str]:
    """Top-level modules imported so far that neither the GPU machine's Python nor the kit provides."""
    known = MACHINE_MODULES | set(KIT_WHEELS.values()) | set(sys.stdlib_module_names)
    known |= {"app", "llama_cpp", "gpu_check", "cython_runtime"}
    tops = {name.split(".")[0] for name in list(sys.modules)}
    return sorted(t for t in tops if t not in known and not t.startswith("_"))


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
    parser.add_argument("--cpu", action="store_true",
                        help=f"dry run: {CPU_MODELS} and fewer repeats unless given, one thread")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join([*SHAPES, *MTP_SHAPES])} "
                                          f"(default {GPU_MODELS}; with --cpu {CPU_MODELS})")
    parser.add_argument("--out", type=Path, required=True, help="folder for the models and report.json")
    parser.add_argument("--kit", type=Path, default=ROOT / ".gpu_kit", help="the kit packaging/gpu_kit packed")
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--threads", type=int, help="CPU threads (default 0: physical cores; 1 with --cpu)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, help="default 128; 32 with --cpu")
    parser.add_argument("--repeats", type=int, help="decode runs, default 3; 2 with --cpu")
    parser.add_argument("--max-width", type=int, default=16)
    parser.add_argument("--verify-repeats", type=int, help="default 10; 3 with --cpu")
    parser.add_argument("--exact-tokens", type=int, help="default 64; 32 with --cpu")
    parser.add_argument("--exact-k", type=int, default=8)
    parser.add_argument("--require-gpu", action="store_true", help="fail unless llama.cpp offloads to a GPU")
    args = parser.parse_args(argv)
    defaults = {"models": CPU_MODELS if args.cpu else GPU_MODELS, "threads": 1 if args.cpu else 0,
                "decode_tokens": 32 if args.cpu else 128, "repeats": 2 if args.cpu else 3,
                "verify_repeats": 3 if args.cpu else 10, "exact_tokens": 32 if args.cpu else 64}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in SHAPES and m not in MTP_SHAPES]
    if unknown:
        parser.error(f"unknown model size {unknown[0]!r}; choose from {', '.join([*SHAPES, *MTP_SHAPES])}")
    if args.prompt_tokens < 2 or args.max_width < 1 or args.max_width + args.prompt_tokens > args.ctx:
        parser.error("need --prompt-tokens >= 2 and --prompt-tokens + --max-width <= --ctx")

    from app.engine.llama import init_backend

    args.out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []
    init_backend(log_lines.append)
    t_start = time.perf_counter()
    report: dict[str, Any] = {"schema": 2, "system": system_block(), "args": {k: str(v) for k, v in vars(args).items()},
                              "travel": travel_sizes(args.kit), "models": {}}
    if args.require_gpu and not report["system"]["gpu_offload"]:
        print("gpu_check: this llama.cpp build cannot offload to a GPU", file=sys.stderr)
        return 2
    t = report["travel"]
    mib = 1 << 20
    kit_mib = f"{t['kit_bytes'] / mib:.1f} MiB" if t["kit_bytes"] is not None else "missing"
    tree_mib = f"{t['tree_bytes'] / mib:.1f} MiB" if t["tree_bytes"] is not None else "not a git checkout"
    print(f"gpu_check: kit {kit_mib}, tree {tree_mib}: {'within' if t['ok'] else 'NOT within'} the "
          f"{TRAVEL_CAP // mib} MiB that reach the GPU machine", flush=True)
    ok = bool(t["ok"])
    for name in names:
        mtp = name in MTP_SHAPES
        path = args.out / (f"synthetic-qwen35-{name}-q8_0.gguf" if mtp else f"synthetic-llama-{name}-q8_0.gguf")
        t0 = time.perf_counter()
        if not path.exists():
            write_model(path.with_suffix(".tmp"), MTP_SHAPES[name] if mtp else SHAPES[name]).replace(path)
        write_s = time.perf_counter() - t0
        print(f"gpu_check: {path.name} ({path.stat().st_size / 1e9:.2f} GB) written in {write_s:.1f}s", flush=True)
        result = check_mtp(path, args) if mtp else check_model(path, args)
        result["write_seconds"] = write_s
        report["models"][name] = result
        ok = ok and result["exactness"]["ok"]
        d, x = result["decode"]["tokens_per_second"], result["exactness"]
        exact = f"exactness {'ok' if x['ok'] else 'FAILED'} ({x['agree']}/{x['tokens']} agree)"
        if mtp:
            m = result["mtp"]
            mirror = f"{m['mirror_ms_per_pass']:.2f} ms" if m["mirror_ms_per_pass"] is not None else "none"
            acceptance = f"{m['acceptance']:.0%}" if m["acceptance"] is not None else "none"
            print(f"gpu_check: {name}: plain decode {d['median']:.1f} tok/s, ceiling "
                  f"{result['ceiling']['tokens_per_second']:.1f} tok/s; MTP step {m['step_ms']:.2f} ms, "
                  f"c = {m['c']:.3f} of a plain token ({m['plain_token_ms']:.2f} ms), mirror {mirror} per pass, "
                  f"acceptance {acceptance} (random weights); {exact}", flush=True)
            continue
        c, v = result["ceiling"], result["verify"]["ratio_to_width_1"]
        print(f"gpu_check: {name}: plain decode {d['median']:.1f} tok/s (min {d['min']:.1f}, max {d['max']:.1f}), "
              f"ceiling {c['tokens_per_second']:.1f} tok/s ({result['fraction_of_ceiling']:.0%}); verify cost "
              f"x width 1: " + ", ".join(f"{w}: {r:.2f}" for w, r in v.items()) + f"; {exact}", flush=True)
    outside = imports_outside_kit()
    report["imports_outside_kit"] = outside
    report["kit_modules"] = {m: getattr(sys.modules[m], "__file__", None)
                             for m in KIT_WHEELS.values() if m in sys.modules}
    if outside:
        print(f"gpu_check: imports that neither the GPU machine nor the kit provides: {', '.join(outside)}",
              file=sys.stderr)
        ok = False
    report["seconds"] = time.perf_counter() - t_start
    report["ok"] = ok
    report["llama_log_tail"] = "".join(log_lines)[-4000:]
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_check: report in {args.out / 'report.json'} ({'ok' if ok else 'FAILED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
