"""A bounded GGUF header reader.

Every count, length and offset is checked against a cap and against the file size before it is read, so
no file can make it hang, exhaust memory or crash. llama.cpp never sees a file this reader refused.
(`gguf`'s GGUFReader does not bound sizes: a crafted file of a few dozen bytes hangs it.)

Only the metadata and tensor-info region is read, with buffered reads; tensor data never is. Files are not
memory-mapped: a file truncated while mapped (a download in progress) would kill the process with SIGBUS.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from app.errors import ModelFileError


class GGUFError(ModelFileError):
    """Base of the reader's typed errors; the message is one sentence saying what is wrong."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class NotGGUFError(GGUFError):
    """The file is not a GGUF at all (empty, another format, text)."""


class TruncatedError(GGUFError):
    """The file ends before what its header says it holds."""


class UnsupportedVersionError(GGUFError):
    """A GGUF version this reader (and llama.cpp) does not read: 1, a future one, or big-endian."""


class LimitError(GGUFError):
    """A count or length beyond the reader's caps (a crafted or corrupt header)."""


class MalformedError(GGUFError):
    """The header is structurally wrong: unknown value type, bad alignment, duplicate key, bad tensor..."""


class MissingKeyError(MalformedError):
    """A key llama.cpp needs (general.architecture) is missing."""


class MissingShardError(GGUFError):
    """A split model's sibling shard is missing or unreadable."""


class UnreadableError(GGUFError):
    """The file does not exist, is a folder, or the OS refused to read it."""


# --- caps -----------------------------------------------------------------------------------------
# Far above any real model (tens of keys, a few thousand tensors, vocabularies of ~260k tokens), far below
# what would take seconds or gigabytes to walk in Python.
MAX_KV = 1 << 14
MAX_TENSORS = 1 << 16
MAX_KEY_LEN = 1 << 10  # real keys are under 100 bytes; gguf.cpp allows longer, but nobody writes them
MAX_STRING_LEN = 1 << 24
MAX_ARRAY_LEN = 1 << 24
MAX_STRING_ELEMENTS = 1 << 22  # string-array elements walked in one file, all arrays together (~0.4 s)
MAX_VOCAB = 1 << 20  # tokens; real vocabularies have up to ~260k
MAX_EMPTY_TOKENS = 4096  # empty token texts (llama.cpp renames each; real vocabularies have a handful)
MAX_SHARDS = 1024  # files of one split model (gguf-split names allow 99999)
MAX_TEMPLATE_LEN = 1 << 20  # a chat template longer than this is reported present but not kept
MAX_METADATA_STR = 1024  # bytes of a string value kept (GGUFInfo.metadata, general.name)
SMALL_ARRAY = 4096  # numeric arrays up to this length are decoded (per-layer values)...
MAX_DECODED = 1 << 16  # ...until this many elements are decoded in one file (a few MB at most)
GGML_MAX_NAME = 64
GGML_MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1
DEFAULT_ALIGNMENT = 32
FINGERPRINT_START = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
_CHUNK = 1 << 20

# GGUF value types: id -> (name, fixed size or 0 for string/array, struct code)
_T_STRING = 8
_T_ARRAY = 9
_VALUE_TYPES: dict[int, tuple[str, int, str]] = {
    0: ("uint8", 1, "<B"),
    1: ("int8", 1, "<b"),
    2: ("uint16", 2, "<H"),
    3: ("int16", 2, "<h"),
    4: ("uint32", 4, "<I"),
    5: ("int32", 4, "<i"),
    6: ("float32", 4, "<f"),
    7: ("bool", 1, "<B"),
    8: ("string", 0, ""),
    9: ("array", 0, ""),
    10: ("uint64", 8, "<Q"),
    11: ("int64", 8, "<q"),
    12: ("float64", 8, "<d"),
}
_INT_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
_BOOL = 7

# ggml tensor types: id -> (name, block size, bytes per block). Ids 4, 5 and 31..33, 36..38 were removed.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

