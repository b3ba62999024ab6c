"""EAGLE-3 drafters (GGUF architecture ``eagle3``), driven as llama.cpp's common/speculative.cpp drives them.

An EAGLE-3 head is one decoder layer. It reads each token's embedding beside ``g``, a projection (``fc``, the
"encoder") of the inputs of three target layers at the position before. It borrows the target's token
embeddings and output matrix unless it has its own. As ``draft-eagle3`` does:

- the target keeps the inputs of the three layers named by the drafter (``llama_set_embeddings_layer_inp``);
- after every target decode the drafter encodes those rows into g, and its cache stores (token p + 1, g_p)
  at position p (``MTPDrafter`` with ``SHIFT`` 1);
- a draft starts at the pending token with g of the last kept position; each further step reads the token
  just drafted with the drafter's own pre-norm row of the step before.

Several misfits make llama.cpp abort the process rather than fail (a layer id past the target's layers, a
target architecture whose graph does not record layer inputs), so ``check_eagle3_pairing`` refuses them first,
in one sentence. The functions are looked up by their C++ names, as in app.engine.mtp.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np
import numpy.typing as npt

from app.engine.llama import Context, ContextParams, Model
from app.engine.mtp import _F32P, MTPContext, MTPDrafter
from app.errors import EngineLoadError, IncompatibleDrafterError
from app.library.gguf_reader import GGUFInfo
from app.library.heads import head_refusal

EAGLE3_ARCH = "eagle3"
_SYMBOLS = {
    "set_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                      [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None),
    "get_layer_inp": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj",
                      [ctypes.c_void_p, ctypes.c_uint32], _F32P),
    "layer_ids": ("_Z28llama_model_target_layer_idsPK11llama_model", [ctypes.c_void_p],
                  ctypes.POINTER(ctypes.c_int32)),
    "layer_ids_n": ("_Z30llama_model_target_layer_ids_nPK11llama_model", [ctypes.c_void_p], ctypes.c_uint32),
}
_funcs: dict[str, Any] = {}


def _api() -> dict[str, Any]:
    if not _funcs:
        lib = lc.llama_cpp._lib
        try:
            for name, (symbol, argtypes, restype) in _SYMBOLS.items():
                func = getattr(lib, symbol)
                func.argtypes = argtypes
                func.restype = restype
                _funcs[name] = func
        except AttributeError as exc:
            _funcs.clear()
            raise EngineLoadError(
                "This llama.cpp build does not export llama_set_embeddings_layer_inp and its siblings under the "
                "names SpecDeck looks for (GCC or Clang on Linux or macOS), so an EAGLE-3 drafter cannot draft "
                "here; choose another drafter."
            ) from exc
    return _funcs


def target_layer_inputs(api: dict[str, Any], target: Context, layer_ids: Sequence[int], n: int, width: int,
                        drafter: str) -> npt.NDArray[np.float32]:
    """The input rows of the chosen target layers for the target's last batch of ``n`` tokens, side by side:
    what an EAGLE-3 or DFlash drafter reads."""
    features = np.empty((n, len(layer_ids) * width), dtype=np.float32)
    for k, lid in enumerate(layer_ids):
        ptr = api["get_layer_inp"](target._ptr, lid)
        if not ptr:
            raise EngineLoadError(f"llama.cpp kept no input rows of target layer {lid} for the {drafter} drafter.")
        features[:, k * width : (k + 1) * width] = np.ctypeslib.as_array(ptr, shape=(n, width))
    return features


def target_layer_ids(drafter: Model) -> list[int]:
    """The target layers whose inputs this EAGLE-3 drafter reads, as llama.cpp loaded them."""
    api = _api()
    n = int(api["layer_ids_n"](drafter._ptr))
    ids = api["layer_ids"](drafter._ptr)
    return [int(ids[i]) for i in range(n)] if ids else []


def check_eagle3_pairing(target: Model, target_info: GGUFInfo, drafter: Model, drafter_info: GGUFInfo) -> list[int]:
    """The target layer ids to read, or a one-sentence refusal where this drafter cannot draft for this target:
    the header's facts as the picker checks them (``head_refusal``), then the layer ids as llama.cpp loaded them."""
    refusal = head_refusal(target_info, drafter_info)
    if refusal:
        raise IncompatibleDrafterError(refusal)
    ids = target_layer_ids(drafter)
    if len(ids) != 3 or any(not 0 <= lid < target.n_layer for lid in ids):
        raise IncompatibleDrafterError(
            f"{Path(drafter_info.path).name} reads target layers {ids}, but {Path(target_info.path).name} has "
            f"layers 0 to {target.n_layer - 1}."
        )
    return ids


class Eagle3Context(MTPContext):
    """The EAGLE-3 drafter's own context (its one layer's KV cache), with ``ctx_other`` the target's."""

    CTX_TYPE = 0
    WHAT = "the EAGLE-3 drafter"

    def __init__(self, model: Model, target: Context, params: ContextParams) -> None:
        super().__init__(model, target, params)
        self._enc_batch = self.new_batch()

    def encode(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """g for each row of ``features`` (the three target layers' inputs, side by side): its ``fc``."""
        features = np.ascontiguousarray(features, dtype=np.float32)
        n, width = features.shape
        out = np.empty((n, self.n_embd), dtype=np.float32)
        batch, ctx = self._enc_batch, self._ptr
        for start in range(0, n, self.n_batch):
            chunk = features[start : start + self.n_batch]
            lc.llama_batch_ext_clear(batch)
            for j in range(len(chunk)):
                embd = lc.llama_embd(chunk[j].ctypes.data_as(_F32P), 1, width)
                idx = lc.llama_batch_ext_add_embd(batch, 0, embd)
                self._pos[0] = self.n_past + j  # the encoder reads no positions; llama.cpp wants some
                if idx < 0 or not lc.llama_batch_ext_set_pos(batch, idx, self._pos):
                    raise EngineLoadError(f"llama.cpp refused a row of the EAGLE-3 encoder's batch (code {idx}).")
                lc.llama_batch_ext_set_output_logits(batch, idx, True)
            rc = lc.llama_process(ctx, lc.LLAMA_PROCESS_TYPE_ENCODE, batch)
            if rc != 0:
                raise EngineLoadError(f"llama.cpp failed to run the EAGLE-3 encoder on {len(chunk)} rows (code {rc}).")
            out[start : start + len(chunk)] = self.api.rows(self._ptr, len(chunk), self.n_embd)
        return out


class Eagle3Drafter(MTPDrafter):
    """An EAGLE-3 drafter in the model drafter's slot of the loop: the MTP driver, one position behind, with g
    (the encoded target layer inputs) in place of the target's final hidden rows."""

    SHIFT = 1

    def __init__(self, target: Context, ctx: Eagle3Context, layer_ids: Sequence[int], p_min: float = 0.1) -> None:
        self.layer_ids = list(layer_ids)
        self.n_embd_target = int(lc.llama_model_n_embd(target.model._ptr))
        self._layer_api = _api()
        super().__init__(target, ctx, p_min)

    def _enable_target_rows(self) -> None:
        for lid in self.layer_ids:
            self._layer_api["set_layer_inp"](self.target._ptr, lid, True)

    def _target_rows(self, n: int) -> npt.NDArray[np.float32]:
        features = target_layer_inputs(self._layer_api, self.target, self.layer_ids, n, self.n_embd_target, "EAGLE-3")
        assert isinstance(self.ctx, Eagle3Context)
        return self.ctx.encode(features)
