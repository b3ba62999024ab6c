"""GGUF at the byte level, bounded: the header's metadata and tensor infos walked with every count, length
and offset checked against a cap and against the file size before it is read, so no file can make it hang,
exhaust memory or crash. What the values mean to llama.cpp is ``app.library.gguf_reader``'s job.

Hand-written, not `gguf`'s GGUFReader: that reader loops and allocates for every element a header declares
(a 64-byte file declaring 2^40 one-byte elements had not returned after 300 s), memory-maps the file (SIGBUS
when a download in progress is truncated) and builds numpy arrays per string and number (42 s and 271 s for
the demo models' headers where this walk took 0.2 s and 0.6 s, on a busy machine; benchmarks/gguf_guard.py).
Its type tables are the ggml and llama.cpp that SpecDeck runs, pinned to them by tests/app/test_gguf_reader.py,
not gguf's: gguf 0.19.0 gives Q8_1 blocks 40 bytes (ggml: 36) and lacks Q2_0, and importing it loads numpy,
yaml and its writer, +16 MiB of peak memory in every process that reads a header (benchmarks/gguf_guard.py).

Only the metadata and tensor-info region is read, with buffered reads; tensor data never is. Over 450 lines
because the walk and its bounds are one unit: splitting them would put a check far from the read it guards.
"""

from __future__ import annotations

import hashlib
import math
import os
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
MAX_TOKEN_TEXT_BYTES = 1 << 26  # token texts read into memory from one file (real vocabularies: a few MB)
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

# GGUF value types: id -> (name, fixed size or 0 for string/array, struct code), as gguf's GGUFValueType.
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
INT_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
BOOL_TYPE = 7

# ggml tensor types: id -> (name, block size, bytes per block), as the linked ggml's ggml_type_name,
# ggml_blck_size and ggml_type_size say. Ids 4, 5 and 31..33, 36..38 were removed.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


# --- the bounded reader ---------------------------------------------------------------------


def _pow2(n: int) -> str:
    """ " (2^k)" when n is an exact power of two above 2^20, so crafted counts read at a glance."""
    return f" (2^{n.bit_length() - 1})" if n > (1 << 20) and n & (n - 1) == 0 else ""


