"""Write tiny, random-weight llama GGUF models that llama.cpp loads and decodes in milliseconds.

`write_tiny_model` is the one entry point. The weights are random but shaped so the next-token distribution
is peaked yet context-dependent (greedy output varies, temperature-1 sampling sees several likely tokens),
and control tokens are made very unlikely so generation rarely stops early on an EOS.

Vocabularies:

- ``"bytes"``: byte-level BPE ("gpt2" tokenizer): 5 control tokens, the 256 GPT-2 byte tokens and 8 merges
  (269 tokens). Ids: 0 ``<|bos|>``, 1 ``<|eos|>``, 2 ``<|im_start|>``, 3 ``<|im_end|>``, 4 ``<|pad|>``,
  5..260 the byte tokens (byte b is id 5 + b), 261..268 the merged tokens.
- ``"bytes-alt"``: the same, except the last merge (and so the text of token 268) differs, so llama.cpp's
  drafter compatibility rule (identical token text from id 5 on) fails and nothing else does.
- ``"smollm2"``: the tokenizer metadata of the installed SmolLM2 demo model (49,152 tokens).

Drafters: the same ``seed`` and ``perturb=0`` give bit-identical weights; ``perturb > 0`` adds Gaussian
noise of that relative scale (per tensor, relative to the tensor's RMS) drawn from ``perturb_seed``.
Every tensor is cast to float32 here: an F64 tensor loads and then aborts llama.cpp at the first decode.
``aborting=True`` writes the token embeddings as F64 on purpose: a model that loads and then GGML_ABORTs
(in get_rows) at its first decode, for testing how every command reports a crash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

VOCABS = ("bytes", "bytes-alt", "smollm2")

BYTES_SPECIALS = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
BYTES_BOS_ID = 0
BYTES_EOS_ID = 1
BYTES_EOT_ID = 3
BYTES_PAD_ID = 4
BYTES_FIRST_BYTE_ID = len(BYTES_SPECIALS)  # byte b is token BYTES_FIRST_BYTE_ID + b
_MERGES = ("Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he", "r e")
_MERGES_ALT = (*_MERGES[:-1], "a n")
BYTES_VOCAB_SIZE = len(BYTES_SPECIALS) + 256 + len(_MERGES)  # 269

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VOCAB_SIZE = 49152

# Standard deviation of the logits over ordinary tokens (after the final RMS norm): large enough for a
# peaked distribution, small enough that temperature-1 sampling sees several likely tokens.
_LOGIT_STD = 4.0
# Output rows of control tokens (and, in the byte vocabularies, of non-printable bytes) are shrunk by
# these factors so they are rarely produced: the logit of a control token stays near 0 while ordinary
# tokens spread with std _LOGIT_STD.
_CONTROL_ROW_SCALE = 0.05
_UNPRINTABLE_ROW_SCALE = 0.3

_TOKEN_NORMAL = 1
_TOKEN_CONTROL = 3


@dataclass
class _Vocab:
    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    add_bos: bool
    add_eos: bool = False
    add_space_prefix: bool = False
    eot_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    # Output-row scale per token (1.0 = ordinary token).
    row_scale: np.ndarray = field(default_factory=lambda: np.ones(0, dtype=np.float32))


@functools.cache
def gpt2_byte_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-to-unicode map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _bytes_vocab(alt: bool) -> _Vocab:
    b2u = gpt2_byte_to_unicode()
    merges = list(_MERGES_ALT if alt else _MERGES)
    tokens = list(BYTES_SPECIALS) + [b2u[b] for b in range(256)] + [m.replace(" ", "") for m in merges]
    types = [_TOKEN_CONTROL] * len(BYTES_SPECIALS) + [_TOKEN_NORMAL] * (256 + len(merges))
    scale = np.ones(len(tokens), dtype=np.float32)
    scale[: len(BYTES_SPECIALS)] = _CONTROL_ROW_SCALE
    for b in range(256):
        if not (0x20 <= b <= 0x7E or b == 0x0A):
            scale[BYTES_FIRST_BYTE_ID + b] = _UNPRINTABLE_ROW_SCALE
    assert len(tokens) == BYTES_VOCAB_SIZE
    return _Vocab(
        model="gpt2", pre="gpt-2", tokens=tokens, token_types=types, merges=merges,
        bos_id=BYTES_BOS_ID, eos_id=BYTES_EOS_ID, add_bos=True, eot_id=BYTES_EOT_ID, pad_id=BYTES_PAD_ID,
        row_scale=scale,
    )


def smollm2_path() -> Path:
    """The installed SmolLM2 demo model; a clear error when it is not installed."""
    from app.library.demo_install import installed_demo_models

    for path in installed_demo_models():
        if path.name == SMOLLM2_FILE:
            return path
    raise FileNotFoundError(
        f"The demo model {SMOLLM2_FILE} is not installed (needed for vocab='smollm2'); "
        "run `specdeck demo-models` first."
    )


@functools.cache
def _smollm2_vocab(path: Path) -> _Vocab:
    # gguf's own reader (a trusted file; about 3 s for the 49k-token vocabulary, once per session).
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def get(key: str, default: Any = None) -> Any:
        found = fields.get(f"tokenizer.ggml.{key}")
        return default if found is None else found.contents()

    def opt_int(key: str) -> int | None:
        value = get(key)
        return None if value is None else int(value)

    tokens = [str(t) for t in get("tokens")]
    types = [int(t) for t in get("token_type")]
    scale = np.ones(len(tokens), dtype=np.float32)
    scale[np.asarray(types) == _TOKEN_CONTROL] = _CONTROL_ROW_SCALE
    return _Vocab(
        model=str(get("model")), pre=str(get("pre", "default")), tokens=tokens, token_types=types,
        merges=[str(m) for m in get("merges")], bos_id=int(get("bos_token_id")),
        eos_id=int(get("eos_token_id")), add_bos=bool(get("add_bos_token", False)),
        add_eos=bool(get("add_eos_token", False)), add_space_prefix=bool(get("add_space_prefix", False)),
        eot_id=opt_int("eot_token_id"), unk_id=opt_int("unknown_token_id"),
        pad_id=opt_int("padding_token_id"), row_scale=scale,
    )


def _vocab(name: str) -> _Vocab:
    if name == "bytes":
        return _bytes_vocab(alt=False)
    if name == "bytes-alt":
        return _bytes_vocab(alt=True)
    if name == "smollm2":
        return _smollm2_vocab(smollm2_path())
    raise ValueError(f"unknown vocab {name!r}; expected one of {', '.join(VOCABS)}")


def _weights(
    vocab: _Vocab, *, seed: int, n_embd: int, n_layer: int, n_head: int, n_head_kv: int, n_ff: int,
) -> dict[str, np.ndarray]:
    """Random float32 weights, numpy shapes in (out, in) order, generated in a fixed order from `seed`."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab.tokens)
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv

    linear = functools.partial(_linear, rng)

    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(n_embd, dtype=np.float32)
        w[p + "attn_q.weight"] = linear(n_embd, n_embd)
        w[p + "attn_k.weight"] = linear(n_embd_kv, n_embd)
        w[p + "attn_v.weight"] = linear(n_embd_kv, n_embd)
        w[p + "attn_output.weight"] = linear(n_embd, n_embd)
        w[p + "ffn_norm.weight"] = np.ones(n_embd, dtype=np.float32)
        w[p + "ffn_gate.weight"] = linear(n_ff, n_embd)
        w[p + "ffn_up.weight"] = linear(n_ff, n_embd)
        w[p + "ffn_down.weight"] = linear(n_embd, n_ff)
    w["output_norm.weight"] = np.ones(n_embd, dtype=np.float32)
    out = linear(n_vocab, n_embd) * np.float32(_LOGIT_STD)
    w["output.weight"] = (out * vocab.row_scale[:, None]).astype(np.float32)
    return w


