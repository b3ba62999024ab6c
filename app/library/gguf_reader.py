"""What a GGUF header means to llama.cpp: architecture, shape, quantization, sliding-window layers, the
vocabulary's BOS/EOS and add flags as llama.cpp resolves them, the token fingerprint, and split models.

The bytes are parsed by ``app.library.gguf_format`` (bounded); this module only interprets the values.
Whether a file may be given to llama.cpp at all is ``app.library.model_file``'s check.

Over 500 lines: each architecture's reading of its keys (recurrent state, sliding windows, MTP blocks, MLA)
is written where the shape is put together, so a key and its meaning are read in one place.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from app.library.gguf_format import (
    BOOL_TYPE,
    DEFAULT_ALIGNMENT,
    FINGERPRINT_START,
    GGML_TYPES,
    INT_TYPES,
    MAX_METADATA_STR,
    MAX_TEMPLATE_LEN,
    MAX_VOCAB,
    U64,
    GGUFError,
    Header,
    LimitError,
    MalformedError,
    MissingKeyError,
    _pow2,
    read_header,
    type_name,
)

MAX_SHARDS = 1024  # files of one split model (gguf-split names allow 99999)
# Counts a header may claim, checked before anything is sized from them. llama.cpp aborts the whole process
# (GGML_ASSERT in load_hparams) on more layers than LLAMA_MAX_LAYERS or more experts than LLAMA_MAX_EXPERTS,
# and reads every shape value as a uint32; real models have under 200 layers and 512 experts.
MAX_LAYERS = 512
MAX_EXPERTS = 1024
MAX_U32 = (1 << 32) - 1

# llama_ftype (general.file_type) -> the name llama.cpp prints (llama.h's LLAMA_FTYPE_*, which the tests pin,
# and the retired 4). 1024 (LLAMA_FTYPE_GUESSED) is a flag.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS",
    24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS",
    31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}
_FTYPE_GUESSED = 1024

# SWA period per architecture, as llama.cpp's loaders call set_swa_pattern(period) (layer il uses the
# window when il % period < period - 1). `{arch}.attention.sliding_window_pattern` overrides it.
SWA_PERIOD: dict[str, int] = {
    "gemma2": 2, "gemma3": 6, "gemma3n": 5, "gemma-embedding": 6, "cohere2": 4, "gpt-oss": 2,
    "exaone4": 4, "llama4": 4,
}
# Architectures whose loaders use a default window when the key is absent.
_SWA_DEFAULT_WINDOW: dict[str, int] = {"gemma2": 4096, "llama4": 8192}

# tokenizer.ggml.model -> llama.cpp vocab type name
VOCAB_TYPES: dict[str, str] = {
    "llama": "spm", "gpt2": "bpe", "gemma4": "bpe", "hybriddna": "bpe", "whitespace": "bpe",
    "bert": "wpm", "t5": "ugm", "rwkv": "rwkv", "plamo2": "plamo2", "no_vocab": "none", "none": "none",
}
# BPE pre-tokenizers for which llama.cpp turns add_bos on by default.
_BPE_PRE_ADD_BOS = frozenset(
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
     "jina-v5-nano", "tekken", "chameleon", "gemma4")
)

_SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class GGUFInfo:
    path: str
    file_size: int
    version: int
    kind: str  # "model", "mmproj", "lora", "shard" (a split part other than the first)
    architecture: str
    name: str
    n_params: int  # from tensor shapes
    tensor_bytes: int  # bytes of all tensor data in this file (all shards for a split model)
    file_type: int | None  # general.file_type
    quantization: str  # e.g. "Q4_K_M", "Q4_1", "F16", or the dominant tensor type
    context_length: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int  # {arch}.attention.key_length, else n_embd / n_head
    head_dim_v: int  # {arch}.attention.value_length, else n_embd / n_head
    sliding_window: int  # 0 = none
    swa_layers: tuple[bool, ...]  # per layer: uses the sliding window (all False when none)
    vocab_type: str  # tokenizer.ggml.model: "gpt2", "llama", ...
    n_vocab: int
    bos_id: int | None  # as llama.cpp resolves it: defaults per tokenizer, out-of-range ids ignored
    eos_id: int | None
    add_bos: bool | None  # as llama.cpp resolves it; None when the file has no tokenizer
    add_eos: bool | None
    token_fingerprint: str  # sha256 over the token texts from id 5 on ("" when there are none)
    has_chat_template: bool
    chat_template: str | None
    split_count: int = 1
    split_index: int = 0
    missing_shards: tuple[str, ...] = ()
    metadata: dict[str, object] = field(default_factory=dict)  # scalar keys only, strings capped
    tokenizer_pre: str = ""
    n_tensors: int = 0
    data_offset: int = 0  # where tensor data starts in this file
    alignment: int = DEFAULT_ALIGNMENT
    # Recurrent and hybrid models (Mamba, RWKV, LFM2, Granite-4-H, Qwen3.5, ...): which layers keep an
    # attention KV cache (empty: all of them), and the recurrent state's f32 elements per recurrent layer
    # (llama.cpp's n_embd_r + n_embd_s), whatever the context length.
    kv_layers: tuple[bool, ...] = ()
    recurrent_layers: int = 0
    recurrent_state_floats: int = 0
    # Multi-token-prediction (NextN) blocks after the trunk ({arch}.nextn_predict_layers): ``n_layer`` counts
    # them too, as block_count does; the target's own context keeps no KV for them (an MTP context does).
    mtp_layers: int = 0
    # Multi-head latent attention ({arch}.attention.key_length_mla and value_length_mla): llama.cpp keeps no V
    # cache, V being read from the K cache's latent (llama-kv-cache.cpp, has_v = !is_mla).
    mla: bool = False

    @property
    def recurrent_state_bytes(self) -> int:
        """One sequence's recurrent state, as llama.cpp allocates it (f32 cells)."""
        return self.recurrent_layers * self.recurrent_state_floats * 4


