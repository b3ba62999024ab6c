"""The roofline's arithmetic: the worked examples, Leviathan's table, KV sizes (checked against what
llama.cpp itself allocates), placement across devices, the fit estimate and the calibration."""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path

import pytest

from app.ceiling.calibration import calibrate, make_calibration
from app.ceiling.fit import fit_estimate
from app.ceiling.roofline import (
    COMPUTE,
    MEMORY,
    Device,
    ModelShape,
    ceiling,
    compute_buffer_bytes,
    estimate_pass,
    kv_bytes_per_token,
    kv_bytes_read,
    kv_cache_bytes,
    kv_row_bytes,
    place,
    roof,
)
from app.ceiling.speculation import expected_speedup, expected_tokens_per_pass
from app.library.gguf_reader import read_gguf_info

GB = 1e9
MIB = 1 << 20


def gpu(bandwidth_gbps: float, free_gb: float | None = None, key: str = "gpu0") -> Device:
    free = int(free_gb * GB) if free_gb is not None else None
    return Device(key, key.upper(), "gpu", bandwidth_gbps * GB, None, free)


def cpu(bandwidth_gbps: float = 60, peak_gflops: float | None = None, free_gb: float | None = None) -> Device:
    peak = peak_gflops * 1e9 if peak_gflops else None
    free = int(free_gb * GB) if free_gb is not None else None
    return Device("cpu", "CPU", "cpu", bandwidth_gbps * GB, peak, free)


def dense(weight_bytes: float, n_params: float, n_layer: int = 32) -> ModelShape:
    """A model with no KV-relevant detail: only weights count at context 0."""
    return ModelShape("m", int(weight_bytes), int(n_params), n_layer, 4096, 32, 8, 128, 128, n_vocab=32000)


LLAMA3_8B = ModelShape("llama-3-8b", int(4.9 * GB), 8_030_000_000, 32, 4096, 32, 8, 128, 128, 128256)
GEMMA3_LIKE = ModelShape("gemma-3-like", 246_587_904, 268_098_176, 18, 640, 4, 1, 256, 256, 262144,
                         sliding_window=512, swa_layers=tuple(il % 6 != 5 for il in range(18)))


# --- the worked examples (GB = 1e9 bytes) -------------------------------------------------------


def test_weights_only_rtx_4090() -> None:
    assert math.floor(1 / roof(gpu(1008), 17 * GB, 0).seconds) == 59  # 59.3


def test_weights_plus_cache_rtx_4090() -> None:
    assert math.floor(1 / roof(gpu(1008), 17 * GB + 4.4 * GB, 0).seconds) == 47  # 47.1


def test_cache_as_large_as_fp16_weights() -> None:
    assert math.floor(1 / roof(gpu(1008), 17 * GB + 17 * GB, 0).seconds) == 29  # 29.6


def test_weights_only_rx_7900_xtx() -> None:
    assert math.floor(1 / roof(gpu(960), 17 * GB, 0).seconds) == 56  # 56.5


def test_8b_q4_k_m_on_1008_gbps() -> None:
    est = ceiling(dense(4.9 * GB, 8e9), [gpu(1008)], context=0)
    assert math.floor(est.tokens_per_second) == 205  # 205.7
    assert est.binding == MEMORY


def test_70_gb_on_4_8_tbps() -> None:
    est = ceiling(dense(70 * GB, 70e9, n_layer=80), [gpu(4800)], context=0)
    assert math.floor(est.tokens_per_second) == 68  # 68.6


def test_70b_4bit_on_1008_gbps() -> None:
    est = ceiling(dense(38 * GB, 70e9, n_layer=80), [gpu(1008)], context=0)
    assert round(est.tokens_per_second, 1) == 26.5


# --- Leviathan et al. ---------------------------------------------------------------------------

LEVIATHAN = {
    0.35: (1.35, 1.52, 1.54),
    0.5: (1.50, 1.88, 1.97),
    0.6: (1.60, 2.18, 2.38),
    0.7: (1.70, 2.53, 2.94),
    0.8: (1.80, 2.95, 3.69),
    0.9: (1.90, 3.44, 4.69),
}


@pytest.mark.parametrize("alpha", sorted(LEVIATHAN))
def test_expected_tokens_per_pass_table(alpha: float) -> None:
    got = tuple(round(expected_tokens_per_pass(alpha, k), 2) for k in (1, 3, 5))
    assert got == LEVIATHAN[alpha]


