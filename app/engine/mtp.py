"""The target's own multi-token-prediction (MTP, NextN) heads as a drafter, driven as llama.cpp drives them.

Qwen3.5/3.6 and others ship MTP blocks after the trunk (``blk.{n_layer}.nextn.*``). llama.cpp runs them in a
second context on the same model (``ctx_type`` MTP) whose KV cache holds only those blocks. As
common/speculative.cpp's ``draft-mtp`` does:

- after every target decode, the MTP context reads the same tokens, each paired with the target's hidden
  row (``h_nextn``) of the position before (``MTPDrafter.mirror``, called by ``Context.on_decode``);
- a draft starts at the pending token, paired with the target's row of the last kept position; each further
  step reads the token just drafted with the MTP block's own row of the step before.

Rejected positions go from the MTP context at the next mirror, which starts where the target's batch starts.

``llama_set_embeddings_nextn`` and ``llama_get_embeddings_nextn(_ith)`` are declared in llama.cpp's staging
header (src/llama-ext.h) as C++, so libllama exports them under their mangled names only, and
llama-cpp-python does not bind them: they are looked up here by those names (the Itanium C++ ABI of GCC and
Clang on Linux and macOS). A build without them (MSVC mangles differently) is refused in one sentence.
"""

from __future__ import annotations

import ctypes
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import llama_cpp as lc
import numpy as np
import numpy.typing as npt

from app.engine.drafters import Draft, draft_step
from app.engine.llama import (
    ROLLBACK_KV,
    Context,
    ContextParams,
    Model,
    llama_context_params,
)
from app.engine.native import Native, own
from app.errors import EngineLoadError, IncompatibleDrafterError
from app.library.gguf_reader import GGUFInfo
from app.library.heads import mtp_refusal
from app.params import SamplingSettings

LLAMA_CONTEXT_TYPE_MTP = 1
H_ROWS_KEPT = 256  # target hidden rows kept by position: a rollback within this reach still finds its row

_F32P = ctypes.POINTER(ctypes.c_float)
_SYMBOLS = {
    "set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                             [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], _F32P),
    "get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                                 [ctypes.c_void_p, ctypes.c_int32], _F32P),
}


class _NextnApi:
    def __init__(self) -> None:
        lib = lc.llama_cpp._lib
        self.funcs = {}
        for name, (symbol, argtypes, restype) in _SYMBOLS.items():
            func = getattr(lib, symbol)
            func.argtypes = argtypes
            func.restype = restype
            self.funcs[name] = func

    def set_embeddings_nextn(self, ctx: object, value: bool, masked: bool) -> None:
        self.funcs["set_embeddings_nextn"](ctx, value, masked)

    def rows(self, ctx: object, n: int, n_embd: int) -> npt.NDArray[np.float32]:
        """The first ``n`` hidden rows of the last decode (an unmasked context keeps one per batch token)."""
        ptr = self.funcs["get_embeddings_nextn"](ctx)
        if not ptr:
            raise EngineLoadError("llama.cpp returned no MTP hidden rows for the target's last batch.")
        return np.ctypeslib.as_array(ptr, shape=(n, n_embd))

    def row(self, ctx: object, i: int, n_embd: int) -> npt.NDArray[np.float32]:
        ptr = self.funcs["get_embeddings_nextn_ith"](ctx, i)
        if not ptr:
            raise EngineLoadError("llama.cpp returned no MTP hidden row for the draft step.")
        return np.ctypeslib.as_array(ptr, shape=(n_embd,))


_api: _NextnApi | None = None


def nextn_api() -> _NextnApi:
    """The MTP functions of this libllama, or a one-sentence refusal where the build lacks them."""
    global _api
    if _api is None:
        try:
            _api = _NextnApi()
        except AttributeError as exc:
            raise EngineLoadError(
                "This llama.cpp build does not export llama_set_embeddings_nextn and its siblings under the "
                "names SpecDeck looks for (GCC or Clang on Linux or macOS), so the model's MTP heads cannot draft "
                "here; choose a drafter model or the n-gram drafter instead."
            ) from exc
    return _api