# Recurrent and hybrid architectures (tiny shapes; llama.cpp's loaders in src/models/*.cpp name the tensors):
# "mamba" (every layer a Mamba block), "lfm2" (short convolutions beside attention, with llama.cpp's state
# snapshots), "qwen35" (Qwen3.5: Gated DeltaNet beside gated attention, with snapshots) and "granitehybrid"
# (Granite-4-H: Mamba 2 beside attention, no snapshots).
RECURRENT_ARCHS = ("mamba", "lfm2", "qwen35", "granitehybrid")
ARCHS = ("llama", *RECURRENT_ARCHS)
_SSM_CONV = 4  # Mamba's convolution kernel
_SSM_STATE = 16
_SSM_DT_RANK = 4  # Mamba 1's time-step rank
_SSM_HEAD_DIM = 16  # Mamba 2's head size (its time_step_rank is the head count)
_SHORTCONV_L_CACHE = 3
_DELTA_K_HEADS = 2  # Gated DeltaNet: key heads (ssm.group_count) and value heads (ssm.time_step_rank)
_DELTA_V_HEADS = 4


def attention_layers(arch: str, n_layer: int) -> list[bool]:
    """Which layers of a tiny model of ``arch`` are attention layers (odd ones in the hybrids)."""
    if arch == "llama":
        return [True] * n_layer
    if arch == "mamba":
        return [False] * n_layer
    return [il % 2 == 1 for il in range(n_layer)]