def test_speedup_with_free_drafter_is_tokens_per_pass() -> None:
    assert expected_speedup(0.8, 3, 0.0) == pytest.approx(expected_tokens_per_pass(0.8, 3))


def test_speedup_pays_for_drafter_steps() -> None:
    # (1 - 0.8^5) / 0.2 = 3.3616 tokens, over 4 * 0.05 + 1 = 1.2 target passes
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)


def test_leviathan_edges() -> None:
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(0.6, 0) == 1.0
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_pass(1.5, 2)


# --- roofs and passes ---------------------------------------------------------------------------


def test_roof_takes_the_larger_time() -> None:
    r = roof(cpu(50, peak_gflops=100), 1 * GB, 10e9)
    assert r.memory_seconds == pytest.approx(0.02)
    assert r.compute_seconds == pytest.approx(0.1)
    assert r.seconds == pytest.approx(0.1)
    assert r.binding == COMPUTE
    assert roof(cpu(50, peak_gflops=None), 1 * GB, 10e9).binding == MEMORY  # unknown peak: no compute roof


def test_flops_are_two_per_parameter_per_token() -> None:
    shape = dense(1 * GB, 1e9)
    one = estimate_pass(shape, [cpu(100, 1000)], context=0, tokens=1)
    eight = estimate_pass(shape, [cpu(100, 1000)], context=0, tokens=8)
    assert one.flops == pytest.approx(2e9)
    assert eight.flops == pytest.approx(16e9)
    assert one.bytes == eight.bytes == pytest.approx(1 * GB)  # a wider pass reads the weights once
    assert one.binding == MEMORY  # 10 ms of reads against 2 ms of arithmetic
    assert eight.binding == COMPUTE  # 16 ms of arithmetic
    assert eight.seconds == pytest.approx(0.016)


def test_kv_read_counts_every_layer_at_the_context() -> None:
    # Llama-3-8B: 32 layers × 8 KV heads × (128 + 128) × 2 bytes = 128 KiB per token.
    assert kv_bytes_per_token(LLAMA3_8B) == 131072
    assert kv_bytes_per_token(LLAMA3_8B, "q8_0") == 32 * 2 * kv_row_bytes("q8_0", 1024) == 69632
    assert kv_bytes_read(LLAMA3_8B, 32768) == 32768 * 131072  # 4.29 GB
    est = ceiling(LLAMA3_8B, [gpu(1008)], context=32768)
    assert est.target_kv_bytes == 32768 * 131072
    assert est.tokens_per_second == pytest.approx(1008 * GB / (4.9 * GB + 32768 * 131072))


def test_kv_element_sizes() -> None:
    assert kv_row_bytes("f16", 128) == 256
    assert kv_row_bytes("bf16", 128) == 256
    assert kv_row_bytes("f32", 128) == 512
    assert kv_row_bytes("q8_0", 128) == 4 * 34
    assert kv_row_bytes("q4_0", 128) == 4 * 18
    with pytest.raises(ValueError, match="unknown KV cache type"):
        kv_row_bytes("q3_k", 128)


def test_swa_layers_read_at_most_the_window() -> None:
    per_cell = 2 * 256 * 2  # one KV head of 256 for K and V, f16
    assert GEMMA3_LIKE.kv_layer_bytes_per_cell() == per_cell
    # 3 global layers read the whole context; 15 sliding-window layers read 512 cells.
    assert kv_bytes_read(GEMMA3_LIKE, 4096) == (3 * 4096 + 15 * 512) * per_cell
    assert kv_bytes_read(GEMMA3_LIKE, 300) == 18 * 300 * per_cell


def test_kv_cache_allocation_pads_and_shrinks_swa() -> None:
    per_cell = GEMMA3_LIKE.kv_layer_bytes_per_cell()
    # llama.cpp pads the context to 256 cells; an SWA cache holds pad(window + ubatch, 256) cells.
    assert kv_cache_bytes(GEMMA3_LIKE, 1000) == 18 * 1024 * per_cell
    assert kv_cache_bytes(GEMMA3_LIKE, 4096, swa_full=False) == (3 * 4096 + 15 * 1024) * per_cell
    assert kv_cache_bytes(GEMMA3_LIKE, 4096, swa_full=False, n_ubatch=128) == (3 * 4096 + 15 * 768) * per_cell
    assert kv_cache_bytes(GEMMA3_LIKE, 300, swa_full=False) == 18 * 512 * per_cell


# --- placement and the offload cliff ------------------------------------------------------------


