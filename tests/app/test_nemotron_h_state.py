"""Nemotron-H's layers come in three kinds, and only the Mamba 2 ones keep a recurrent state.

llama.cpp (src/models/nemotron-h.cpp, load_arch_hparams) makes a layer recurrent where both its
head_count_kv and its feed_forward_length are 0, an attention layer where it has KV heads, and an MLP-only
layer where it has a feed-forward length; the hybrid memory gives a state to the first kind alone. Counting
the MLP-only layers as recurrent (they have no KV heads either) about doubles the state, the fit and the
snapshot budget of a real Nemotron-H, whose layers are about half MLP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.ceiling.roofline import ModelShape, kv_bytes_per_token, recurrent_rollback
from app.engine.llama import ROLLBACK_SNAPSHOTS, Context, ContextParams, Model, init_backend
from app.library.gguf_reader import read_gguf_info
from tests.gguf_fixtures import _add_vocab, _linear, _vocab, save, write_small_gguf

# M: Mamba 2, *: attention, -: MLP-only, as Nemotron-H's hybrid_override_pattern writes them.
PATTERN = "M-M*-M-"
N_EMBD, N_HEAD, N_HEAD_KV, N_FF = 64, 4, 2, 96
D_CONV, D_INNER, D_STATE, N_SSM_HEAD, N_GROUP = 4, 128, 16, 8, 2
# llama_hparams::n_embd_r() + n_embd_s(): the convolution's last d_conv - 1 inputs and the SSM state.
STATE_FLOATS = (D_CONV - 1) * (D_INNER + 2 * N_GROUP * D_STATE) + D_STATE * D_INNER


def kv_heads(pattern: str) -> list[int]:
    return [N_HEAD_KV if c == "*" else 0 for c in pattern]


def ff_lengths(pattern: str) -> list[int]:
    return [N_FF if c == "-" else 0 for c in pattern]


def write_nemotron_h(path: Path, pattern: str = PATTERN, seed: int = 0) -> Path:
    """A tiny Nemotron-H (dense, no MoE) that llama.cpp loads and decodes, tensors as its loader names them."""
    from gguf import GGUFWriter, LlamaFileType

    rng = np.random.default_rng(seed)
    voc = _vocab("bytes")
    n_vocab = len(voc.tokens)
    head_dim = N_EMBD // N_HEAD
    conv_dim = D_INNER + 2 * N_GROUP * D_STATE

    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return _linear(rng, n_out, n_in)

    w = {"token_embd.weight": rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)}
    for i, kind in enumerate(pattern):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = ones(N_EMBD)
        if kind == "M":
            w[p + "ssm_in.weight"] = linear(2 * D_INNER + 2 * N_GROUP * D_STATE + N_SSM_HEAD, N_EMBD)
            w[p + "ssm_conv1d.weight"] = linear(conv_dim, D_CONV)
            w[p + "ssm_conv1d.bias"] = (rng.standard_normal(conv_dim) * 0.1).astype(np.float32)
            w[p + "ssm_dt.bias"] = (rng.standard_normal(N_SSM_HEAD) * 0.1).astype(np.float32)
            w[p + "ssm_a"] = -rng.uniform(0.5, 2.0, (N_SSM_HEAD, 1)).astype(np.float32)
            w[p + "ssm_d"] = ones(N_SSM_HEAD, 1)
            w[p + "ssm_norm.weight"] = ones(N_GROUP, D_INNER // N_GROUP)
            w[p + "ssm_out.weight"] = linear(N_EMBD, D_INNER)
        elif kind == "*":
            w[p + "attn_q.weight"] = linear(N_EMBD, N_EMBD)
            w[p + "attn_k.weight"] = linear(head_dim * N_HEAD_KV, N_EMBD)
            w[p + "attn_v.weight"] = linear(head_dim * N_HEAD_KV, N_EMBD)
            w[p + "attn_output.weight"] = linear(N_EMBD, N_EMBD)
        else:
            w[p + "ffn_up.weight"] = linear(N_FF, N_EMBD)
            w[p + "ffn_down.weight"] = linear(N_EMBD, N_FF)
    w["output_norm.weight"] = ones(N_EMBD)
    w["output.weight"] = linear(n_vocab, N_EMBD)

    writer = GGUFWriter(path, "nemotron_h")
    writer.add_name("tiny-nemotron-h")
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(len(pattern))
    writer.add_vocab_size(n_vocab)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(kv_heads(pattern))
    writer.add_feed_forward_length(ff_lengths(pattern))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_eps(1e-5)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(D_INNER)
    writer.add_ssm_state_size(D_STATE)
    writer.add_ssm_time_step_rank(N_SSM_HEAD)
    writer.add_ssm_group_count(N_GROUP)
    _add_vocab(writer, voc, None)
    for name, tensor in w.items():
        writer.add_tensor(name, tensor)
    save(writer)
    return path


@pytest.fixture(scope="module")
def nemotron_h(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_nemotron_h(tmp_path_factory.mktemp("nemotron-h") / "tiny-nemotron-h.gguf")


def test_layer_kinds_follow_the_feed_forward_lengths(nemotron_h: Path) -> None:
    info = read_gguf_info(nemotron_h)
    assert info.architecture == "nemotron_h"
    assert info.kv_layers == tuple(c == "*" for c in PATTERN)
    assert info.recurrent_layers == PATTERN.count("M") == 3  # not the 6 layers without KV heads
    assert info.recurrent_state_floats == STATE_FLOATS
    assert info.recurrent_state_bytes == 3 * STATE_FLOATS * 4
    shape = ModelShape.from_gguf(info)
    assert kv_bytes_per_token(shape, "f16") == shape.kv_layer_bytes_per_cell("f16")  # the one attention layer


def test_state_is_what_llama_cpp_allocates(nemotron_h: Path) -> None:
    """llama.cpp's copy of the state (the recurrent layers' cells and a small header) bounds the count from
    the header: MLP-only layers counted as recurrent would double it."""
    init_backend(None)
    info = read_gguf_info(nemotron_h)
    shape = ModelShape.from_gguf(info)
    model = Model(nemotron_h, n_gpu_layers=0)
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=32, n_threads=1, rs_snapshots=4))
    try:
        assert model.is_recurrent
        assert ctx.rollback == ROLLBACK_SNAPSHOTS  # llama.cpp keeps snapshots for nemotron_h
        ctx.decode(model.tokenize("hello there", add_special=True))
        measured = ctx.recurrent_state_bytes()
        assert shape.state_bytes <= measured <= shape.state_bytes + 4096
    finally:
        ctx.close()
        model.close()
    plan = recurrent_rollback(shape, "nemotron_h", 16)
    assert plan.snapshots == 16
    assert plan.allocated_bytes == 17 * 3 * STATE_FLOATS * 4


def test_mtp_blocks_leave_the_trunk_s_kinds_alone(tmp_path: Path) -> None:
    """With NextN blocks the per-layer arrays run over block_count (llama.cpp's get_key_or_arr requires that
    length); the trunk's kinds are read from its first entries."""
    pattern = "M*-M-"
    mtp = [N_HEAD_KV], [0]

    def keys(w: Any) -> None:
        w.add_block_count(len(pattern) + 1)
        w.add_uint32("nemotron_h_moe.nextn_predict_layers", 1)
        w.add_embedding_length(N_EMBD)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(kv_heads(pattern) + mtp[0])
        w.add_feed_forward_length(ff_lengths(pattern) + mtp[1])
        w.add_ssm_conv_kernel(D_CONV)
        w.add_ssm_inner_size(D_INNER)
        w.add_ssm_state_size(D_STATE)
        w.add_ssm_group_count(N_GROUP)

    info = read_gguf_info(write_small_gguf(tmp_path / "moe.gguf", "nemotron_h_moe", keys))
    assert info.mtp_layers == 1
    assert info.kv_layers == (False, True, False, False, False, False)
    assert info.recurrent_layers == 2
    assert info.recurrent_state_floats == STATE_FLOATS