def _recurrent_weights(
    arch: str, vocab: _Vocab, *, seed: int, n_embd: int, n_layer: int, n_head: int, n_head_kv: int, n_ff: int,
) -> dict[str, np.ndarray]:
    """Random float32 weights for a recurrent or hybrid ``arch`` (numpy shapes in (out, in) order)."""
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab.tokens)
    head_dim = n_embd // n_head
    d_inner = 2 * n_embd  # llama.cpp supports only an expansion factor of 2

    linear = functools.partial(_linear, rng)

    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)

    def small(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32)}
    attention = attention_layers(arch, n_layer)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = ones(n_embd)
        if arch == "qwen35":
            w[p + "post_attention_norm.weight"] = ones(n_embd)
        if attention[i]:
            if arch in ("lfm2", "qwen35"):
                w[p + "attn_q_norm.weight"] = ones(head_dim)
                w[p + "attn_k_norm.weight"] = ones(head_dim)
            # Qwen3.5's query projection also yields the output gate: twice as wide.
            w[p + "attn_q.weight"] = linear(2 * n_embd if arch == "qwen35" else n_embd, n_embd)
            w[p + "attn_k.weight"] = linear(head_dim * n_head_kv, n_embd)
            w[p + "attn_v.weight"] = linear(head_dim * n_head_kv, n_embd)
            w[p + "attn_output.weight"] = linear(n_embd, n_embd)
        elif arch == "mamba":
            w[p + "ssm_in.weight"] = linear(2 * d_inner, n_embd)
            w[p + "ssm_conv1d.weight"] = linear(d_inner, _SSM_CONV)
            w[p + "ssm_conv1d.bias"] = small(d_inner)
            w[p + "ssm_x.weight"] = linear(_SSM_DT_RANK + 2 * _SSM_STATE, d_inner)
            w[p + "ssm_dt.weight"] = linear(d_inner, _SSM_DT_RANK)
            w[p + "ssm_dt.bias"] = small(d_inner)
            # A = -exp(A_log) < 0: the state decays, as in a trained model (a positive A blows up).
            w[p + "ssm_a"] = -rng.uniform(0.5, 2.0, (d_inner, _SSM_STATE)).astype(np.float32)
            w[p + "ssm_d"] = ones(d_inner)
            w[p + "ssm_out.weight"] = linear(n_embd, d_inner)
        elif arch == "qwen35":
            key_dim, value_dim = _SSM_STATE * _DELTA_K_HEADS, _SSM_STATE * _DELTA_V_HEADS
            w[p + "attn_qkv.weight"] = linear(2 * key_dim + value_dim, n_embd)
            w[p + "attn_gate.weight"] = linear(value_dim, n_embd)
            w[p + "ssm_conv1d.weight"] = linear(2 * key_dim + value_dim, _SSM_CONV)
            w[p + "ssm_dt.bias"] = small(_DELTA_V_HEADS)
            w[p + "ssm_a"] = -rng.uniform(0.5, 2.0, _DELTA_V_HEADS).astype(np.float32)
            w[p + "ssm_beta.weight"] = linear(_DELTA_V_HEADS, n_embd)
            w[p + "ssm_alpha.weight"] = linear(_DELTA_V_HEADS, n_embd)
            w[p + "ssm_norm.weight"] = ones(_SSM_STATE)
            w[p + "ssm_out.weight"] = linear(n_embd, value_dim)
        elif arch == "lfm2":
            w[p + "shortconv.conv.weight"] = linear(n_embd, _SHORTCONV_L_CACHE)
            w[p + "shortconv.in_proj.weight"] = linear(3 * n_embd, n_embd)
            w[p + "shortconv.out_proj.weight"] = linear(n_embd, n_embd)
        else:  # granitehybrid: Mamba 2 with one group
            n_ssm_head = d_inner // _SSM_HEAD_DIM
            conv_dim = d_inner + 2 * _SSM_STATE
            w[p + "ssm_in.weight"] = linear(2 * d_inner + 2 * _SSM_STATE + n_ssm_head, n_embd)
            w[p + "ssm_conv1d.weight"] = linear(conv_dim, _SSM_CONV)
            w[p + "ssm_conv1d.bias"] = small(conv_dim)
            w[p + "ssm_dt.bias"] = small(n_ssm_head)
            w[p + "ssm_a"] = -rng.uniform(0.5, 2.0, (n_ssm_head, 1)).astype(np.float32)
            w[p + "ssm_d"] = ones(n_ssm_head, 1)
            w[p + "ssm_norm.weight"] = ones(1, d_inner)
            w[p + "ssm_out.weight"] = linear(n_embd, d_inner)
        if arch != "mamba":
            if arch != "qwen35":  # Qwen3.5 norms the FFN's input with post_attention_norm
                w[p + "ffn_norm.weight"] = ones(n_embd)
            w[p + "ffn_gate.weight"] = linear(n_ff, n_embd)
            w[p + "ffn_up.weight"] = linear(n_ff, n_embd)
            w[p + "ffn_down.weight"] = linear(n_embd, n_ff)
    w["token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight"] = ones(n_embd)
    out = linear(n_vocab, n_embd) * np.float32(_LOGIT_STD)
    w["output.weight"] = (out * vocab.row_scale[:, None]).astype(np.float32)
    return w