def test_place_all_on_gpu_or_all_on_cpu() -> None:
    shape = dense(38 * GB, 70e9, n_layer=80)
    (share,) = place(shape, [cpu(), gpu(1008)], -1)
    assert share.device.key == "gpu0"
    assert len(share.layers) == 80
    assert share.output
    (share,) = place(shape, [cpu(), gpu(1008)], 0)
    assert share.device.key == "cpu"
    assert len(share.layers) == 80
    assert share.output
    (share,) = place(shape, [cpu()], -1)
    assert share.device.key == "cpu"


def test_partial_offload_runs_the_rest_at_cpu_bandwidth() -> None:
    shape = dense(38 * GB, 70e9, n_layer=80)
    shares = place(shape, [cpu(60), gpu(1008)], 40)
    on = {s.device.key: s for s in shares}
    # As llama.cpp offloads: the output layer first, then the last 39 repeating layers.
    assert on["cpu"].layers == tuple(range(41))
    assert not on["cpu"].output
    assert on["gpu0"].layers == tuple(range(41, 80))
    assert on["gpu0"].output
    (only_output,) = [s for s in place(shape, [cpu(60), gpu(1008)], 1) if s.device.key == "gpu0"]
    assert only_output.layers == ()
    assert only_output.output
    est = ceiling(shape, [cpu(60), gpu(1008)], context=0, n_gpu_layers=40)
    expected = 1 / (38 * GB * 41 / 81 / (60 * GB) + 38 * GB * 40 / 81 / (1008 * GB))
    assert est.tokens_per_second == pytest.approx(expected)  # 3.0 tok/s: the offload cliff
    assert est.binding_device == "cpu"
    assert est.tokens_per_second < 26.5 / 8


def test_layers_split_across_gpus_by_free_memory() -> None:
    shape = dense(38 * GB, 70e9, n_layer=80)
    shares = place(shape, [cpu(), gpu(1008, 24, "gpu0"), gpu(1008, 8, "gpu1")], -1)
    assert [len(s.layers) for s in shares] == [60, 20]
    assert shares[-1].output


def test_drafter_steps_add_their_passes() -> None:
    target = dense(17 * GB, 8e9)
    drafter = dense(1 * GB, 0.5e9, n_layer=16)
    est = estimate_pass(target, [gpu(1000)], 0, tokens=5, drafter=drafter, draft_steps=4)
    assert est.bytes == pytest.approx(17 * GB + 4 * 1 * GB)
    assert est.seconds == pytest.approx(0.021)
    assert est.speculative_tokens_per_second(3.0) == pytest.approx(3.0 / 0.021)
    assert est.flops == pytest.approx(5 * 2 * 8e9 + 4 * 2 * 0.5e9)


# --- fit ----------------------------------------------------------------------------------------


def test_fit_says_what_does_not_fit_and_by_how_much() -> None:
    shape = dense(38 * GB, 70e9, n_layer=80)
    fit = fit_estimate(shape, [cpu(free_gb=64), gpu(1008, free_gb=24)], 4096)
    assert not fit.fits
    (dev,) = fit.devices
    assert dev.device == "gpu0"
    assert dev.weights == 38 * GB
    assert dev.kv == 80 * 4096 * 8 * 256 * 2
    assert dev.short_by == dev.need - 24 * GB
    assert "Does not fit on GPU0" in fit.message
    assert "short" in fit.message


def test_fit_counts_the_drafter_too() -> None:
    target = dense(20 * GB, 10e9)
    drafter = dense(3.5 * GB, 1e9, n_layer=16)
    alone = fit_estimate(target, [cpu(), gpu(1008, free_gb=24)], 2048)
    both = fit_estimate(target, [cpu(), gpu(1008, free_gb=24)], 2048, drafter=drafter)
    assert alone.fits
    assert not both.fits
    assert both.devices[0].need - alone.devices[0].need > 3.5 * GB


def test_compute_buffer_follows_llama_cpp() -> None:
    # llama.cpp reported 98.25 MiB (SmolLM2) and 514.50 MiB (Gemma 3 270M) at n_ubatch 512.
    smollm2 = ModelShape("s", 96_576_768, 134_515_008, 30, 576, 9, 3, 64, 64, 49152)
    assert compute_buffer_bytes(smollm2, 4096) / MIB == pytest.approx(98.25, rel=0.01)
    assert compute_buffer_bytes(GEMMA3_LIKE, 4096) / MIB == pytest.approx(514.50, rel=0.01)