# llama_ftype (general.file_type) -> the name llama.cpp prints. 1024 (LLAMA_FTYPE_GUESSED) is a flag.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS",
    24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS",
    31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
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

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


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


# --- low-level bounded reader ---------------------------------------------------------------------


def _pow2(n: int) -> str:
    """ " (2^k)" when n is an exact power of two above 2^20, so crafted counts read at a glance."""
    return f" (2^{n.bit_length() - 1})" if n > (1 << 20) and n & (n - 1) == 0 else ""


class _Reader:
    """Buffered reads of a file with every request checked against the file size first."""

    def __init__(self, f: BinaryIO, size: int, name: str) -> None:
        self.f = f
        self.size = size
        self.name = name
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.pos = 0  # index into buf

    def tell(self) -> int:
        return self.base + self.pos

    def truncated(self, needed: int, what: str) -> TruncatedError:
        return TruncatedError(
            f"{self.name} is truncated at byte {self.size:,} of {needed:,} (while reading {what}); "
            "the download or copy is probably incomplete.",
        )

    def need(self, n: int, what: str) -> None:
        """Make n bytes available at pos, or raise TruncatedError when the file is too short."""
        if self.pos + n <= len(self.buf):
            return
        start = self.tell()
        end = start + n
        if end > self.size:
            raise self.truncated(end, what)
        want = min(max(n, _CHUNK), self.size - start)
        self.f.seek(start)
        data = self.f.read(want)
        if len(data) < n:  # the file shrank since it was measured
            raise self.truncated(end, what)
        self.buf = data
        self.base = start
        self.pos = 0

    def skip(self, n: int, what: str) -> None:
        end = self.tell() + n
        if end > self.size:
            raise self.truncated(end, what)
        if self.pos + n <= len(self.buf):
            self.pos += n
        else:
            self.buf = b""
            self.base = end
            self.pos = 0

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def scalar(self, vtype: int, what: str) -> int | float | bool:
        _, size, code = _VALUE_TYPES[vtype]
        self.need(size, what)
        (v,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += size
        if vtype == _BOOL:
            return bool(v)
        return v  # type: ignore[no-any-return]

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def string_len(self, what: str, cap: int = MAX_STRING_LEN) -> int:
        n = self.u64(what)
        if n > cap:
            raise LimitError(
                f"{self.name} is corrupt: {what} claims a length of {n:,} bytes{_pow2(n)}; "
                f"the limit is {cap:,}.",
            )
        return n

    def string(self, what: str, keep: int = MAX_STRING_LEN) -> tuple[bytes, int]:
        """(the first `keep` bytes of the string, its full length); the rest is skipped, not read."""
        n = self.string_len(what)
        if n <= keep:
            return self.take(n, what), n
        head = self.take(keep, what)
        self.skip(n - keep, what)
        return head, n

    def hash_tokens(self, start: int, end: int, empty: list[tuple[int, int]]) -> str:
        """The token fingerprint straight from the file: the raw length-prefixed texts in [start, end) are
        exactly what fingerprint_texts hashes, except each empty text, hashed under llama.cpp's new name.
        (The range was bounds-checked by the walk.)"""
        h = hashlib.sha256()
        cur = start
        for token_id, offset in [*empty, (-1, end)]:
            self.f.seek(cur)
            left = offset - cur
            while left > 0:
                block = self.f.read(min(left, _CHUNK))
                if not block:
                    raise self.truncated(end, "the token list")
                h.update(block)
                left -= len(block)
            if token_id >= 0:
                name = _decode_token(b"", token_id).encode()
                h.update(_U64.pack(len(name)) + name)
            cur = offset + 8
        return h.hexdigest()


@dataclass
class _StringArray:
    count: int
    start: int  # file offset of the first element
    fp_start: int  # file offset of element FINGERPRINT_START (== end when shorter)
    end: int
    empty: list[tuple[int, int]]  # (id, file offset) of empty texts from id 5 on: llama.cpp renames them
    items: list[str] | None  # the decoded texts, when collected
    fingerprint: str = ""


@dataclass
class _Array:
    elem_type: int
    count: int
    values: tuple[int | float | bool, ...] | None  # small numeric arrays only
    strings: _StringArray | None = None


@dataclass
class _Header:
    version: int
    kv: dict[str, int | float | bool | str]
    str_len: dict[str, int]  # full length of each string value (kv holds a capped prefix)
    arrays: dict[str, _Array]
    tensors: list[tuple[str, tuple[int, ...], int, int]]  # name, dims, ggml type, offset
    alignment: int
    data_offset: int
    data_size: int  # bytes the tensors need after data_offset (last tensor unpadded)
    tensor_bytes: int
    n_params: int
    bytes_by_type: dict[int, int]


def _type_name(vtype: int) -> str:
    return _VALUE_TYPES[vtype][0] if vtype in _VALUE_TYPES else f"type {vtype}"


def _parse(r: _Reader, *, collect_tokens: bool) -> _Header:
    name = r.name
    if r.size == 0:
        raise NotGGUFError(f"{name} is empty (0 bytes), not a GGUF model.")
    head = r.take(min(r.size, 64), "the file signature")
    if head[:4] != b"GGUF":
        raise NotGGUFError(f"{name} is {_describe_non_gguf(head, r)}, not a GGUF model.")
    r.pos = 4
    version = r.u32("the GGUF version")
    if version == 1:
        raise UnsupportedVersionError(
            f"{name} is a GGUF version 1 file (from before August 2023); llama.cpp reads versions 2 and 3 "
            "only: convert the model again.",
        )
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (2, 3):
            raise UnsupportedVersionError(f"{name} is a big-endian GGUF (version {swapped}); only "
                                          "little-endian files are supported.")
        raise UnsupportedVersionError(
            f"{name} has GGUF version {version:,}; only versions 2 and 3 are supported.",
        )
    n_tensors = r.u64("the tensor count")
    n_kv = r.u64("the metadata count")
    if n_tensors > MAX_TENSORS:
        raise LimitError(f"{name} is corrupt: its header lists {n_tensors:,} tensors{_pow2(n_tensors)}; "
                         f"at most {MAX_TENSORS:,} are allowed.")
    if n_kv > MAX_KV:
        raise LimitError(f"{name} is corrupt: its header lists {n_kv:,} metadata entries{_pow2(n_kv)}; "
                         f"at most {MAX_KV:,} are allowed.")
    # Smallest possible entry: 8 (key length) + 4 (type) + 1 (u8 value); tensor info: 8 + 4 + 8 + 4 + 8.
    least = n_kv * 13 + n_tensors * 32
    if r.tell() + least > r.size:
        raise TruncatedError(
            f"{name} is truncated or corrupt: its header lists {n_kv:,} metadata entries and {n_tensors:,} "
            f"tensors, which need at least {least:,} bytes, but only {r.size - r.tell():,} follow.",
        )

    kv: dict[str, int | float | bool | str] = {}
    str_len: dict[str, int] = {}
    arrays: dict[str, _Array] = {}
    seen: set[str] = set()
    budget = [MAX_STRING_ELEMENTS, MAX_DECODED]
    for i in range(n_kv):
        klen = r.string_len(f"the key of metadata entry {i}", MAX_KEY_LEN)
        raw_key = r.take(klen, f"the key of metadata entry {i}")
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedError(f"{name} is corrupt: the key of metadata entry {i} is not UTF-8.") from None
        if key in seen:
            raise MalformedError(f"{name} is corrupt: the metadata key {key!r} appears twice.")
        seen.add(key)
        what = f"metadata entry {key!r}"
        vtype = r.u32(f"the type of {what}")
        if vtype not in _VALUE_TYPES:
            raise MalformedError(f"{name} is corrupt: {what} has unknown value type {vtype:,}.")
        if vtype == _T_STRING:
            # Only the default template is kept whole; other strings are kept as far as GGUFInfo shows them.
            keep = MAX_TEMPLATE_LEN if key == "tokenizer.chat_template" else MAX_METADATA_STR
            data, full = r.string(what, keep)
            kv[key] = data.decode("utf-8", errors="replace")
            str_len[key] = full
        elif vtype == _T_ARRAY:
            is_tokens = key == "tokenizer.ggml.tokens"
            arrays[key] = _read_array(r, key, collect_tokens and is_tokens, budget)
            strings = arrays[key].strings
            if is_tokens and strings is not None and strings.count > FINGERPRINT_START:
                strings.fingerprint = r.hash_tokens(strings.fp_start, strings.end, strings.empty)
        else:
            kv[key] = r.scalar(vtype, what)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in kv:
        a = kv["general.alignment"]
        if isinstance(a, bool) or not isinstance(a, int) or a <= 0 or a & (a - 1) or a > (1 << 30):
            raise MalformedError(f"{name} is corrupt: general.alignment is {a!r}, not a power of two.")
        alignment = a

    tensors: list[tuple[str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    what = "the tensor infos"  # constant: formatting a label per field would dominate the loop
    for i in range(n_tensors):
        nlen = r.u64(what)
        if nlen >= GGML_MAX_NAME:
            raise MalformedError(f"{name} is corrupt: the name of tensor {i} is {nlen:,} bytes long; "
                                 f"ggml allows at most {GGML_MAX_NAME - 1}.")
        r.need(nlen + 4, what)
        tname = r.buf[r.pos : r.pos + nlen].decode("utf-8", errors="replace")
        (n_dims,) = _U32.unpack_from(r.buf, r.pos + nlen)
        r.pos += nlen + 4
        if tname in names:
            raise MalformedError(f"{name} is corrupt: the tensor name {tname!r} appears twice.")
        names.add(tname)
        if n_dims > GGML_MAX_DIMS:
            raise MalformedError(f"{name} is corrupt: tensor {tname!r} has {n_dims:,} dimensions; "
                                 f"ggml allows at most {GGML_MAX_DIMS}.")
        r.need(8 * n_dims + 12, what)
        dims = struct.unpack_from(f"<{n_dims}QIQ", r.buf, r.pos)
        r.pos += 8 * n_dims + 12
        ttype, offset = int(dims[-2]), int(dims[-1])
        dims = dims[:-2]
        count = 1
        for d in dims:
            if d > INT64_MAX:
                raise MalformedError(f"{name} is corrupt: tensor {tname!r} has a dimension of {d:,}.")
            count *= d
            if count > INT64_MAX:
                raise MalformedError(f"{name} is corrupt: tensor {tname!r} has more than 2^63 elements.")
        if ttype not in GGML_TYPES:
            raise MalformedError(f"{name} has tensor {tname!r} of ggml type {ttype:,}, which SpecDeck does "
                                 "not know (the file is corrupt or newer than this SpecDeck).")
        blck = GGML_TYPES[ttype][1]
        if dims and dims[0] % blck:
            raise MalformedError(f"{name} is corrupt: tensor {tname!r} has rows of {dims[0]:,} elements, "
                                 f"not a multiple of its {GGML_TYPES[ttype][0]} block size {blck}.")
        tensors.append((tname, dims, ttype, offset))

    data_offset = -(-r.tell() // alignment) * alignment
    # gguf.cpp requires each tensor to start where the previous one's padded data ends.
    expected = 0
    data_size = 0
    n_params = 0
    bytes_by_type: dict[int, int] = {}
    for tname, dims, ttype, offset in tensors:
        count = 1
        for d in dims:
            count *= d
        _, blck, tsize = GGML_TYPES[ttype]
        nbytes = count // blck * tsize
        if offset != expected:
            raise MalformedError(f"{name} is corrupt: tensor {tname!r} starts at data offset {offset:,}, "
                                 f"expected {expected:,}.")
        data_size = offset + nbytes
        expected = offset + -(-nbytes // alignment) * alignment
        n_params += count
        bytes_by_type[ttype] = bytes_by_type.get(ttype, 0) + nbytes
    if tensors and data_offset + data_size > r.size:
        raise TruncatedError(
            f"{name} is truncated at byte {r.size:,} of {data_offset + data_size:,} (in its tensor data); "
            "the download or copy is probably incomplete.",
        )
    return _Header(version, kv, str_len, arrays, tensors, alignment, data_offset, data_size,
                   sum(bytes_by_type.values()), n_params, bytes_by_type)


def _read_array(r: _Reader, key: str, collect: bool, budget: list[int]) -> _Array:
    what = f"metadata array {key!r}"
    etype = r.u32(f"the element type of {what}")
    if etype == _T_ARRAY:
        raise MalformedError(f"{r.name} is corrupt: {what} is an array of arrays, which GGUF does not allow.")
    if etype not in _VALUE_TYPES:
        raise MalformedError(f"{r.name} is corrupt: {what} has unknown element type {etype:,}.")
    n = r.u64(f"the length of {what}")
    if n > MAX_ARRAY_LEN:
        raise LimitError(f"{r.name} is corrupt: {what} claims {n:,} elements{_pow2(n)}; "
                         f"at most {MAX_ARRAY_LEN:,} are allowed.")
    if etype == _T_STRING:
        if key == "tokenizer.ggml.tokens" and n > MAX_VOCAB:
            raise LimitError(f"{r.name} is corrupt: its vocabulary claims {n:,} tokens; at most "
                             f"{MAX_VOCAB:,} are allowed.")
        if n > budget[0]:
            raise LimitError(f"{r.name} is corrupt: its string arrays hold more than "
                             f"{MAX_STRING_ELEMENTS:,} elements in all.")
        budget[0] -= n
    size = _VALUE_TYPES[etype][1]
    least = n * (size or 8)
    if r.tell() + least > r.size:
        raise TruncatedError(f"{r.name} is truncated or corrupt: {what} claims {n:,} elements, which need at "
                             f"least {least:,} bytes, but only {r.size - r.tell():,} follow.")
    if etype == _T_STRING:
        return _Array(etype, n, None, _walk_strings(r, n, what, collect))
    if n <= SMALL_ARRAY and n <= budget[1]:
        budget[1] -= n
        code = _VALUE_TYPES[etype][2]
        r.need(n * size, what)
        raw = struct.unpack_from(f"<{n}{code[1]}", r.buf, r.pos)
        r.pos += n * size
        values = tuple(bool(v) for v in raw) if etype == _BOOL else tuple(raw)
        return _Array(etype, n, values)
    r.skip(n * size, what)
    return _Array(etype, n, None)


def _walk_strings(r: _Reader, n: int, what: str, collect: bool) -> _StringArray:
    """Walk n length-prefixed strings. The fast path works on the buffer directly (a 262k-token vocabulary
    is walked in well under 0.1 s); the slow path refills and checks bounds."""
    items: list[str] | None = [] if collect else None
    start = r.tell()
    fp_start = -1
    empty: list[tuple[int, int]] = []
    unpack = _U64.unpack_from
    buf, pos = r.buf, r.pos
    end = len(buf)
    i = 0
    while i < n:
        if i == FINGERPRINT_START:
            fp_start = r.base + pos
        if pos + 8 <= end:
            (ln,) = unpack(buf, pos)
            stop = pos + 8 + ln
            if stop <= end and ln <= MAX_STRING_LEN:
                if items is not None:
                    items.append(_decode_token(buf[pos + 8 : stop], i))
                if ln == 0 and i >= FINGERPRINT_START:
                    _note_empty(r, empty, i, r.base + pos)
                pos = stop
                i += 1
                continue
        r.pos = pos
        at = r.tell()
        ln = r.string_len(f"element {i:,} of {what}")
        if ln == 0 and i >= FINGERPRINT_START:
            _note_empty(r, empty, i, at)
        if items is not None:
            items.append(_decode_token(r.take(ln, f"element {i:,} of {what}"), i))
        else:
            r.skip(ln, f"element {i:,} of {what}")
        buf, pos = r.buf, r.pos
        end = len(buf)
        i += 1
    r.pos = pos
    stop_at = r.tell()
    return _StringArray(n, start, fp_start if fp_start >= 0 else stop_at, stop_at, empty, items)


def _note_empty(r: _Reader, empty: list[tuple[int, int]], token_id: int, offset: int) -> None:
    if len(empty) >= MAX_EMPTY_TOKENS:
        raise LimitError(f"{r.name} is corrupt: more than {MAX_EMPTY_TOKENS:,} of its strings are empty.")
    empty.append((token_id, offset))


def _describe_non_gguf(head: bytes, r: _Reader) -> str:
    """Name what a non-GGUF file most likely is, for the error message."""
    signatures = (
        (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
        (b"PK\x03\x04", "a ZIP archive"), (b"\x1f\x8b", "a gzip archive"), (b"%PDF", "a PDF document"),
        (b"\x7fELF", "a program (ELF)"), (b"MZ", "a Windows program"),
        (b"lmgg", "an old GGML model (from before GGUF; convert it again)"),
        (b"fmgg", "an old GGMF model (from before GGUF; convert it again)"),
        (b"tjgg", "an old GGJT model (from before GGUF; convert it again)"),
    )
    for sig, label in signatures:
        if head.startswith(sig):
            return label
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer (only the pointer was downloaded, not the model)"
    if len(head) >= 9 and head[8:9] == b"{":
        return "a safetensors file (SpecDeck runs GGUF models)"
    if r.size < 4:
        return f"only {r.size} byte{'s' if r.size != 1 else ''} long"
    text = ""
    for cut in range(4):  # the sample may end inside a multi-byte character
        try:
            text = head[: len(head) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    if text and all(c.isprintable() or c in "\r\n\t" for c in text):
        return "a text file"
    return f"an unknown format (it starts with {head[:4].hex(' ')})"


# --- interpretation -------------------------------------------------------------------------------


def _int_value(h: _Header, key: str, name: str) -> int | None:
    if key in h.kv:
        v = h.kv[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise MalformedError(f"{name} is corrupt: {key} should be an integer, not {v!r}.")
        return v
    arr = h.arrays.get(key)
    if arr is not None and arr.values is not None and arr.elem_type in _INT_TYPES and arr.values:
        return int(max(arr.values))  # per-layer values: the largest bounds the KV cache
    return None


def _str_value(h: _Header, key: str) -> str | None:
    v = h.kv.get(key)
    return v if isinstance(v, str) else None


def _bool_value(h: _Header, key: str) -> bool | None:
    v = h.kv.get(key)
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v != 0
    return None


def _swa_layers(h: _Header, arch: str, n_layer: int, window: int, name: str) -> tuple[bool, ...]:
    if window <= 0 or n_layer <= 0:
        return (False,) * max(n_layer, 0)
    key = f"{arch}.attention.sliding_window_pattern"
    arr = h.arrays.get(key)
    if arr is not None and arr.values is not None and len(arr.values) == n_layer \
            and arr.elem_type in (*_INT_TYPES, _BOOL):
        return tuple(bool(v) for v in arr.values)
    period = _int_value(h, key, name) if key in h.kv else SWA_PERIOD.get(arch)
    if period is None:
        return (True,) * n_layer  # a window and no known pattern: every layer uses it
    if period == 0:
        return (True,) * n_layer
    return tuple(il % period < period - 1 for il in range(n_layer))


def _resolve_vocab(
    h: _Header, n_vocab: int,
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
        h.update(_U64.pack(len(data)))
        h.update(data)
    return h.hexdigest() if len(texts) > start else ""


def _decode_token(raw: bytes, i: int) -> str:
    # llama.cpp renames an empty token text so the vocabulary stays unique.
    return raw.decode("utf-8", errors="surrogateescape") if raw else f"[EMPTY_{i}]"


def shard_siblings(path: str | Path, count: int) -> list[Path] | None:
    """The paths of all shards of a split model named like llama.cpp's gguf-split output
    (`name-00001-of-00003.gguf`), or None when the name does not follow that pattern."""
    p = Path(path)
    m = _SHARD_NAME.match(p.name)
    if m is None or int(m.group("count")) != count:
        return None
    prefix = m.group("prefix")
    return [p.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _open(path: Path) -> tuple[BinaryIO, int]:
    name = path.name
    # O_NONBLOCK: opening a FIFO (named pipe) for reading otherwise blocks until a writer appears, forever.
    # It is refused below as not a regular file; on regular files the flag changes nothing.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UnreadableError(f"{name} does not exist (or is a broken link).", str(path)) from None
    except IsADirectoryError:
        raise UnreadableError(f"{path} is a folder, not a GGUF file.", str(path)) from None
    except OSError as exc:
        raise UnreadableError(f"{name} cannot be read: {exc.strerror or exc}.", str(path)) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise UnreadableError(f"{name} cannot be read: {exc.strerror or exc}.", str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise UnreadableError(f"{path} is a folder, not a GGUF file.", str(path))
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnreadableError(f"{name} is not a regular file.", str(path))
    return os.fdopen(fd, "rb"), st.st_size


def _read_header(path: Path, collect_tokens: bool) -> tuple[_Header, int]:
    f, size = _open(path)
    try:
        r = _Reader(f, size, path.name)
        try:
            return _parse(r, collect_tokens=collect_tokens), size
        except GGUFError as exc:
            exc.path = str(path)
            raise
        except OSError as exc:
            raise UnreadableError(f"{path.name} could not be read: {exc.strerror or exc}.", str(path)) \
                from None
    finally:
        f.close()


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Describe a GGUF file from its header without loading it. Raises a GGUFError subclass with a one-line
    reason when the file is not a usable GGUF."""
    return _info(Path(path), follow_shards=True)


def _info(path: Path, follow_shards: bool) -> GGUFInfo:
    h, size = _read_header(path, collect_tokens=False)
    try:
        return _interpret(h, path, size, follow_shards)
    except GGUFError as exc:
        exc.path = str(path)
        raise


def _interpret(h: _Header, path: Path, size: int, follow_shards: bool) -> GGUFInfo:
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
        v = _int_value(h, f"{arch}.{key}", name)
        return default if v is None or v < 0 else v

    n_layer = hp("block_count")
    n_embd = hp("embedding_length")
    n_head = hp("attention.head_count")
    n_head_kv = hp("attention.head_count_kv", n_head)
    per_head = n_embd // n_head if n_head else 0
    head_dim_k = hp("attention.key_length", per_head)
    head_dim_v = hp("attention.value_length", per_head)
    window = hp("attention.sliding_window", _SWA_DEFAULT_WINDOW.get(arch, 0))
    if n_layer > MAX_TENSORS:
        raise LimitError(f"{name} is corrupt: it claims {n_layer:,} layers.")
    swa = _swa_layers(h, arch, n_layer, window, name)

    tokens = h.arrays.get("tokenizer.ggml.tokens")
    strings = tokens.strings if tokens is not None else None
    if tokens is not None and strings is None:
        raise MalformedError(f"{name} is corrupt: tokenizer.ggml.tokens is an array of "
                             f"{_type_name(tokens.elem_type)}, not of strings.")
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
        n_head_kv=n_head_kv, head_dim_k=head_dim_k, head_dim_v=head_dim_v, sliding_window=window,
        swa_layers=swa, vocab_type=vocab_model, n_vocab=n_vocab, bos_id=bos, eos_id=eos, add_bos=add_bos,
        add_eos=add_eos, token_fingerprint=fingerprint,
        has_chat_template=template is not None, chat_template=template_kept,
        split_count=split_count, split_index=split_index, missing_shards=missing, metadata=metadata,
        tokenizer_pre=_str_value(h, "tokenizer.ggml.pre") or "", n_tensors=len(h.tensors),
        data_offset=h.data_offset, alignment=h.alignment,
    )


def _quant_name(file_type: int | None, h: _Header) -> str:
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
    h, _ = _read_header(path, collect_tokens=True)
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