def _add_recurrent_keys(writer: Any, arch: str, *, n_embd: int, n_layer: int, n_head: int, n_head_kv: int,
                        n_ff: int) -> None:
    if arch == "mamba":
        writer.add_feed_forward_length(0)
        writer.add_head_count(0)
        writer.add_head_count_kv(0)
        writer.add_ssm_conv_kernel(_SSM_CONV)
        writer.add_ssm_inner_size(2 * n_embd)
        writer.add_ssm_state_size(_SSM_STATE)
        writer.add_ssm_time_step_rank(_SSM_DT_RANK)
        return
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    if arch != "qwen35":  # per layer: no KV heads marks a recurrent layer
        writer.add_head_count_kv([n_head_kv if a else 0 for a in attention_layers(arch, n_layer)])
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    if arch == "lfm2":
        writer.add_shortconv_l_cache(_SHORTCONV_L_CACHE)
    elif arch == "qwen35":
        head_dim = n_embd // n_head
        writer.add_head_count_kv(n_head_kv)  # a scalar: the layer kinds come from full_attention_interval
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_sections([head_dim // 4, head_dim // 8, head_dim // 8, 0])
        writer.add_full_attention_interval(2)
        writer.add_ssm_conv_kernel(_SSM_CONV)
        writer.add_ssm_inner_size(_SSM_STATE * _DELTA_V_HEADS)
        writer.add_ssm_state_size(_SSM_STATE)
        writer.add_ssm_time_step_rank(_DELTA_V_HEADS)
        writer.add_ssm_group_count(_DELTA_K_HEADS)
    else:
        writer.add_ssm_conv_kernel(_SSM_CONV)
        writer.add_ssm_inner_size(2 * n_embd)
        writer.add_ssm_state_size(_SSM_STATE)
        writer.add_ssm_time_step_rank(2 * n_embd // _SSM_HEAD_DIM)
        writer.add_ssm_group_count(1)


def _mtp_block_weights(il: int, *, seed: int, n_embd: int, n_head: int, n_head_kv: int,
                       n_ff: int) -> dict[str, np.ndarray]:
    """A Qwen3.5 MTP block (src/models/qwen35.cpp, load_block_mtp): a gated-attention decoder block whose input
    is ``eh_proj`` of the normed token embedding beside the normed hidden state of the trunk."""
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    linear = functools.partial(_linear, rng)

    ones = _ones
    p = f"blk.{il}."
    return {
        p + "attn_norm.weight": ones(n_embd),
        p + "post_attention_norm.weight": ones(n_embd),
        p + "attn_q.weight": linear(2 * n_embd, n_embd),  # the query and the output gate
        p + "attn_k.weight": linear(head_dim * n_head_kv, n_embd),
        p + "attn_v.weight": linear(head_dim * n_head_kv, n_embd),
        p + "attn_output.weight": linear(n_embd, n_embd),
        p + "attn_q_norm.weight": ones(head_dim),
        p + "attn_k_norm.weight": ones(head_dim),
        p + "ffn_gate.weight": linear(n_ff, n_embd),
        p + "ffn_up.weight": linear(n_ff, n_embd),
        p + "ffn_down.weight": linear(n_embd, n_ff),
        p + "nextn.eh_proj.weight": linear(n_embd, 2 * n_embd),
        p + "nextn.enorm.weight": ones(n_embd),
        p + "nextn.hnorm.weight": ones(n_embd),
    }


def _make_bigram(weights: dict[str, np.ndarray], *, n_layer: int, mtp_layers: int, n_embd: int, noise: float,
                 seed: int) -> None:
    """Zero every block's writes to the residual stream; MTP blocks take the normed token embedding as is."""
    for name, tensor in weights.items():
        if name.endswith(("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight",
                          "ssm_out.weight")):
            weights[name] = np.zeros_like(tensor)
    rng = np.random.default_rng(seed + 7)
    for il in range(n_layer, n_layer + mtp_layers):
        eh = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)
        eh[:, :n_embd] = np.eye(n_embd, dtype=np.float32)  # ggml concatenates (normed embedding, normed hidden)
        eh += (rng.standard_normal(eh.shape) * noise / np.sqrt(n_embd)).astype(np.float32)
        weights[f"blk.{il}.nextn.eh_proj.weight"] = eh


def _perturb(weights: dict[str, np.ndarray], scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for name, tensor in weights.items():
        rms = float(np.sqrt(np.mean(np.square(tensor, dtype=np.float64))))
        noise = rng.standard_normal(tensor.shape) * (scale * rms)
        weights[name] = (tensor + noise).astype(np.float32)


def write_tiny_model(
    path: Path,
    *,
    vocab: str = "bytes",
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 4096,
    perturb: float = 0.0,
    perturb_seed: int = 1,
    chat_template: str | None = DEFAULT_TEMPLATE,
    name: str = "tiny",
    aborting: bool = False,
    ends_at_once: bool = False,
    arch: str = "llama",
    mtp_layers: int = 0,
    bigram: bool = False,
    mtp_noise: float = 0.0,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write a tiny random model to `path` (a .gguf file) and return `path`.

    ``metadata``: more string keys for the header (``general.license``, ...).

    ``arch``: "llama", or a recurrent or hybrid architecture of RECURRENT_ARCHS.

    ``ends_at_once``: every next token is an end-of-generation token, by construction: the final norm keeps
    one hidden dimension, the eos row reads it and the eot row its negative, every other logit is 0.

    ``mtp_layers``: multi-token-prediction (NextN) blocks after the trunk, as Qwen3.5 ships them (qwen35 only):
    block_count counts them too, ``{arch}.nextn_predict_layers`` says how many there are.

    ``bigram``: the trunk's layers add nothing to the residual stream (their output projections are zero), so
    the next token depends on the last token alone; its MTP blocks then read the token embedding alone and add
    nothing either, so they predict what the target predicts after that token, by construction: the target's
    next token after a draft token is the MTP head's. ``mtp_noise`` adds that much relative noise to their
    input projection (drafts that agree often, not always).
    """
    from gguf import GGUFWriter, LlamaFileType

    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head a multiple of n_head_kv")
    if perturb < 0:
        raise ValueError("perturb must be >= 0")
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHS)}")
    if mtp_layers and arch != "qwen35":
        raise ValueError("MTP blocks are written for the qwen35 architecture only")
    voc = _vocab(vocab)
    shape = {"n_embd": n_embd, "n_layer": n_layer, "n_head": n_head, "n_head_kv": n_head_kv, "n_ff": n_ff}
    if arch == "llama":
        weights = _weights(voc, seed=seed, **shape)
    else:
        weights = _recurrent_weights(arch, voc, seed=seed, **shape)
    for i in range(mtp_layers):
        weights.update(_mtp_block_weights(n_layer + i, seed=seed + 1000 + i, n_embd=n_embd, n_head=n_head,
                                          n_head_kv=n_head_kv, n_ff=n_ff))
    if bigram:
        _make_bigram(weights, n_layer=n_layer, mtp_layers=mtp_layers, n_embd=n_embd, noise=mtp_noise, seed=seed)
    if perturb > 0:
        _perturb(weights, perturb, perturb_seed)
    if ends_at_once:
        norm = np.zeros(n_embd, dtype=np.float32)
        norm[0] = 1.0
        out = np.zeros((len(voc.tokens), n_embd), dtype=np.float32)
        out[voc.eos_id, 0] = 100.0
        out[voc.eot_id if voc.eot_id is not None else voc.eos_id, 0] = -100.0
        weights["token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight"] = norm
        weights["output.weight"] = out

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    for key, value in (metadata or {}).items():
        writer.add_string(key, value)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer + mtp_layers)
    if mtp_layers:
        writer.add_nextn_predict_layers(mtp_layers)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(voc.tokens))
    if arch == "llama":
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(n_embd // n_head)
        writer.add_rope_freq_base(10000.0)
    else:
        _add_recurrent_keys(writer, arch, **shape)

    _add_vocab(writer, voc, chat_template)

    for tensor_name, tensor in weights.items():
        assert tensor.dtype == np.float32, tensor_name
        if aborting and tensor_name == "token_embd.weight":
            tensor = tensor.astype(np.float64)
        writer.add_tensor(tensor_name, tensor)
    save(writer)
    return path


def _add_vocab(writer: Any, voc: _Vocab, chat_template: str | None) -> None:
    writer.add_tokenizer_model(voc.model)
    writer.add_tokenizer_pre(voc.pre)
    writer.add_token_list(voc.tokens)
    writer.add_token_types(voc.token_types)
    writer.add_token_merges(voc.merges)
    writer.add_bos_token_id(voc.bos_id)
    writer.add_eos_token_id(voc.eos_id)
    if voc.eot_id is not None:
        writer.add_eot_token_id(voc.eot_id)
    if voc.unk_id is not None:
        writer.add_unk_token_id(voc.unk_id)
    if voc.pad_id is not None:
        writer.add_pad_token_id(voc.pad_id)
    writer.add_add_bos_token(voc.add_bos)
    writer.add_add_eos_token(voc.add_eos)
    writer.add_add_space_prefix(voc.add_space_prefix)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


EAGLE3_SHAPE = {"n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128}


def write_eagle3_drafter(
    path: Path,
    *,
    target_layers: tuple[int, int, int] = (1, 2, 3),
    target_hidden: int = 64,
    vocab: str = "bytes",
    seed: int = 5,
    name: str = "tiny-eagle3",
) -> Path:
    """A random EAGLE-3 drafter (src/models/eagle3.cpp): one decoder layer reading the token embedding beside
    ``fc`` of three target layers' inputs (``target_layers``, each ``target_hidden`` wide). It has no token
    embeddings or output matrix of its own: llama.cpp lends it the target's, so its width is the target's."""

    voc = _vocab(vocab)
    n_embd, n_head, n_head_kv, n_ff = (EAGLE3_SHAPE[k] for k in ("n_embd", "n_head", "n_head_kv", "n_ff"))
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    linear = functools.partial(_linear, rng)

    ones = _ones
    weights = {
        "fc.weight": linear(n_embd, 3 * target_hidden),
        "output_norm.weight": ones(n_embd),
        "blk.0.attn_norm.weight": ones(n_embd),
        "blk.0.attn_norm_2.weight": ones(n_embd),
        "blk.0.attn_q.weight": linear(n_head * head_dim, 2 * n_embd),
        "blk.0.attn_k.weight": linear(n_head_kv * head_dim, 2 * n_embd),
        "blk.0.attn_v.weight": linear(n_head_kv * head_dim, 2 * n_embd),
        "blk.0.attn_output.weight": linear(n_embd, n_head * head_dim),
        "blk.0.ffn_norm.weight": ones(n_embd),
        "blk.0.ffn_gate.weight": linear(n_ff, n_embd),
        "blk.0.ffn_up.weight": linear(n_ff, n_embd),
        "blk.0.ffn_down.weight": linear(n_embd, n_ff),
    }
    writer = _head_writer(Path(path), "eagle3", name=name, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                          n_head_kv=n_head_kv, n_vocab=len(voc.tokens), target_layers=target_layers,
                          target_hidden=target_hidden)
    _add_vocab(writer, voc, None)
    return _save_weights(writer, weights, Path(path))


def write_dflash_drafter(
    path: Path,
    *,
    target_layers: tuple[int, ...] = (1, 3),
    n_embd: int = 64,
    block_size: int = 5,
    dspark: bool = False,
    vocab: str = "bytes",
    seed: int = 7,
    name: str = "tiny-dflash",
) -> Path:
    """A random DFlash block drafter (src/models/dflash.cpp): one non-causal decoder layer over a block
    [last token, <mask> × (block_size − 1)] whose keys and values start with the injected, ``fc``-fused inputs
    of ``target_layers``. No token embeddings or output matrix of its own: it borrows the target's, so its width
    is the target's. ``dspark`` adds the Markov head (``markov_w1/w2``) that makes it a DSpark drafter."""

    voc = _vocab(vocab)
    n_head, n_head_kv, n_ff = 4, 2, 128
    head_dim = n_embd // n_head
    n_vocab = len(voc.tokens)
    rng = np.random.default_rng(seed)

    linear = functools.partial(_linear, rng)

    ones = _ones
    weights = {
        "fc.weight": linear(n_embd, len(target_layers) * n_embd),
        "enc.output_norm.weight": ones(n_embd),
        "output_norm.weight": ones(n_embd),
        "blk.0.attn_norm.weight": ones(n_embd),
        "blk.0.attn_q.weight": linear(n_head * head_dim, n_embd),
        "blk.0.attn_k.weight": linear(n_head_kv * head_dim, n_embd),
        "blk.0.attn_v.weight": linear(n_head_kv * head_dim, n_embd),
        "blk.0.attn_output.weight": linear(n_embd, n_head * head_dim),
        "blk.0.attn_q_norm.weight": ones(head_dim),
        "blk.0.attn_k_norm.weight": ones(head_dim),
        "blk.0.ffn_norm.weight": ones(n_embd),
        "blk.0.ffn_gate.weight": linear(n_ff, n_embd),
        "blk.0.ffn_up.weight": linear(n_ff, n_embd),
        "blk.0.ffn_down.weight": linear(n_embd, n_ff),
    }
    if dspark:
        rank = 8
        weights["markov_w1.weight"] = linear(n_vocab, rank)
        weights["markov_w2.weight"] = linear(n_vocab, rank)
    writer = _head_writer(Path(path), "dflash", name=name, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                          n_head_kv=n_head_kv, n_vocab=n_vocab, target_layers=target_layers, target_hidden=n_embd)
    writer.add_uint32("dflash.block_size", block_size)
    if dspark:
        writer.add_string("dflash.has_confidence_head", "false")
    _add_vocab(writer, voc, None)
    writer.add_mask_token_id(n_vocab - 1)
    return _save_weights(writer, weights, Path(path))


def _linear(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _head_writer(path: Path, arch: str, *, name: str, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                 n_vocab: int, target_layers: tuple[int, ...], target_hidden: int) -> Any:
    """A GGUFWriter holding the keys of a one-block drafter head that reads target layers (EAGLE-3, DFlash)."""
    from gguf import GGUFWriter, LlamaFileType

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_array(f"{arch}.target_layers", list(target_layers))
    writer.add_uint32(f"{arch}.target_hidden_size", target_hidden)
    return writer


def _save_weights(writer: Any, weights: dict[str, np.ndarray], path: Path) -> Path:
    for tensor_name, tensor in weights.items():
        writer.add_tensor(tensor_name, tensor)
    save(writer)
    return path


def write_small_gguf(path: Path, architecture: str, prepare: Callable[[Any], None] | None = None, *,
                     rows: int = 4) -> Path:
    """A GGUF of metadata and one tensor (``token_embd.weight``, rows × 8 zeros), written with the gguf package
    as converters write them: enough for the header readers, not for llama.cpp to run. ``prepare(writer)``
    adds keys first."""
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, architecture)
    if prepare is not None:
        prepare(writer)
    writer.add_tensor("token_embd.weight", np.zeros((rows, 8), dtype=np.float32))
    save(writer)
    return path


def save(writer: Any) -> None:
    """Write a prepared GGUFWriter's header, metadata and tensors to its file, and close it."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


# Targets with one MTP block in the shapes llama.cpp's loaders give them (src/models/glm4-moe.cpp, deepseek2.cpp):
# tiny MoE layers (2 experts, 1 used, 1 shared), attention in GLM-4.5's form or DeepSeek's multi-head latent
# attention (MLA, as GLM-4.7-Flash ships), each followed by ``blk.{n_layer}.nextn.*``.
MTP_FIXTURE_ARCHS = ("glm4moe", "deepseek2")
_N_EXPERT, _N_EXPERT_USED, _N_EXPERT_SHARED = 2, 1, 1
_MLA_Q_LORA, _MLA_KV_LORA, _MLA_ROPE, _MLA_NOPE, _MLA_V = 32, 32, 8, 8, 16


def _moe_ffn(p: str, linear: Callable[..., np.ndarray], *, n_embd: int, n_ff_exp: int) -> dict[str, np.ndarray]:
    """A routed-experts FFN with one shared expert (ggml shapes reversed into numpy's)."""
    def experts(n_out: int, n_in: int) -> np.ndarray:
        return np.stack([linear(n_out, n_in) for _ in range(_N_EXPERT)])

    return {
        p + "ffn_norm.weight": _ones(n_embd),
        p + "ffn_gate_inp.weight": linear(_N_EXPERT, n_embd),
        p + "exp_probs_b.bias": np.zeros(_N_EXPERT, dtype=np.float32),
        p + "ffn_gate_exps.weight": experts(n_ff_exp, n_embd),
        p + "ffn_up_exps.weight": experts(n_ff_exp, n_embd),
        p + "ffn_down_exps.weight": experts(n_embd, n_ff_exp),
        p + "ffn_gate_shexp.weight": linear(n_ff_exp * _N_EXPERT_SHARED, n_embd),
        p + "ffn_up_shexp.weight": linear(n_ff_exp * _N_EXPERT_SHARED, n_embd),
        p + "ffn_down_shexp.weight": linear(n_embd, n_ff_exp * _N_EXPERT_SHARED),
    }


def _nextn(p: str, linear: Callable[..., np.ndarray], n_embd: int) -> dict[str, np.ndarray]:
    return {p + "nextn.eh_proj.weight": linear(n_embd, 2 * n_embd), p + "nextn.enorm.weight": _ones(n_embd),
            p + "nextn.hnorm.weight": _ones(n_embd)}


def _glm4moe_block(p: str, linear: Callable[..., np.ndarray], *, n_embd: int, n_head: int,
                   n_head_kv: int) -> dict[str, np.ndarray]:
    head_dim = n_embd // n_head
    return {
        p + "attn_norm.weight": _ones(n_embd),
        p + "attn_q.weight": linear(n_embd, n_embd),
        p + "attn_k.weight": linear(head_dim * n_head_kv, n_embd),
        p + "attn_v.weight": linear(head_dim * n_head_kv, n_embd),
        p + "attn_output.weight": linear(n_embd, n_embd),
        p + "post_attention_norm.weight": _ones(n_embd),
    }


def _mla_block(p: str, linear: Callable[..., np.ndarray], *, n_embd: int, n_head: int) -> dict[str, np.ndarray]:
    """DeepSeek's multi-head latent attention, split as MLA GGUFs store it (attn_k_b, attn_v_b)."""
    k_b = np.stack([linear(_MLA_KV_LORA, _MLA_NOPE) for _ in range(n_head)])
    v_b = np.stack([linear(_MLA_V, _MLA_KV_LORA) for _ in range(n_head)])
    return {
        p + "attn_norm.weight": _ones(n_embd),
        p + "attn_q_a_norm.weight": _ones(_MLA_Q_LORA),
        p + "attn_kv_a_norm.weight": _ones(_MLA_KV_LORA),
        p + "attn_q_a.weight": linear(_MLA_Q_LORA, n_embd),
        p + "attn_q_b.weight": linear(n_head * (_MLA_NOPE + _MLA_ROPE), _MLA_Q_LORA),
        p + "attn_kv_a_mqa.weight": linear(_MLA_KV_LORA + _MLA_ROPE, n_embd),
        p + "attn_k_b.weight": k_b,
        p + "attn_v_b.weight": v_b,
        p + "attn_output.weight": linear(n_embd, n_head * _MLA_V),
    }


def write_tiny_mtp_target(path: Path, arch: str, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2,
                          n_head: int = 4, n_head_kv: int = 2, n_ff: int = 64, name: str = "tiny-mtp",
                          mtp_layers: int = 1, bigram: bool = False, mtp_noise: float = 0.0) -> Path:
    """A tiny random ``arch`` target (one of MTP_FIXTURE_ARCHS) with ``mtp_layers`` MTP blocks after its trunk,
    in the byte vocabulary; ``mtp_layers=0`` writes the trunk alone. ``bigram`` and ``mtp_noise`` as for
    ``write_tiny_model``: MTP blocks that predict what the target predicts, by construction."""
    from gguf import GGUFWriter, LlamaFileType

    if arch not in MTP_FIXTURE_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(MTP_FIXTURE_ARCHS)}")
    voc = _vocab("bytes")
    n_vocab = len(voc.tokens)
    rng = np.random.default_rng(seed)
    linear = functools.partial(_linear, rng)
    n_total = n_layer + mtp_layers
    w: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32)}
    for il in range(n_total):
        p = f"blk.{il}."
        if arch == "glm4moe":
            w.update(_glm4moe_block(p, linear, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv))
        else:
            w.update(_mla_block(p, linear, n_embd=n_embd, n_head=n_head))
        w.update(_moe_ffn(p, linear, n_embd=n_embd, n_ff_exp=n_ff))
        if arch == "glm4moe":
            del w[p + "ffn_norm.weight"]  # GLM-4.5 norms after attention (post_attention_norm) instead
        if il >= n_layer:
            w.update(_nextn(p, linear, n_embd))
    if bigram:
        _make_bigram(w, n_layer=n_layer, mtp_layers=mtp_layers, n_embd=n_embd, noise=mtp_noise, seed=seed)
    w["output_norm.weight"] = _ones(n_embd)
    w["output.weight"] = (linear(n_vocab, n_embd) * np.float32(_LOGIT_STD) * voc.row_scale[:, None]
                          ).astype(np.float32)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_total)
    if mtp_layers:
        writer.add_nextn_predict_layers(mtp_layers)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_feed_forward_length(n_ff)
    writer.add_expert_feed_forward_length(n_ff)
    writer.add_expert_count(_N_EXPERT)
    writer.add_expert_used_count(_N_EXPERT_USED)
    writer.add_expert_shared_count(_N_EXPERT_SHARED)
    writer.add_leading_dense_block_count(0)
    writer.add_head_count(n_head)
    writer.add_rope_freq_base(10000.0)
    if arch == "glm4moe":
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(n_embd // n_head)
    else:
        writer.add_head_count_kv(1)  # MLA: one latent KV head
        writer.add_q_lora_rank(_MLA_Q_LORA)
        writer.add_kv_lora_rank(_MLA_KV_LORA)
        writer.add_key_length(_MLA_KV_LORA + _MLA_ROPE)
        writer.add_value_length(_MLA_KV_LORA)
        writer.add_key_length_mla(_MLA_NOPE + _MLA_ROPE)
        writer.add_value_length_mla(_MLA_V)
        writer.add_rope_dimension_count(_MLA_ROPE)
    _add_vocab(writer, voc, DEFAULT_TEMPLATE)
    return _save_weights(writer, w, path)