# --- the MTP context ----------------------------------------------------------------------------


class MTPContext:
    """llama.cpp's MTP context on the target model: tokens each paired with a hidden row, one sequence.

    ``tokens`` records what its KV cache holds, position by position, as ``Context.tokens`` does.
    """

    CTX_TYPE = LLAMA_CONTEXT_TYPE_MTP
    WHAT = "the MTP heads"

    def __init__(self, model: Model, target: Context, params: ContextParams) -> None:
        if self.CTX_TYPE == LLAMA_CONTEXT_TYPE_MTP and not model.load_mtp:
            raise EngineLoadError("The target was loaded without its MTP heads (load_mtp); load it with them.")
        self.api = nextn_api()
        self.model = model
        cp = llama_context_params(replace(params, n_ctx=target.n_ctx, n_batch=target.n_batch))
        cp.n_rs_seq = 0
        cp.ctx_type = self.CTX_TYPE
        cp.ctx_other = target._ptr  # an EAGLE-3 drafter borrows the target's token embeddings and output
        ptr = lc.llama_init_from_model(model._ptr, cp)
        if not ptr:
            raise EngineLoadError(
                f"llama.cpp could not create the context of {target.n_ctx} tokens for {self.WHAT}: most likely "
                "not enough memory for its KV cache; try a smaller context."
            )
        # It reads the target's context as well as its own model: freed before either.
        self.native = own(self, Native(ptr, lc.llama_free, f"The context of {self.WHAT}",
                                       (model.native, target.native)))
        self.api.set_embeddings_nextn(self._ptr, True, True)  # its own row for each output: the next step's input
        self.n_ctx = int(lc.llama_n_ctx(self._ptr))
        self.n_batch = int(lc.llama_n_batch(self._ptr))
        self.n_vocab = model.n_vocab
        self.n_embd = int(lc.llama_model_n_embd_out(model._ptr))
        self.tokens: list[int] = []
        self.rollback = ROLLBACK_KV  # the MTP blocks are attention layers, even in a hybrid target
        self._batch = self.new_batch()
        self._pos = (lc.llama_pos * 4)()
        self._zero = np.zeros(self.n_embd, dtype=np.float32)
        self._last_row: npt.NDArray[np.float32] = self._zero  # the MTP block's own row after the last step

    @property
    def _ptr(self) -> Any:
        return self.native.get()

    @property
    def _mem(self) -> Any:
        return lc.llama_get_memory(self._ptr)

    def new_batch(self) -> Any:
        """A batch of this context's, freed before it."""
        batch = lc.llama_batch_ext_init(self._ptr)
        own(self, Native(batch, lc.llama_batch_ext_free, f"A batch of {self.WHAT}", (self.native,)))
        return batch

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def process(self, tokens: Sequence[int], rows: npt.NDArray[np.float32], *, output_last: bool) -> None:
        """Append ``tokens`` at the next positions, token i paired with ``rows[i]``."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        ctx = self._ptr  # first: a closed context's batch is freed too
        batch, base = self._batch, self.n_past
        lc.llama_batch_ext_clear(batch)
        for i, tok in enumerate(tokens):
            idx = lc.llama_batch_ext_add_token(batch, 0, int(tok))
            self._pos[0] = base + i
            embd = lc.llama_embd(rows[i].ctypes.data_as(_F32P), 1, self.n_embd)
            if idx < 0 or not lc.llama_batch_ext_set_pos(batch, idx, self._pos) \
                    or not lc.llama_batch_ext_set_embd_token(batch, idx, embd):
                raise EngineLoadError(f"llama.cpp refused token {tok} of an MTP batch (code {idx}).")
            if output_last and i == n - 1:
                lc.llama_batch_ext_set_output_logits(batch, idx, True)
        rc = lc.llama_process(ctx, lc.LLAMA_PROCESS_TYPE_DECODE, batch)
        if rc != 0:
            raise EngineLoadError(f"llama.cpp failed to run {self.WHAT} on a batch of {n} tokens (code {rc}).")
        self.tokens.extend(int(t) for t in tokens)

    def step(self, token: int, row: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """One draft step: ``token`` with ``row``; the logits it predicts for the next position (a view)."""
        self.process([token], row[None, :], output_last=True)
        self._last_row = np.array(self.api.row(self._ptr, 0, self.n_embd), copy=True)
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(self._ptr, 0), shape=(self.n_vocab,))

    @property
    def last_row(self) -> npt.NDArray[np.float32]:
        return self._last_row

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Draft steps over ``tokens``, each with the row of the step before (the loop's calibration times
        these); the last step's logits as a one-row array."""
        row = self._last_row
        out = np.empty((1, self.n_vocab), dtype=np.float32)
        for tok in tokens:
            out[0] = self.step(tok, row)
            row = self._last_row
        return out

    def truncate(self, n_keep: int) -> None:
        if n_keep >= self.n_past:
            return
        if not lc.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
            raise EngineLoadError("llama.cpp could not drop positions of the MTP heads' cache.")
        del self.tokens[n_keep:]

    def clear(self) -> None:
        lc.llama_memory_clear(self._mem, True)
        self.tokens = []
        self._last_row = self._zero

    def synchronize(self) -> None:
        lc.llama_synchronize(self._ptr)

    def close(self) -> None:
        self.native.close()