class Reader:
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
        (v,) = U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def scalar(self, vtype: int, what: str) -> int | float | bool:
        _, size, code = _VALUE_TYPES[vtype]
        self.need(size, what)
        (v,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += size
        if vtype == BOOL_TYPE:
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
                name = decode_token(b"", token_id).encode()
                h.update(U64.pack(len(name)) + name)
            cur = offset + 8
        return h.hexdigest()


@dataclass
class StringArray:
    count: int
    start: int  # file offset of the first element
    fp_start: int  # file offset of element FINGERPRINT_START (== end when shorter)
    end: int
    empty: list[tuple[int, int]]  # (id, file offset) of empty texts from id 5 on: llama.cpp renames them
    items: list[str] | None  # the decoded texts, when collected
    fingerprint: str = ""


@dataclass
class HeaderArray:
    elem_type: int
    count: int
    values: tuple[int | float | bool, ...] | None  # small numeric arrays only
    strings: StringArray | None = None


@dataclass
class Header:
    version: int
    kv: dict[str, int | float | bool | str]
    str_len: dict[str, int]  # full length of each string value (kv holds a capped prefix)
    arrays: dict[str, HeaderArray]
    tensors: list[tuple[str, tuple[int, ...], int, int]]  # name, dims, ggml type, offset
    alignment: int
    data_offset: int
    data_size: int  # bytes the tensors need after data_offset (last tensor unpadded)
    tensor_bytes: int
    n_params: int
    bytes_by_type: dict[int, int]
    kv_types: dict[str, int] = field(default_factory=dict)  # the value type of each scalar in kv


def type_name(vtype: int) -> str:
    return _VALUE_TYPES[vtype][0] if vtype in _VALUE_TYPES else f"type {vtype}"


def tensor_nbytes(dims: tuple[int, ...], ggml_type: int) -> int:
    """The bytes of a tensor's data (its rows are whole blocks of its type: the walk checks that)."""
    _, block, type_size = GGML_TYPES[ggml_type]
    return math.prod(dims) // block * type_size


def _parse(r: Reader, *, collect_tokens: bool) -> Header:
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
    kv_types: dict[str, int] = {}
    str_len: dict[str, int] = {}
    arrays: dict[str, HeaderArray] = {}
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
            kv_types[key] = vtype
            str_len[key] = full
        elif vtype == _T_ARRAY:
            is_tokens = key == "tokenizer.ggml.tokens"
            arrays[key] = _read_array(r, key, collect_tokens and is_tokens, budget)
            strings = arrays[key].strings
            if is_tokens and strings is not None and strings.count > FINGERPRINT_START:
                strings.fingerprint = r.hash_tokens(strings.fp_start, strings.end, strings.empty)
        else:
            kv[key] = r.scalar(vtype, what)
            kv_types[key] = vtype

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
        (n_dims,) = U32.unpack_from(r.buf, r.pos + nlen)
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
        nbytes = tensor_nbytes(dims, ttype)
        if offset != expected:
            raise MalformedError(f"{name} is corrupt: tensor {tname!r} starts at data offset {offset:,}, "
                                 f"expected {expected:,}.")
        data_size = offset + nbytes
        expected = offset + -(-nbytes // alignment) * alignment
        n_params += math.prod(dims)
        bytes_by_type[ttype] = bytes_by_type.get(ttype, 0) + nbytes
    if tensors and data_offset + data_size > r.size:
        raise TruncatedError(
            f"{name} is truncated at byte {r.size:,} of {data_offset + data_size:,} (in its tensor data); "
            "the download or copy is probably incomplete.",
        )
    return Header(version, kv, str_len, arrays, tensors, alignment, data_offset, data_size,
                   sum(bytes_by_type.values()), n_params, bytes_by_type, kv_types)


def _read_array(r: Reader, key: str, collect: bool, budget: list[int]) -> HeaderArray:
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
        return HeaderArray(etype, n, None, _walk_strings(r, n, what, collect))
    if n <= SMALL_ARRAY and n <= budget[1]:
        budget[1] -= n
        code = _VALUE_TYPES[etype][2]
        r.need(n * size, what)
        raw = struct.unpack_from(f"<{n}{code[1]}", r.buf, r.pos)
        r.pos += n * size
        values = tuple(bool(v) for v in raw) if etype == BOOL_TYPE else tuple(raw)
        return HeaderArray(etype, n, values)
    r.skip(n * size, what)
    return HeaderArray(etype, n, None)


def _walk_strings(r: Reader, n: int, what: str, collect: bool) -> StringArray:
    """Walk n length-prefixed strings. The fast path works on the buffer directly (a 262k-token vocabulary
    is walked in well under 0.1 s); the slow path refills and checks bounds."""
    items: list[str] | None = [] if collect else None
    start = r.tell()
    fp_start = -1
    empty: list[tuple[int, int]] = []
    unpack = U64.unpack_from
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
                    items.append(decode_token(buf[pos + 8 : stop], i))
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
        if items is not None and at + 8 + ln - start > MAX_TOKEN_TEXT_BYTES:  # checked once per buffer refill
            raise LimitError(f"{r.name} is corrupt: the texts of {what} take more than "
                             f"{MAX_TOKEN_TEXT_BYTES:,} bytes.")
        if items is not None:
            items.append(decode_token(r.take(ln, f"element {i:,} of {what}"), i))
        else:
            r.skip(ln, f"element {i:,} of {what}")
        buf, pos = r.buf, r.pos
        end = len(buf)
        i += 1
    r.pos = pos
    stop_at = r.tell()
    return StringArray(n, start, fp_start if fp_start >= 0 else stop_at, stop_at, empty, items)


def _note_empty(r: Reader, empty: list[tuple[int, int]], token_id: int, offset: int) -> None:
    if len(empty) >= MAX_EMPTY_TOKENS:
        raise LimitError(f"{r.name} is corrupt: more than {MAX_EMPTY_TOKENS:,} of its strings are empty.")
    empty.append((token_id, offset))


def _describe_non_gguf(head: bytes, r: Reader) -> str:
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


def decode_token(raw: bytes, i: int) -> str:
    # llama.cpp renames an empty token text so the vocabulary stays unique.
    return raw.decode("utf-8", errors="surrogateescape") if raw else f"[EMPTY_{i}]"


def open_gguf(path: Path) -> tuple[BinaryIO, int]:
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


def read_header(path: Path, collect_tokens: bool) -> tuple[Header, int]:
    f, size = open_gguf(path)
    try:
        r = Reader(f, size, path.name)
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