# --- interpretation -------------------------------------------------------------------------------


def _int_value(h: Header, key: str, name: str) -> int | None:
    if key in h.kv:
        v = h.kv[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise MalformedError(f"{name} is corrupt: {key} should be an integer, not {v!r}.")
        return v
    arr = h.arrays.get(key)
    if arr is not None and arr.values is not None and arr.elem_type in INT_TYPES and arr.values:
        return int(max(arr.values))  # per-layer values: the largest bounds the KV cache
    return None


def _str_value(h: Header, key: str) -> str | None:
    v = h.kv.get(key)
    return v if isinstance(v, str) else None


def _bool_value(h: Header, key: str) -> bool | None:
    v = h.kv.get(key)
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v != 0
    return None


def _count(h: Header, key: str, name: str, default: int = 0) -> int:
    """A count or size from the header (``default`` when absent or negative), refused past a uint32."""
    v = _int_value(h, key, name)
    if v is None or v < 0:
        return default
    if v > MAX_U32:
        raise MalformedError(f"{name} is corrupt: {key} is {v:,}{_pow2(v)}, more than the 32 bits llama.cpp "
                             "reads it as.")
    return v


def _check_counts(h: Header, arch: str, kind: str, name: str) -> int:
    """The layer count, once it and the expert and vocabulary counts are ones llama.cpp can load (it aborts on
    most others): checked before any per-layer table is built from them."""
    n_layer = max(_int_value(h, f"{arch}.block_count", name) or 0, 0)
    if n_layer > MAX_LAYERS:
        raise MalformedError(f"{name} is corrupt: it claims {n_layer:,} layers{_pow2(n_layer)}; llama.cpp loads "
                             f"at most {MAX_LAYERS}.")
    n_vocab = _count(h, f"{arch}.vocab_size", name)
    if n_vocab > MAX_VOCAB:
        raise MalformedError(f"{name} is corrupt: it claims a vocabulary of {n_vocab:,} tokens{_pow2(n_vocab)}; "
                             f"at most {MAX_VOCAB:,} are allowed.")
    n_expert = _count(h, f"{arch}.expert_count", name)
    n_used = _count(h, f"{arch}.expert_used_count", name)
    if n_expert > MAX_EXPERTS:
        raise MalformedError(f"{name} is corrupt: it claims {n_expert:,} experts{_pow2(n_expert)}; llama.cpp "
                             f"loads at most {MAX_EXPERTS:,}.")
    if kind == "model" and (n_used > n_expert or (n_expert > 0 and n_used == 0)):
        raise MalformedError(f"{name} is corrupt: it routes each token to {n_used:,} of its {n_expert:,} "
                             "experts, which llama.cpp cannot load.")
    return n_layer


def _swa_layers(h: Header, arch: str, n_layer: int, window: int, name: str) -> tuple[bool, ...]:
    if window <= 0 or n_layer <= 0:
        return (False,) * max(n_layer, 0)
    key = f"{arch}.attention.sliding_window_pattern"
    arr = h.arrays.get(key)
    if arr is not None and arr.values is not None and len(arr.values) == n_layer \
            and arr.elem_type in (*INT_TYPES, BOOL_TYPE):
        return tuple(bool(v) for v in arr.values)
    period = _int_value(h, key, name) if key in h.kv else SWA_PERIOD.get(arch)
    if period is None:
        return (True,) * n_layer  # a window and no known pattern: every layer uses it
    if period == 0:
        return (True,) * n_layer
    return tuple(il % period < period - 1 for il in range(n_layer))


# Architectures whose every layer is recurrent (no attention KV cache at all).
RECURRENT_ARCHS = frozenset(("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"))
# Hybrids whose layers are attention every n-th layer ({arch}.full_attention_interval), recurrent otherwise.
INTERVAL_HYBRID_ARCHS = frozenset(("qwen3next", "qwen35", "qwen35moe", "qwen4exp"))
# Hybrids whose every layer has both an attention block and a recurrent (Mamba 2) block.
PARALLEL_HYBRID_ARCHS = frozenset(("falcon-h1",))
# Hybrids with MLP-only layers beside the Mamba 2 and attention ones, told apart by feed_forward_length
# (llama_model_nemotron_h::load_arch_hparams and the hybrid memory's layer filters).
FFN_LAYER_HYBRID_ARCHS = frozenset(("nemotron_h", "nemotron_h_moe"))


def _layer_kinds(h: Header, arch: str, n_layer: int, name: str) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """(has an attention KV cache, is recurrent) per layer, as llama.cpp's per-architecture loaders decide."""
    attention = (True,) * n_layer
    if arch in RECURRENT_ARCHS:
        return (False,) * n_layer, (True,) * n_layer
    if arch in PARALLEL_HYBRID_ARCHS:
        return attention, (True,) * n_layer
    if arch in INTERVAL_HYBRID_ARCHS:
        interval = _int_value(h, f"{arch}.full_attention_interval", name) or 4
        attention = tuple((il + 1) % interval == 0 for il in range(n_layer))
        return attention, tuple(not a for a in attention)
    # Hybrids such as LFM2, Granite-4-H, Nemotron-H and Jamba: a layer is recurrent where it has no KV heads.
    recurrent_keys = (f"{arch}.ssm.state_size", f"{arch}.shortconv.l_cache")
    kv_key = f"{arch}.attention.head_count_kv"
    kv_heads = _per_layer(h, kv_key, n_layer) if kv_key in h.arrays else None
    if kv_heads is None or not any(key in h.kv for key in recurrent_keys):
        return attention, (False,) * n_layer
    if arch in FFN_LAYER_HYBRID_ARCHS:
        # Nemotron-H: a layer with a feed-forward length is MLP-only, with neither a KV cache nor a state.
        ff = _per_layer(h, f"{arch}.feed_forward_length", n_layer) or (0,) * n_layer
        return (tuple(kv > 0 and f == 0 for kv, f in zip(kv_heads, ff, strict=True)),
                tuple(kv == 0 and f == 0 for kv, f in zip(kv_heads, ff, strict=True)))
    attention = tuple(kv > 0 for kv in kv_heads)
    return attention, tuple(not a for a in attention)


def _per_layer(h: Header, key: str, n_layer: int) -> tuple[int, ...] | None:
    """The trunk's ``n_layer`` values of a per-layer key, from an array (llama.cpp's get_key_or_arr: one value
    per block, MTP blocks last) or a scalar for every layer; None when absent or not integers."""
    arr = h.arrays.get(key)
    if arr is not None:
        if arr.values is None or arr.elem_type not in INT_TYPES or len(arr.values) < n_layer:
            return None
        return tuple(int(v) for v in arr.values[:n_layer])
    v = h.kv.get(key)
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,) * n_layer
    return None