# --- the drafter --------------------------------------------------------------------------------


@dataclass
class MirrorStats:
    batches: int = 0
    tokens: int = 0
    seconds: float = 0.0
    gaps: int = 0  # batches the MTP context could not follow (it lacked the positions before them)


class FollowsTarget(ABC):
    """A drafter that reads the target's batches as the target decodes them (``mirror``, set as the target's
    ``on_decode``): the MTP heads, EAGLE-3, DFlash and DSpark."""

    target: Context
    ctx: MTPContext
    block_drafter = False
    keeps_recurrent_checkpoint = False  # a head's cache is attention only: no recurrent state to copy

    @abstractmethod
    def mirror(self, tokens: Sequence[int], first: int) -> None: ...

    @abstractmethod
    def reset(self) -> None: ...

    def detach(self) -> None:
        if self.target.on_decode == self.mirror:
            self.target.on_decode = None

    def follow(self, on: bool) -> None:
        """Mirror the target's batches (speculative answers) or not (plain ones, which then cost what plain
        decoding costs). Following again after a pause, a target cache the drafter's cache does not match is
        emptied, so the next answer reads its prompt through both."""
        if not on:
            self.detach()
            return
        if self.target.on_decode == self.mirror:
            return
        self.target.on_decode = self.mirror
        held = self.target.tokens
        if self.ctx.tokens[: len(held)] != held:
            self.target.clear()
            self.reset()

    def prefill(self, tokens: Sequence[int]) -> int:
        """Nothing to read: the prompt went through the drafter with every target batch (``mirror``)."""
        return 0


