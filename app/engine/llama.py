"""A thin, typed wrapper over llama-cpp-python's low-level API.

Owns model and context lifetimes, batch decoding with logits at chosen positions, zero-copy logits views,
checked KV rollback, tokenization and UTF-8-safe detokenization. Never builds a batch larger than n_batch:
llama.cpp aborts the whole process on that. Over 500 lines: the three ways back (KV cells, recurrent snapshots,
checkpoints) depend on the context's memory and its last decode, so they live with the context.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np
import numpy.typing as npt

from app.ceiling.backend_modules import load_backend_modules
from app.ceiling.rpc import model_devices
from app.engine.native import Native, own
from app.engine_limits import kv_cache_type
from app.errors import EngineLoadError, ModelFileError, PromptTooLongError

Logits = npt.NDArray[np.float32]

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
# llama.cpp's vocab type enum, named as GGUF's tokenizer.ggml.model spells it.
VOCAB_TYPES = {0: "none", 1: "llama", 2: "gpt2", 3: "bert", 4: "t5", 5: "rwkv", 6: "plamo2"}

# Sliding-window layers keep every position's cells: rolling back rejected drafts and reusing an earlier
# turn's prefix need the cells a trimmed window would already have dropped.
SWA_FULL = True

_backend_lock = threading.Lock()
_backend_ready = False
_log_sink: Callable[[str], None] | None = None


_LOG_DEBUG, _LOG_CONT = 1, 5
_last_level = [0]


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _on_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # Debug output (per-tensor graph details) drowns the lines that explain a failure.
    if level != _LOG_CONT:
        _last_level[0] = level
    if _log_sink is not None and text and _last_level[0] != _LOG_DEBUG:
        _log_sink(text.decode("utf-8", errors="replace"))


def init_backend(log_sink: Callable[[str], None] | None = None) -> None:
    """Initialise llama.cpp once per process; its log lines go to ``log_sink`` (or nowhere)."""
    global _backend_ready, _log_sink
    with _backend_lock:
        _log_sink = log_sink
        lc.llama_log_set(_on_llama_log, ctypes.c_void_p(0))
        if not _backend_ready:
            load_backend_modules()  # a build with loadable backends finds them in llama_cpp/lib
            lc.llama_backend_init()
            _backend_ready = True


def physical_cores() -> int:
    try:
        import psutil

        return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except ImportError:  # pragma: no cover - psutil is a dependency
        return os.cpu_count() or 1


def model_params(*, n_gpu_layers: int = -1, main_gpu: int | None = None,
                 vocab_only: bool = False, load_mtp: bool = False,
                 devices: ctypes.Array[ctypes.c_void_p] | None = None) -> lc.llama_model_params:
    """llama.cpp's load parameters. ``main_gpu`` None: llama.cpp's default, layers spread over every GPU it
    uses; an index into those GPUs: that GPU alone (split mode NONE, the only mode that reads main_gpu).
    ``devices``: the devices to offload to (app.ceiling.rpc.model_devices), which must outlive the load."""
    load_backend_modules()  # a module build has no GPU backend, so no offload, until its modules are loaded
    params = lc.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers if lc.llama_supports_gpu_offload() else 0
    if devices is not None:
        params.devices = ctypes.cast(devices, ctypes.c_void_p).value
    if main_gpu is not None:
        params.split_mode = lc.LLAMA_SPLIT_MODE_NONE
        params.main_gpu = main_gpu
    params.vocab_only = vocab_only
    params.load_mtp = load_mtp  # the multi-token-prediction blocks (blk.{n_layer}+.nextn.*) are skipped otherwise
    return params


class Model:
    """A loaded GGUF model (weights and vocabulary). One model may serve several contexts."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_gpu_layers: int = -1,
        main_gpu: int | None = None,
        vocab_only: bool = False,
        progress: Callable[[float], bool] | None = None,
        load_mtp: bool = False,
        rpc_servers: Sequence[str] = (),
    ) -> None:
        self.path = str(path)
        p = Path(path)
        if not p.is_file():
            raise ModelFileError(f"{p} is not a file; choose a .gguf model file.")
        self._devices = model_devices(rpc_servers)  # kept: llama.cpp reads the array during the load
        params = model_params(n_gpu_layers=n_gpu_layers, main_gpu=main_gpu, vocab_only=vocab_only,
                              load_mtp=load_mtp, devices=self._devices)
        self.load_mtp = load_mtp
        if main_gpu is not None and params.n_gpu_layers != 0:
            _check_main_gpu(main_gpu)
        if progress is not None:
            # Returning False from the callback makes llama.cpp give up the load.
            self._progress_cb = lc.llama_progress_callback(lambda f, _ud: bool(progress(float(f))))
            params.progress_callback = self._progress_cb
        self.n_gpu_layers = int(params.n_gpu_layers)  # as llama.cpp was asked: 0 on a CPU-only build
        ptr = lc.llama_model_load_from_file(self.path.encode(), params)
        if not ptr:
            raise EngineLoadError(
                f"llama.cpp could not load {p.name}: the file is damaged or of an unsupported architecture, "
                "or there is not enough memory for its weights ("
                + ("try fewer GPU layers" if self.n_gpu_layers else "a smaller quantization needs less") + ")."
            )
        # Its contexts, their batches and grammar samplers borrow it and are freed first (app.engine.native).
        self.native = own(self, Native(ptr, lc.llama_model_free, f"The model {p.name}"))
        vocab = lc.llama_model_get_vocab(ptr)
        if not vocab:
            self.close()
            raise EngineLoadError(f"{p.name} has no vocabulary.")
        self.vocab = vocab
        self.n_vocab = int(lc.llama_vocab_n_tokens(vocab))
        self.vocab_type = VOCAB_TYPES.get(int(lc.llama_vocab_type(vocab)), "unknown")
        self.bos = int(lc.llama_vocab_bos(vocab))
        self.eos = int(lc.llama_vocab_eos(vocab))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(vocab))
        self.add_eos = bool(lc.llama_vocab_get_add_eos(vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog = np.zeros(self.n_vocab, dtype=bool)
        for tok in range(self.n_vocab):
            if lc.llama_vocab_is_eog(vocab, tok):
                self._eog[tok] = True

    @property
    def _ptr(self) -> Any:
        return self.native.get()

    # --- metadata -------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def size_bytes(self) -> int:
        return int(lc.llama_model_size(self._ptr))

    @property
    def n_params(self) -> int:
        return int(lc.llama_model_n_params(self._ptr))

    @property
    def n_layer(self) -> int:
        return int(lc.llama_model_n_layer(self._ptr))

    @property
    def n_layer_nextn(self) -> int:
        """Multi-token-prediction (NextN) blocks after the trunk, as llama.cpp read them."""
        return int(lc.llama_model_n_layer_nextn(self._ptr))

    @property
    def n_ctx_train(self) -> int:
        return int(lc.llama_model_n_ctx_train(self._ptr))

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def is_recurrent(self) -> bool:
        return bool(lc.llama_model_is_recurrent(self._ptr)) or bool(lc.llama_model_is_hybrid(self._ptr))

    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def token_text(self, token: int) -> str:
        raw = lc.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="surrogateescape") if raw else ""

    # --- tokens ---------------------------------------------------------------------------------

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise PromptTooLongError("The text could not be tokenized (llama.cpp reported an overflow).")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (control tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:  # the buffer was too small: -n bytes are needed
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        data = buf.raw[: max(n, 0)]
        self._pieces[token] = data
        return data

    def piece_text(self, token: int) -> str:
        """One token's text on its own: a piece of a split UTF-8 character reads as U+FFFD (``piece`` has its
        bytes)."""
        return self.piece(token).decode("utf-8", errors="replace")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Free the model, after every context and sampler that borrows it."""
        self.native.close()


def _check_main_gpu(main_gpu: int) -> None:
    """A GPU index llama.cpp does not have fails the load with only a log line: say so in a sentence."""
    from app.ceiling.backend import ggml_devices
    from app.ceiling.backend_modules import llama_lib_dir
    from app.ceiling.memory import offload_devices

    try:
        gpus = offload_devices(ggml_devices(llama_lib_dir(), rpc_servers=()), rpc_servers=())  # one GPU: no RPC
    except (AttributeError, OSError):
        return  # the device list cannot be read here: llama.cpp checks the index itself
    if not 0 <= main_gpu < len(gpus):
        names = ", ".join(f"{i}: {d.name} ({d.description})" for i, d in enumerate(gpus)) or "none"
        raise EngineLoadError(f"GPU {main_gpu} does not exist; llama.cpp's GPUs here are {names}.")


class Detokenizer:
    """Turns tokens into text without ever emitting half a UTF-8 character; invalid bytes become U+FFFD."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(self._model.piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0  # 0 = physical cores
    flash_attn: str = "auto"
    kv_type: str = "f16"
    # Recurrent-state snapshots per sequence (llama.cpp's n_rs_seq): a rollback of up to this many tokens of
    # the last decode costs nothing. llama.cpp keeps them only for the architectures it lists, 0 elsewhere.
    rs_snapshots: int = 0


# How a context takes back tokens it has decoded (``Context.rollback``):
ROLLBACK_KV = "kv"  # attention only: the KV cells are dropped
ROLLBACK_SNAPSHOTS = "snapshots"  # recurrent state: llama.cpp's per-token snapshots, within their bounds
ROLLBACK_CHECKPOINTS = "checkpoints"  # recurrent state: a copy saved before the pass, then a re-decode


@dataclass
class _Checkpoint:
    """A copy of the recurrent part of sequence 0's state after ``pos`` tokens."""

    pos: int
    size: int
    buffer: ctypes.Array[ctypes.c_uint8]


def llama_context_params(params: ContextParams) -> lc.llama_context_params:
    """llama.cpp's parameters for a context of sequence 0 alone, as every SpecDeck context has them."""
    cp = lc.llama_context_default_params()
    cp.n_ctx = params.n_ctx
    cp.n_batch = params.n_batch
    cp.n_ubatch = params.n_batch
    cp.n_seq_max = 1
    threads = params.n_threads or physical_cores()
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.flash_attn_type = FLASH_ATTN[params.flash_attn]
    cp.type_k = cp.type_v = kv_cache_type(params.kv_type).ggml_type
    cp.no_perf = True
    cp.swa_full = SWA_FULL
    return cp


class Context:
    """One llama.cpp context (KV cache) on a model, sequence 0 only.

    ``tokens`` records which tokens are in the KV cache, kept by ``decode``, ``truncate`` and ``clear``
    themselves: every user of the context (both decoders of a session, a drafter) reads the same record,
    so none can reuse a prefix another one has since overwritten.
    """

    def __init__(self, model: Model, params: ContextParams) -> None:
        self.model = model
        cp = llama_context_params(params)
        cp.n_rs_seq = params.rs_snapshots if model.is_recurrent else 0
        ptr = lc.llama_init_from_model(model._ptr, cp)
        if not ptr:
            raise EngineLoadError(
                f"llama.cpp could not create a context of {params.n_ctx} tokens for {Path(model.path).name}: "
                "most likely not enough memory for the KV cache. Try a smaller context"
                + (", a smaller KV cache type (q8_0) or fewer GPU layers." if model.n_gpu_layers
                   else " or a smaller KV cache type (q8_0).")
            )
        self.native = own(self, Native(ptr, lc.llama_free, f"The context on {Path(model.path).name}",
                                       (model.native,)))
        self.n_ctx = int(lc.llama_n_ctx(ptr))
        self.n_batch = int(lc.llama_n_batch(ptr))
        self.n_vocab = model.n_vocab
        self.tokens: list[int] = []
        # What llama.cpp really keeps (it silently keeps none for architectures it does not list).
        self.rs_snapshots = int(lc.llama_n_rs_seq(self._ptr)) if model.is_recurrent else 0
        self.rollback = (ROLLBACK_KV if not model.is_recurrent
                         else ROLLBACK_SNAPSHOTS if self.rs_snapshots else ROLLBACK_CHECKPOINTS)
        # ``tokens[:_decoded]`` are in llama.cpp's memory; the rest were taken back to a checkpoint and are
        # decoded again before the next checkpoint is saved, or at the front of the next batch where none is.
        self._decoded = 0
        self._last_width = 0  # tokens in the last llama_decode: a snapshot reaches back less than that
        self._snapshot_pending = False  # a snapshot rollback takes effect at the next decode, once
        self._checkpoint: _Checkpoint | None = None
        self.replayed = 0  # tokens the last decode decoded again after a checkpoint restore
        self.rollback_seconds = 0.0  # time spent saving and restoring checkpoints since last asked
        self._on_decode: weakref.WeakMethod[Callable[[Sequence[int], int], None]] | None = None
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        own(self, Native(self._batch, lc.llama_batch_free, "The context's batch", (self.native,)))
        self._tok = self._batch.token
        self._pos = self._batch.pos
        self._nseq = self._batch.n_seq_id
        self._seq = self._batch.seq_id
        self._logit_flags = self._batch.logits
        for i in range(self.n_batch):
            self._nseq[i] = 1
            self._seq[i][0] = 0

    @property
    def _ptr(self) -> Any:
        return self.native.get()

    @property
    def _mem(self) -> Any:
        return lc.llama_get_memory(self._ptr)

    @property
    def on_decode(self) -> Callable[[Sequence[int], int], None] | None:
        """Called after every llama_decode with (its tokens, the position of the first): an MTP drafter mirrors
        each batch into its own context while the target's hidden rows of that batch are still there. Held
        weakly: the drafter holds this context, and a cycle would leave their order of freeing to chance."""
        return self._on_decode() if self._on_decode is not None else None

    @on_decode.setter
    def on_decode(self, method: Callable[[Sequence[int], int], None] | None) -> None:
        self._on_decode = weakref.WeakMethod(method) if method is not None else None

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> Logits:
        """Append ``tokens`` to the KV cache; return logits rows (all positions, or the last only).

        The returned array is a view into llama.cpp's buffer, valid until the next decode on this context.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("decode needs at least one token")
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        if self.n_past + n > self.n_ctx:
            raise PromptTooLongError(f"The context is full ({self.n_past} + {n} > {self.n_ctx} tokens).")
        replay = self.tokens[self._decoded :]
        while len(replay) + n > self.n_batch:  # a long replay goes first, in chunks of its own
            chunk = replay[: self.n_batch]
            self._decode_batch(chunk, 0)
            replay = replay[len(chunk) :]
        self.replayed = len(self.tokens) - self._decoded
        self._decode_batch([*replay, *tokens], n if all_logits else 1)
        self.tokens.extend(tokens)
        rows = n if all_logits else 1
        ptr = lc.llama_get_logits(self._ptr)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

    def _decode_batch(self, tokens: Sequence[int], n_out: int) -> None:
        """One llama_decode of ``tokens`` after the decoded ones, with logits for the last ``n_out``."""
        ctx = self._ptr  # first: a closed context's batch is freed too
        n = len(tokens)
        tok, pos, flags, base = self._tok, self._pos, self._logit_flags, self._decoded
        first_out = n - n_out
        for i in range(n):
            tok[i] = tokens[i]
            pos[i] = base + i
            flags[i] = i >= first_out
        self._batch.n_tokens = n
        rc = lc.llama_decode(ctx, self._batch)
        if rc != 0:
            raise EngineLoadError(
                f"llama.cpp failed to decode a batch of {n} tokens (code {rc}): "
                + ("no room in the KV cache." if rc == 1 else "the backend reported an error.")
            )
        self._decoded += n
        self._last_width = n
        self._snapshot_pending = False
        follower = self.on_decode
        if follower is not None:
            follower(tokens, base)

    def prefill(self, tokens: Sequence[int]) -> Logits:
        """Decode a long token list in n_batch chunks; returns the last position's logits row."""
        out: Logits | None = None
        for _, chunk_logits in self.prefill_chunks(tokens):
            out = chunk_logits
        if out is None:
            raise ValueError("prefill needs at least one token")
        return out

    def prefill_chunks(self, tokens: Sequence[int]) -> Iterator[tuple[int, Logits]]:
        """Decode ``tokens`` in n_batch chunks, yielding (tokens done, last logits row) after each chunk."""
        for start in range(0, len(tokens), self.n_batch):
            out = self.decode(tokens[start : start + self.n_batch])
            yield min(start + self.n_batch, len(tokens)), out

    def greedy_loop(self, first: int, n_tokens: int) -> tuple[int, float]:
        """Decode one token at a time, each the argmax of the one before, starting with ``first``.

        The bare llama_decode loop (no sampling, no bookkeeping): llama.cpp's own decode speed, and the
        decode check. Returns (tokens decoded, seconds); stops early when the context is full.
        """
        tok, done = first, 0
        t0 = time.perf_counter()
        for _ in range(n_tokens):
            if self.n_past + 1 > self.n_ctx:
                break
            tok = int(np.argmax(self.decode([tok])[-1]))
            done += 1
        self.synchronize()
        return done, time.perf_counter() - t0

    def truncate(self, n_keep: int) -> None:
        """Drop every cached position from ``n_keep`` on (rollback after rejected drafts).

        A recurrent state cannot drop positions: it goes back to a snapshot where llama.cpp's bounds hold,
        else to a checkpoint at or before ``n_keep`` (the tokens after it are decoded again later), else it
        starts over and decodes all ``n_keep`` tokens again. Never a state that is wrong.
        """
        if n_keep >= self.n_past:
            return
        if n_keep < self._decoded:
            self._roll_back(n_keep)
        del self.tokens[n_keep:]
        if self._checkpoint is not None and self._checkpoint.pos > n_keep:
            self._checkpoint = None

    def _roll_back(self, n_keep: int) -> None:
        drop = self._decoded - n_keep
        if self.rollback == ROLLBACK_KV or self._snapshot_reaches(drop):
            if not lc.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
                raise EngineLoadError(f"llama.cpp could not drop the last {drop} positions of this model's cache.")
            self._snapshot_pending = self.rollback == ROLLBACK_SNAPSHOTS
            self._decoded = n_keep
            return
        ckpt = self._checkpoint
        if n_keep > 0 and ckpt is not None and ckpt.pos <= n_keep:
            t0 = time.perf_counter()
            read = lc.llama_state_seq_set_data_ext(self._ptr, ckpt.buffer, ckpt.size, 0,
                                                   lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            # The restored state ends at ckpt.pos; the attention cells after it (hybrids) go too.
            if read == ckpt.size and lc.llama_memory_seq_rm(self._mem, 0, ckpt.pos, -1):
                self.rollback_seconds += time.perf_counter() - t0
                self._decoded = ckpt.pos
                return
        lc.llama_memory_clear(self._mem, True)
        self._checkpoint = None
        self._snapshot_pending = False
        self._decoded = 0

    def _snapshot_reaches(self, drop: int) -> bool:
        """Whether llama.cpp's snapshots restore the state ``drop`` tokens back, exactly.

        Its snapshots are written from the last decode only, one per token before its end, and serve one
        rollback; outside those bounds ``llama_memory_seq_rm`` can report success and leave a wrong state.
        """
        return (self.rollback == ROLLBACK_SNAPSHOTS and not self._snapshot_pending
                and 1 <= drop <= self.rs_snapshots and drop < self._last_width)

    def rollback_limit(self) -> int:
        """How many tokens of the next decode can be taken back without a full re-decode."""
        if self.rollback == ROLLBACK_SNAPSHOTS and self._snapshot_pending:
            return self.rs_snapshots  # no checkpoint can be saved until the pending rollback is decoded
        return self.n_ctx

    def prepare_rollback(self, drop: int, width: int) -> None:
        """The next decode, of ``width`` tokens, may be taken back by up to ``drop`` of them: where a
        snapshot will not reach that far, save a checkpoint of the recurrent state now."""
        if self.rollback == ROLLBACK_KV or drop <= 0:
            return
        width += self.n_past - self._decoded  # the replay goes with it
        if self.rollback == ROLLBACK_SNAPSHOTS and drop <= self.rs_snapshots and drop < width:
            return
        if self._snapshot_pending or self._decoded == 0:
            return  # nothing to save yet, or a state llama.cpp has not yet rolled back: a rollback re-decodes
        t0 = time.perf_counter()
        replay = self.tokens[self._decoded :]
        for start in range(0, len(replay), self.n_batch):
            # Tokens left by the last restore are decoded first, so the checkpoint is taken after them: folded
            # into the coming pass, each partial accept in a row would add its tokens to the next replay.
            self._decode_batch(replay[start : start + self.n_batch], 1)
        if self._checkpoint is not None and self._checkpoint.pos == self._decoded:
            self.rollback_seconds += time.perf_counter() - t0
            return
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(lc.llama_state_seq_get_size_ext(self._ptr, 0, flags))
        old = self._checkpoint
        buffer = old.buffer if old is not None and len(old.buffer) >= size else (ctypes.c_uint8 * size)()
        written = int(lc.llama_state_seq_get_data_ext(self._ptr, buffer, size, 0, flags))
        self._checkpoint = _Checkpoint(self._decoded, written, buffer) if written else None
        self.rollback_seconds += time.perf_counter() - t0

    def take_rollback_seconds(self) -> float:
        """Seconds spent on checkpoints since the last call (the cost model's share of speculation)."""
        seconds, self.rollback_seconds = self.rollback_seconds, 0.0
        return seconds

    def can_truncate_cheaply(self, n_keep: int) -> bool:
        """Whether ``truncate(n_keep)`` keeps the state it has (no start over and re-decode of everything)."""
        if n_keep >= self._decoded or self.rollback == ROLLBACK_KV:
            return True
        if self._snapshot_reaches(self._decoded - n_keep):
            return True
        return n_keep > 0 and self._checkpoint is not None and self._checkpoint.pos <= n_keep

    def recurrent_state_bytes(self) -> int:
        """Bytes of sequence 0's recurrent state as llama.cpp copies it (0 for attention-only models)."""
        if self.rollback == ROLLBACK_KV:
            return 0
        return int(lc.llama_state_seq_get_size_ext(self._ptr, 0, lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY))

    def clear(self) -> None:
        lc.llama_memory_clear(self._mem, True)
        self.tokens = []
        self._decoded = 0
        self._checkpoint = None
        self._snapshot_pending = False

    @property
    def n_past(self) -> int:
        """How many tokens the KV cache holds."""
        return len(self.tokens)

    def common_prefix(self, wanted: Sequence[int]) -> int:
        """How many leading tokens of ``wanted`` the cache already holds."""
        have, common = self.tokens, 0
        limit = min(len(have), len(wanted))
        while common < limit and have[common] == wanted[common]:
            common += 1
        return common

    def reuse_prefix(self, wanted: Sequence[int]) -> None:
        """Keep the cached prefix shared with ``wanted`` and drop the rest (a new turn of the same chat)."""
        common = self.common_prefix(wanted)
        if common == 0 or not self.can_truncate_cheaply(common):
            self.clear()  # a recurrent state that cannot go back that far: the prompt is read again in full
        else:
            self.truncate(common)

    def synchronize(self) -> None:
        lc.llama_synchronize(self._ptr)

    def close(self) -> None:
        """Free the context, after its batch and any drafter context that reads it."""
        self.native.close()
