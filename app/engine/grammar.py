"""Structured output: llama.cpp's grammar sampler as a mask on the target's logits rows.

``response_format`` (``SamplingSettings``) is "" (free text), ``JSON_OBJECT`` (any JSON object) or a JSON Schema
document, turned into GBNF by llama-cpp-python's converter (the one llama-server's Python twin uses).

Speculation stays exact: each row of a verify pass is masked with the grammar's state after the draft tokens
before it, so the target's distribution at every position is the constrained one, and a drafted token the
grammar forbids has probability 0 there and is rejected like any other. The grammar itself advances only by
the tokens actually emitted. Drafters are not constrained: they only propose.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine.native import Native, own
from app.engine.schema_limits import schema_grammar
from app.errors import SettingsError
from app.params import JSON_OBJECT

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def grammar_text(response_format: str) -> str:
    """The GBNF for a ``SamplingSettings.response_format``; SettingsError names what is refused. Every schema goes
    through app.engine.schema_limits: its counts, patterns, alternatives and the grammar's size are bounded
    there, before llama.cpp's parser and sampler see it."""
    if response_format == JSON_OBJECT:
        from llama_cpp.llama_grammar import JSON_GBNF

        return str(JSON_GBNF)
    return schema_grammar(response_format)


class GrammarMask:
    """One answer's grammar state over ``vocab`` (a llama_vocab pointer) of ``n_vocab`` tokens."""

    def __init__(self, vocab: Any, n_vocab: int, response_format: str, vocab_owner: Native) -> None:
        """``vocab_owner``: the model's ``Native``; the sampler reads its vocabulary, so it is freed first."""
        import llama_cpp as lc

        self._lc = lc
        vocab_owner.get()
        sampler = lc.llama_sampler_init_grammar(vocab, grammar_text(response_format).encode(), b"root")
        if not sampler:
            raise SettingsError("llama.cpp refused the grammar made from the response format.")
        self._native = own(self, Native(sampler, lc.llama_sampler_free, "the grammar sampler", (vocab_owner,)))
        self.n_vocab = n_vocab
        self._buffer = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._buffer["id"] = np.arange(n_vocab, dtype=np.int32)
        self._array = lc.llama_token_data_array(
            data=self._buffer.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), size=n_vocab, selected=-1,
            sorted=False)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._one_array = lc.llama_token_data_array(
            data=self._one.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), size=1, selected=-1, sorted=False)

    @property
    def _sampler(self) -> Any:
        return self._native.get()

    def allowed(self, sampler: Any, row: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        self._buffer["logit"] = row
        self._array.size = row.size
        self._array.selected = -1
        self._array.sorted = False
        self._lc.llama_sampler_apply(sampler, ctypes.byref(self._array))
        logits: npt.NDArray[np.float32] = self._buffer["logit"]
        return np.asarray(logits != -np.inf)  # the grammar sets what it forbids to -inf, in place

    def allows(self, sampler: Any, token: int) -> bool:
        """Whether the grammar state ``sampler`` allows ``token`` next: the grammar asked about one candidate."""
        one = self._one
        one[0] = (token, 0.0, 0.0)
        self._one_array.size = 1
        self._one_array.selected = -1
        self._lc.llama_sampler_apply(sampler, ctypes.byref(self._one_array))
        return bool(one[0]["logit"] != -np.inf)

    def mask_rows(self, rows: npt.NDArray[np.float32], draft: Sequence[int],
                  pick: Callable[[int, npt.NDArray[np.float32]], int] | None = None) -> npt.NDArray[np.float32]:
        """``rows`` (the verify pass: the pending token's row, then one per draft token) with every token the
        grammar forbids at that position set to -inf. Row i is masked with the state after ``draft[:i]``; the
        rows after the first forbidden draft token are never read (that token is rejected) and stay as they are.

        ``pick`` (greedy answers): the token row i would give unmasked. Where the grammar allows it, the row
        stays as it is, since its masked argmax is that same token: one candidate asked instead of the whole
        vocabulary, as llama.cpp's own sampler does."""
        out = np.array(rows, dtype=np.float32, copy=True)
        lc = self._lc
        cursor = self._sampler
        clone = None
        try:
            for i in range(out.shape[0]):
                picked = pick(i, out[i]) if pick is not None else None
                if picked is not None and self.allows(cursor, picked):
                    if i >= len(draft) or draft[i] != picked:
                        break  # the pick is the answer here: a different draft token is rejected
                else:
                    allowed = self.allowed(cursor, out[i])
                    out[i][~allowed] = -np.inf
                    if i >= len(draft) or not allowed[draft[i]]:
                        break
                if clone is None:
                    clone = cursor = lc.llama_sampler_clone(self._sampler)
                lc.llama_sampler_accept(cursor, int(draft[i]))
        finally:
            if clone is not None:
                lc.llama_sampler_free(clone)
        return out

    def accept(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._lc.llama_sampler_accept(self._sampler, int(token))

    def close(self) -> None:
        self._native.close()