def _recurrent_state_floats(h: Header, arch: str, n_embd: int, name: str) -> int:
    """f32 elements of one recurrent layer's state: llama_hparams::n_embd_r() + n_embd_s()."""
    def hp(key: str) -> int:
        return _count(h, f"{arch}.{key}", name)

    head_size = hp("wkv.head_size")
    if head_size:  # RWKV: token shifts and the WKV state
        shifts = hp("token_shift_count") or 2
        return shifts * n_embd + n_embd * head_size
    l_cache = hp("shortconv.l_cache")
    if l_cache:  # LFM2: the short convolution's last l_cache - 1 inputs
        return n_embd * (l_cache - 1)
    d_conv, d_inner, d_state = hp("ssm.conv_kernel"), hp("ssm.inner_size"), hp("ssm.state_size")
    n_group = hp("ssm.group_count")
    conv = (d_conv - 1) * (d_inner + 2 * n_group * d_state) if d_conv else 0
    return conv + d_state * d_inner


def _resolve_vocab(
    h: Header, n_vocab: int,
) -> tuple[int | None, int | None, bool | None, bool | None]:
    """BOS/EOS ids and add flags as llama.cpp's vocab loader resolves them (llama-vocab.cpp)."""
    model = _str_value(h, "tokenizer.ggml.model")
    if model is None:
        return None, None, None, None
    vtype = VOCAB_TYPES.get(model, "")
    pre = _str_value(h, "tokenizer.ggml.pre") or ""
    bos: int | None
    eos: int | None
    bos, eos, add_bos, add_eos = {
        "spm": (1, 2, True, False),
        "wpm": (101, None, True, False),
        "bpe": (11, 11, False, False),
        "ugm": (None, 1, False, True),
        "rwkv": (None, None, False, False),
        "plamo2": (1, 2, False, False),
    }.get(vtype, (None, None, False, False))
    if model == "gemma4":
        bos = eos = None
    if vtype == "bpe" and pre in _BPE_PRE_ADD_BOS:
        add_bos = True
    if vtype == "bpe" and pre in ("glm4", "chatglm-bpe"):
        bos = None

    def pick(key: str, default: int | None) -> int | None:
        if default is not None and default >= n_vocab:
            default = None  # llama.cpp disables a default id outside the vocabulary
        v = h.kv.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n_vocab:
            return v
        return default

    bos = pick("tokenizer.ggml.bos_token_id", bos)
    eos = pick("tokenizer.ggml.eos_token_id", eos)
    flag = _bool_value(h, "tokenizer.ggml.add_bos_token")
    add_bos = add_bos if flag is None else flag
    flag = _bool_value(h, "tokenizer.ggml.add_eos_token")
    add_eos = add_eos if flag is None else flag
    if pre == "gemma4" or model == "gemma4":
        add_bos = True
    return bos, eos, add_bos, add_eos