class MTPDrafter(FollowsTarget):
    """Drafts with the target's MTP heads; fills the model drafter's slot of the loop (``prefill``,
    ``propose``, ``reset``, ``ctx``). Greedy targets get top-1 drafts; sampling targets get drafts sampled
    from q under the target's sampler settings, with q kept for the acceptance test.

    Each token of the sequence is read with the row of the position before it, at its own position in the
    draft context's cache less ``SHIFT`` (an EAGLE-3 drafter keeps (token p+1, row p) at position p).
    """

    SHIFT = 0

    def __init__(self, target: Context, mtp: MTPContext, p_min: float = 0.1) -> None:
        self.model = mtp.model
        self.target = target
        self.ctx = mtp
        self.p_min = p_min
        self.n_embd = mtp.n_embd
        self.api = mtp.api
        self.stats = MirrorStats()
        self._h: dict[int, npt.NDArray[np.float32]] = {}  # the target's hidden row by position (the latest ones)
        self._enable_target_rows()
        target.on_decode = self.mirror

    def _enable_target_rows(self) -> None:
        self.api.set_embeddings_nextn(self.target._ptr, True, False)  # a row for every token of every batch

    def reset(self) -> None:
        self.ctx.clear()
        self._h.clear()

    def _target_rows(self, n: int) -> npt.NDArray[np.float32]:
        """One row per token of the target's last batch: its hidden state after the final norm (h_nextn)."""
        return np.array(self.api.rows(self.target._ptr, n, self.n_embd), copy=True)

    def _row_before(self, pos: int) -> npt.NDArray[np.float32] | None:
        """The row the token at ``pos`` is read with: the target's row of ``pos - 1`` (zeros before the first
        token, as llama.cpp starts), None where it is no longer kept."""
        if pos == 0:
            return self.ctx._zero if self.SHIFT == 0 else None
        return self._h.get(pos - 1)

    def mirror(self, tokens: Sequence[int], first: int) -> None:
        """The target just decoded ``tokens`` from position ``first``: the draft context reads them too, token i
        paired with the target's row of the position before (the first with the row kept from earlier)."""
        t0 = time.perf_counter()
        n = len(tokens)
        rows = self._target_rows(n)
        for i in range(n):
            self._h[first + i] = rows[i]
        if len(self._h) > H_ROWS_KEPT:
            for pos in sorted(self._h)[: len(self._h) - H_ROWS_KEPT]:
                del self._h[pos]
        mtp = self.ctx
        if first == 0 and self.SHIFT:
            tokens, rows, first = tokens[1:], rows[1:], 1  # the first token has no row before it
            n -= 1
            mtp.truncate(0)
            if n == 0:
                self.stats.seconds += time.perf_counter() - t0
                return
        start = first - self.SHIFT
        mtp.truncate(start)
        before = self._row_before(first)
        if mtp.n_past != start or before is None:
            # The positions before this batch are not in the draft cache (or their row is gone): it cannot
            # follow, and drafts stop until the target starts over from what the draft cache holds.
            self.stats.gaps += 1
            self.stats.seconds += time.perf_counter() - t0
            return
        paired = np.concatenate([before[None, :], rows[:-1]]) if n > 1 else before[None, :]
        mtp.process(tokens, paired, output_last=False)
        self.stats.batches += 1
        self.stats.tokens += n
        self.stats.seconds += time.perf_counter() - t0

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        recent: npt.NDArray[np.int64] | None = None,
    ) -> Draft:
        """Up to ``k`` tokens after ``tokens``: the target holds all but the last of the real sequence; any more
        (an n-gram draft ahead of this one) are read by the MTP heads with their own rows first."""
        draft = Draft()
        known = self.target.n_past
        mtp = self.ctx
        k = min(k, mtp.n_ctx - len(tokens) - 1)
        if k <= 0 or known >= len(tokens):
            return draft
        t0 = time.perf_counter()
        start = max(known - self.SHIFT, 0)
        mtp.truncate(start)  # the last draft's steps
        row = self._row_before(known)
        if mtp.n_past != start or row is None or mtp.tokens != list(tokens[self.SHIFT : known]):
            return draft  # the draft cache does not hold what the target holds: no draft rather than a blind one
        logits = None
        for tok in tokens[known:]:
            logits = mtp.step(tok, row)
            row = mtp.last_row
            draft.model_steps += 1
        assert logits is not None
        history = list(recent) if recent is not None else []
        for i in range(k):
            drafted = draft_step(draft, logits, settings, rng, history, self.p_min if i > 0 else 0.0)
            if drafted is None:
                break
            if i + 1 < k:
                logits = mtp.step(drafted, row)
                row = mtp.last_row
                draft.model_steps += 1
        draft.model_seconds = time.perf_counter() - t0
        return draft


def check_mtp_target(model: Model, info: GGUFInfo) -> None:
    """Refuse, in one sentence, a target whose MTP heads llama.cpp did not load or cannot run."""
    refusal = mtp_refusal(info)
    if refusal:
        raise IncompatibleDrafterError(refusal)
    if model.n_layer_nextn != info.mtp_layers:
        raise IncompatibleDrafterError(
            f"llama.cpp reads {model.n_layer_nextn} MTP heads in {info.name or info.path}, the file says "
            f"{info.mtp_layers}: it cannot draft with them."
        )