# --- calibration --------------------------------------------------------------------------------


def test_calibration_is_delivered_bytes_and_flops() -> None:
    cal = make_calibration(40.0, 5 * GB, 16e9, ceiling_passes_per_second=200.0)
    assert cal.delivered_bandwidth == pytest.approx(200 * GB)
    assert cal.delivered_flops == pytest.approx(640e9)
    assert cal.tokens_per_second == 40.0
    assert cal.efficiency == pytest.approx(0.2)
    assert make_calibration(40.0, 5 * GB, 16e9).efficiency is None
    with pytest.raises(ValueError, match="finite"):
        make_calibration(math.nan, 1, 1)


def test_calibrate_against_an_estimate() -> None:
    est = ceiling(LLAMA3_8B, [gpu(1008)], context=1024)
    cal = calibrate(150.0, est)
    assert cal.bytes_per_pass == est.bytes
    assert cal.ceiling_passes_per_second == est.passes_per_second
    assert cal.efficiency == pytest.approx(150.0 / est.passes_per_second)


# --- the demo models against llama.cpp ----------------------------------------------------------

try:
    import llama_cpp
except ImportError:  # the pure tests above still run
    llama_cpp = None

_captured: list[str] = []
_capturing = [False]


def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if _capturing[0]:
        _captured.append(text.decode(errors="replace"))


# Kept at module level: llama.cpp calls it for as long as the process lives. It drops what it is not
# capturing, so it also keeps other tests quiet.
_capture_log = llama_cpp.llama_log_callback(_log) if llama_cpp is not None else None


KV_TYPE_IDS = {"f16": 1, "q4_0": 2, "q8_0": 8}


def llama_cpp_kv_bytes(model: int, n_ctx: int, kv_type: str, swa_full: bool, n_ubatch: int) -> float:
    """What llama.cpp says it allocated for the KV cache(s), read from its log."""
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = 512
    cp.n_ubatch = n_ubatch
    cp.swa_full = swa_full
    cp.type_k = cp.type_v = KV_TYPE_IDS[kv_type]
    cp.flash_attn_type = 1 if kv_type != "f16" else -1  # a quantized V cache needs flash attention
    _captured.clear()
    _capturing[0] = True
    try:
        ctx = llama_cpp.llama_init_from_model(model, cp)
    finally:
        _capturing[0] = False
    assert ctx, "llama.cpp could not create the context"
    llama_cpp.llama_free(ctx)
    sizes = re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", "".join(_captured))
    assert sizes, "no KV cache size in llama.cpp's log"
    return sum(float(s) for s in sizes) * MIB


CONFIGS = [  # (n_ctx, kv type, swa_full, n_ubatch)
    (512, "f16", True, 512),
    (1000, "f16", True, 512),
    (4096, "f16", False, 512),
    (4096, "q8_0", False, 512),
    (4096, "f16", False, 128),
    (2048, "q4_0", True, 512),
]


@pytest.mark.demo
@pytest.mark.parametrize("which", [0, 1], ids=["smollm2", "gemma3"])
def test_kv_bytes_match_llama_cpp(demo_models: tuple[Path, Path], which: int) -> None:
    if llama_cpp is None:
        pytest.skip("llama-cpp-python is not installed")
    path = demo_models[which]
    shape = ModelShape.from_gguf(read_gguf_info(path))
    llama_cpp.llama_log_set(_capture_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    assert model
    try:
        for n_ctx, kv_type, swa_full, n_ubatch in CONFIGS:
            actual = llama_cpp_kv_bytes(model, n_ctx, kv_type, swa_full, n_ubatch)
            ours = kv_cache_bytes(shape, n_ctx, kv_type, swa_full=swa_full, n_ubatch=n_ubatch)
            assert ours == pytest.approx(actual, rel=0.05), (n_ctx, kv_type, swa_full, n_ubatch)
            # The log prints MiB to two decimals; the formula is exact beyond that.
            assert abs(ours - actual) <= 0.01 * MIB * 3
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.demo
def test_gemma_swa_cache_is_smaller_than_a_full_one(demo_models: tuple[Path, Path]) -> None:
    shape = ModelShape.from_gguf(read_gguf_info(demo_models[1]))
    assert sum(shape.swa_layers) == 15
    assert shape.sliding_window == 512
    assert kv_cache_bytes(shape, 8192, swa_full=False) < kv_cache_bytes(shape, 8192, swa_full=True) / 3