def fingerprint_texts(texts: list[str] | tuple[str, ...], start: int = FINGERPRINT_START) -> str:
    """The token fingerprint computed from texts (as the engine reads them from a loaded vocab): sha256 of
    each text from id `start` on as a little-endian u64 byte length and its UTF-8 bytes, the same bytes a
    GGUF stores. Texts read with surrogateescape round-trip to the file's bytes."""
    h = hashlib.sha256()
    for text in texts[start:]:
        data = text.encode("utf-8", errors="surrogateescape")
        h.update(U64.pack(len(data)))
        h.update(data)
    return h.hexdigest() if len(texts) > start else ""


def shard_siblings(path: str | Path, count: int) -> list[Path] | None:
    """The paths of all shards of a split model named like llama.cpp's gguf-split output
    (`name-00001-of-00003.gguf`), or None when the name does not follow that pattern."""
    p = Path(path)
    m = _SHARD_NAME.match(p.name)
    if m is None or int(m.group("count")) != count:
        return None
    prefix = m.group("prefix")
    return [p.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Describe a GGUF file from its header without loading it. Raises a GGUFError subclass with a one-line
    reason when the file is not a usable GGUF."""
    return _info(Path(path), follow_shards=True)


def _info(path: Path, follow_shards: bool) -> GGUFInfo:
    h, size = read_header(path, collect_tokens=False)
    try:
        return _interpret(h, path, size, follow_shards)
    except GGUFError as exc:
        exc.path = str(path)
        raise


def _interpret(h: Header, path: Path, size: int, follow_shards: bool) -> GGUFInfo:
    name = path.name
    split_count = _int_value(h, "split.count", name) or 1
    split_index = _int_value(h, "split.no", name) or 0
    if split_count < 1 or not 0 <= split_index < split_count:
        raise MalformedError(f"{name} is corrupt: it says it is shard {split_index + 1} of {split_count}.")
    if split_count > MAX_SHARDS:
        raise LimitError(f"{name} is corrupt: it says the model is split into {split_count:,} files; at most "
                         f"{MAX_SHARDS:,} are allowed.")
    general_type = _str_value(h, "general.type") or ""
    arch = _str_value(h, "general.architecture")
    if split_index > 0:
        kind = "shard"
    elif general_type == "mmproj" or arch == "clip":
        kind = "mmproj"
    elif general_type == "adapter" or _str_value(h, "adapter.type") is not None:
        kind = "lora"
    else:
        kind = "model"
    if arch is None:
        if "general.architecture" in h.kv or "general.architecture" in h.arrays:
            raise MalformedError(f"{name} is corrupt: general.architecture is not a string.")
        if kind != "shard":
            raise MissingKeyError(f"{name} has no general.architecture key, so llama.cpp cannot load it as a "
                                  "model.")
        arch = ""

    def hp(key: str, default: int = 0) -> int:
        return _count(h, f"{arch}.{key}", name, default)

    n_layer = _check_counts(h, arch, kind, name)
    mtp_layers = hp("nextn_predict_layers")
    if mtp_layers > n_layer:
        raise MalformedError(f"{name} is corrupt: it claims {mtp_layers} MTP layers of {n_layer} in all.")
    n_embd = hp("embedding_length")
    n_head = hp("attention.head_count")
    n_head_kv = hp("attention.head_count_kv", n_head)
    kv_layers, recurrent = _layer_kinds(h, arch, n_layer - mtp_layers, name)
    kv_layers += (False,) * mtp_layers  # the MTP blocks' KV lives in the MTP context only
    recurrent += (False,) * mtp_layers
    n_recurrent = sum(recurrent)
    state_floats = _recurrent_state_floats(h, arch, n_embd, name) if n_recurrent else 0
    per_head = n_embd // n_head if n_head else 0
    head_dim_k = hp("attention.key_length", per_head)
    head_dim_v = hp("attention.value_length", per_head)
    mla = bool(hp("attention.key_length_mla", 0)) and bool(hp("attention.value_length_mla", 0))
    window = hp("attention.sliding_window", _SWA_DEFAULT_WINDOW.get(arch, 0))
    swa = _swa_layers(h, arch, n_layer, window, name)

    tokens = h.arrays.get("tokenizer.ggml.tokens")
    strings = tokens.strings if tokens is not None else None
    if tokens is not None and strings is None:
        raise MalformedError(f"{name} is corrupt: tokenizer.ggml.tokens is an array of "
                             f"{type_name(tokens.elem_type)}, not of strings.")
    n_vocab = strings.count if strings is not None else hp("vocab_size")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        arr = h.arrays.get(key)
        if strings is not None and arr is not None and arr.count < strings.count:
            raise MalformedError(f"{name} is corrupt: {key} has {arr.count:,} entries for {strings.count:,} "
                                 "tokens.")
    vocab_model = _str_value(h, "tokenizer.ggml.model") or ""
    if strings is None and vocab_model not in ("", "none", "no_vocab") and kind == "model":
        raise MalformedError(f"{name} names the tokenizer {vocab_model!r} but has no token list "
                             "(tokenizer.ggml.tokens).")
    bos, eos, add_bos, add_eos = _resolve_vocab(h, n_vocab)

    fingerprint = strings.fingerprint if strings is not None else ""

    file_type = _int_value(h, "general.file_type", name)
    quant = _quant_name(file_type, h)
    template = _str_value(h, "tokenizer.chat_template")
    template_kept = template if template is not None and h.str_len.get("tokenizer.chat_template", 0) <= \
        MAX_TEMPLATE_LEN else None

    n_params = h.n_params
    tensor_bytes = h.tensor_bytes
    missing: tuple[str, ...] = ()
    if split_count > 1 and follow_shards and split_index == 0:
        siblings = shard_siblings(path, split_count)
        if siblings is None:
            later = "shard 2" if split_count == 2 else f"shards 2 to {split_count}"
            missing = (f"{later} of {split_count} (the file name does not say where to find them)",)
        else:
            lost = []
            for sib in siblings[1:]:
                try:
                    part = _info(sib, follow_shards=False)
                except GGUFError:
                    lost.append(str(sib))
                    continue
                n_params += part.n_params
                tensor_bytes += part.tensor_bytes
            missing = tuple(lost)

    metadata: dict[str, object] = {}
    for key, value in h.kv.items():
        if key.startswith("tokenizer.chat_template"):
            continue
        if isinstance(value, str) and h.str_len.get(key, 0) > MAX_METADATA_STR:
            value += "…"  # cut when read
        metadata[key] = value

    return GGUFInfo(
        path=str(path), file_size=size, version=h.version, kind=kind, architecture=arch,
        name=(_str_value(h, "general.name") or "")[:MAX_METADATA_STR] or path.stem,
        n_params=n_params, tensor_bytes=tensor_bytes, file_type=file_type, quantization=quant,
        context_length=hp("context_length"), n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=n_head_kv, head_dim_k=head_dim_k, head_dim_v=head_dim_v, mla=mla, sliding_window=window,
        swa_layers=swa, vocab_type=vocab_model, n_vocab=n_vocab, bos_id=bos, eos_id=eos, add_bos=add_bos,
        add_eos=add_eos, token_fingerprint=fingerprint,
        has_chat_template=template is not None, chat_template=template_kept,
        split_count=split_count, split_index=split_index, missing_shards=missing, metadata=metadata,
        tokenizer_pre=_str_value(h, "tokenizer.ggml.pre") or "", n_tensors=len(h.tensors),
        data_offset=h.data_offset, alignment=h.alignment,
        kv_layers=kv_layers if not all(kv_layers) else (), recurrent_layers=n_recurrent,
        recurrent_state_floats=state_floats, mtp_layers=mtp_layers,
    )


def _quant_name(file_type: int | None, h: Header) -> str:
    if file_type is not None:
        base = FILE_TYPES.get(file_type & ~_FTYPE_GUESSED)
        if base is not None:
            return base
    # The dominant type among weight matrices (1-D norms and biases are F32 in every file).
    weights: dict[int, int] = {}
    for _, dims, ttype, _ in h.tensors:
        if len(dims) >= 2:
            count = 1
            for d in dims:
                count *= d
            weights[ttype] = weights.get(ttype, 0) + count
    pool = weights or h.bytes_by_type
    if not pool:
        return ""
    return GGML_TYPES[max(pool, key=lambda t: pool[t])][0]


def _token_texts_from(path: Path) -> list[str]:
    h, _ = read_header(path, collect_tokens=True)
    tokens = h.arrays.get("tokenizer.ggml.tokens")
    if tokens is None or tokens.strings is None or tokens.strings.items is None:
        return []
    return tokens.strings.items


def read_token_texts(path: str | Path) -> list[str]:
    """The token texts of a GGUF's vocabulary, as llama.cpp's llama_vocab_get_text returns them (invalid
    UTF-8 kept through surrogateescape, empty texts renamed "[EMPTY_i]"); [] when it has no tokenizer.
    Bounded like read_gguf_info (at most MAX_ARRAY_LEN texts of MAX_STRING_LEN bytes, and never more than
    the file holds)."""
    p = Path(path)
    try:
        return _token_texts_from(p)
    except GGUFError as exc:
        exc.path = str(p)
        raise
