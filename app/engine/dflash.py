"""DFlash and DSpark block drafters (GGUF architecture ``dflash``), driven as common/speculative.cpp's
``draft-dflash`` / ``draft-dspark`` drive them.

A DFlash drafter is a few non-causal decoder layers. It borrows the target's token embeddings and output
matrix, and proposes a whole block per step:

- the target keeps the inputs of the layers the drafter names (``llama_set_embeddings_layer_inp``);
- after every target batch, those rows go into the drafter's context as an embedding batch at the same
  positions: its graph fuses them (``fc``) and writes them into its KV cache;
- a draft is one decode of the block [pending token, <mask> × (B − 1)] at the next positions; the logits at
  the mask positions are the block's tokens (DFlash), or at every position from the first (DSpark, whose
  Markov head biases each position by the one before);
- the block's cells are dropped before the next target batch is injected at those positions.

A DSpark drafter is a DFlash file with ``markov_w1.weight``. Each position's logits give a distribution, but the
positions are drafted in one pass, each conditioned on the context and not on the tokens sampled before it in the
block; sampling each from its own row still keeps rejection sampling exact (any q chosen before the draft does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as lc
import numpy as np
import numpy.typing as npt

from app.engine.drafters import Draft, draft_step
from app.engine.eagle3 import _api, target_layer_ids, target_layer_inputs
from app.engine.llama import Context, ContextParams, Model
from app.engine.mtp import _F32P, FollowsTarget, MTPContext
from app.errors import EngineLoadError, IncompatibleDrafterError
from app.library.gguf_format import read_header
from app.library.gguf_reader import GGUFInfo
from app.library.heads import head_refusal
from app.params import SamplingSettings

DFLASH_ARCH = "dflash"
DEFAULT_BLOCK = 16  # llama.cpp's block size where the file names none


def is_dspark(info: GGUFInfo) -> bool:
    """A DSpark drafter: a DFlash file with the Markov head."""
    if info.architecture != DFLASH_ARCH:
        return False
    header, _ = read_header(Path(info.path), collect_tokens=False)
    return any(name == "markov_w1.weight" for name, *_ in header.tensors)


def block_size(info: GGUFInfo) -> int:
    value = info.metadata.get(f"{DFLASH_ARCH}.block_size", DEFAULT_BLOCK)
    return int(value) if isinstance(value, int) and value > 1 else DEFAULT_BLOCK


def check_dflash_pairing(target: Model, target_info: GGUFInfo, drafter: Model, drafter_info: GGUFInfo) -> list[int]:
    """The target layer ids to read, or a one-sentence refusal where this block drafter cannot draft for this
    target (llama.cpp would abort on most of these): the header's facts as the picker checks them
    (``head_refusal``), then what llama.cpp loaded (the layer ids, the mask token)."""
    refusal = head_refusal(target_info, drafter_info)
    if refusal:
        raise IncompatibleDrafterError(refusal)
    d_name, t_name = Path(drafter_info.path).name, Path(target_info.path).name
    ids = target_layer_ids(drafter)
    if not ids or any(not 0 <= lid < target.n_layer for lid in ids):
        raise IncompatibleDrafterError(
            f"{d_name} reads target layers {ids}, but {t_name} has layers 0 to {target.n_layer - 1}."
        )
    if int(lc.llama_vocab_mask(lc.llama_model_get_vocab(drafter._ptr))) < 0:
        raise IncompatibleDrafterError(f"{d_name} names no mask token, which its blocks are made of.")
    return ids


class DFlashContext(MTPContext):
    """The block drafter's own context (its layers' KV cache), with ``ctx_other`` the target's.

    ``tokens`` records its positions: the target's tokens whose features were injected, then the last block."""

    CTX_TYPE = 0
    WHAT = "the DFlash drafter"

    def __init__(self, model: Model, target: Context, params: ContextParams) -> None:
        super().__init__(model, target, params)
        lc.llama_set_causal_attn(self._ptr, False)  # a block attends to itself both ways, as it was trained
        self.mask = int(lc.llama_vocab_mask(lc.llama_model_get_vocab(model._ptr)))

    def inject(self, tokens: Sequence[int], features: npt.NDArray[np.float32]) -> None:
        """The target's layer inputs for ``tokens`` (one row each), at the next positions."""
        features = np.ascontiguousarray(features, dtype=np.float32)
        width = features.shape[1]
        batch, ctx = self._batch, self._ptr
        for start in range(0, len(tokens), self.n_batch):
            chunk = features[start : start + self.n_batch]
            lc.llama_batch_ext_clear(batch)
            for j in range(len(chunk)):
                embd = lc.llama_embd(chunk[j].ctypes.data_as(_F32P), 1, width)
                idx = lc.llama_batch_ext_add_embd(batch, 0, embd)
                p = self.n_past + j
                self._pos[0] = self._pos[1] = self._pos[2] = p
                if idx < 0 or not lc.llama_batch_ext_set_pos(batch, idx, self._pos):
                    raise EngineLoadError(f"llama.cpp refused a row of the DFlash drafter's features (code {idx}).")
            rc = lc.llama_process(ctx, lc.LLAMA_PROCESS_TYPE_DECODE, batch)
            if rc != 0:
                raise EngineLoadError(f"llama.cpp failed to inject {len(chunk)} rows into the DFlash drafter "
                                      f"(code {rc}).")
            self.tokens.extend(int(t) for t in tokens[start : start + len(chunk)])

    def block(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """One decode of the block ``tokens`` at the next positions; the logits of every position (a copy)."""
        n = len(tokens)
        batch, ctx = self._batch, self._ptr
        lc.llama_batch_ext_clear(batch)
        for i, tok in enumerate(tokens):
            idx = lc.llama_batch_ext_add_token(batch, 0, int(tok))
            self._pos[0] = self._pos[1] = self._pos[2] = self.n_past + i
            if idx < 0 or not lc.llama_batch_ext_set_pos(batch, idx, self._pos):
                raise EngineLoadError(f"llama.cpp refused token {tok} of a DFlash block (code {idx}).")
            lc.llama_batch_ext_set_output_logits(batch, idx, True)
        rc = lc.llama_process(ctx, lc.LLAMA_PROCESS_TYPE_DECODE, batch)
        if rc != 0:
            raise EngineLoadError(f"llama.cpp failed to run the DFlash drafter on a block of {n} (code {rc}).")
        self.tokens.extend(int(t) for t in tokens)
        return np.array(np.ctypeslib.as_array(lc.llama_get_logits(self._ptr), shape=(n, self.n_vocab)), copy=True)

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """A block of ``tokens`` (the loop's calibration times these as drafter steps); its last logits."""
        out = self.block(tokens)[-1:]
        self.truncate(self.n_past - len(tokens))
        return out


class DFlashDrafter(FollowsTarget):
    """A DFlash or DSpark drafter in the model drafter's slot of the loop (``prefill``, ``propose``, ``reset``,
    ``ctx``): one block decode per draft, however deep."""

    ctx: DFlashContext
    block_drafter = True

    def __init__(self, target: Context, ctx: DFlashContext, layer_ids: Sequence[int], block: int, *,
                 dspark: bool = False, p_min: float = 0.0) -> None:
        self.model = ctx.model
        self.target = target
        self.ctx = ctx
        self.layer_ids = list(layer_ids)
        self.n_embd_target = int(lc.llama_model_n_embd(target.model._ptr))
        # DFlash reads the mask positions of [last, mask…]: block − 1 tokens; DSpark reads from the first.
        self.dspark = dspark
        self.max_depth = block if dspark else block - 1
        self.p_min = p_min
        self.gaps = 0
        self._layer_api = _api()
        for lid in self.layer_ids:
            self._layer_api["set_layer_inp"](target._ptr, lid, True)
        target.on_decode = self.mirror

    def reset(self) -> None:
        self.ctx.clear()

    def _features(self, n: int) -> npt.NDArray[np.float32]:
        return target_layer_inputs(self._layer_api, self.target, self.layer_ids, n, self.n_embd_target, "DFlash")

    def mirror(self, tokens: Sequence[int], first: int) -> None:
        """The target just decoded ``tokens`` from ``first``: their features go in at the same positions (the last
        block's cells and any rejected positions are dropped first)."""
        ctx = self.ctx
        ctx.truncate(first)
        if ctx.n_past != first:
            self.gaps += 1  # the positions before this batch were never injected: no drafts until a fresh start
            return
        ctx.inject(tokens, self._features(len(tokens)))

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        settings: SamplingSettings,
        rng: np.random.Generator,
        recent: npt.NDArray[np.int64] | None = None,
    ) -> Draft:
        """Up to ``k`` tokens after ``tokens`` from one block. Tokens past the target's (an n-gram draft ahead of
        this one) take the block's first mask positions, and the drafter fills the rest."""
        draft = Draft()
        known = self.target.n_past
        ctx = self.ctx
        ahead = list(tokens[known:])  # the pending token, then any n-gram tokens
        k = min(k, self.max_depth - (len(ahead) - 1), ctx.n_ctx - len(tokens) - 1)
        if k <= 0 or not ahead:
            return draft
        ctx.truncate(known)
        if ctx.n_past != known or ctx.tokens != list(tokens[:known]):
            return draft  # the drafter's cache does not hold what the target holds: no blind draft
        t0 = time.perf_counter()
        first = len(ahead) - 1 if self.dspark else len(ahead)  # the row that predicts the first drafted token
        n_block = first + k
        rows = ctx.block([*ahead, *[ctx.mask] * (n_block - len(ahead))])
        draft.model_steps = 1
        history = list(recent) if recent is not None else []
        for i in range(k):
            if draft_step(draft, rows[first + i], settings, rng, history, self.p_min if i > 0 else 0.0) is None:
                break
        draft.model_seconds = time.perf_counter() - t0
        return draft
