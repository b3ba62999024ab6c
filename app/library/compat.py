"""Can this drafter speculate for this target? llama.cpp's rule, with the reason when it fails.

Mirrors `common_speculative_are_compatible` (llama.cpp common/speculative.cpp): same vocab type; same
add-BOS flag and, when it is set, the same BOS id; the same for EOS; vocabulary sizes within 128; identical
token text from id 5 up to the smaller size. Independent of files: the library calls it with header values
and the engine with values read from the loaded llama.cpp vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.library.gguf_format import FINGERPRINT_START
from app.library.gguf_reader import VOCAB_TYPES, GGUFInfo

MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = FINGERPRINT_START  # SPEC_VOCAB_CHECK_START_TOKEN_ID

# llama_vocab_type enum values (llama.h) -> names
_VOCAB_TYPE_BY_ENUM = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
_VOCAB_LABEL = {
    "none": "no vocabulary", "spm": "SentencePiece (SPM)", "bpe": "byte-level BPE", "wpm": "WordPiece",
    "ugm": "Unigram (T5)", "rwkv": "RWKV", "plamo2": "PLaMo-2",
}

# CompatResult.check values
CHECK_VOCAB_TYPE = "vocab_type"
CHECK_BOS = "bos"
CHECK_EOS = "eos"
CHECK_VOCAB_SIZE = "vocab_size"
CHECK_TOKEN_TEXT = "token_text"


def vocab_type_name(value: int | str) -> str:
    """llama.cpp's vocab type name ("spm", "bpe", ...) from a llama_vocab_type enum value, a GGUF
    tokenizer.ggml.model string ("llama", "gpt2", ...) or a name already; "" for no tokenizer."""
    if isinstance(value, int):
        return _VOCAB_TYPE_BY_ENUM.get(value, f"type {value}")
    if value in _VOCAB_LABEL or value == "":
        return value
    return VOCAB_TYPES.get(value, value)


@dataclass(frozen=True)
class VocabInfo:
    vocab_type: str  # any form vocab_type_name() takes; compared after normalising
    n_vocab: int
    bos_id: int | None  # None (or negative, LLAMA_TOKEN_NULL) = no such token
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    fingerprint: str = ""  # gguf_reader.fingerprint_texts / GGUFInfo.token_fingerprint; "" = unknown

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> VocabInfo:
        return cls(
            vocab_type=info.vocab_type, n_vocab=info.n_vocab, bos_id=info.bos_id, eos_id=info.eos_id,
            add_bos=bool(info.add_bos), add_eos=bool(info.add_eos), fingerprint=info.token_fingerprint,
        )


@dataclass(frozen=True)
class CompatResult:
    ok: bool
    check: str  # the failing check ("vocab_type", "bos", "eos", "vocab_size", "token_text"); "" when ok
    reason: str  # one sentence naming both values when it fails, how it was decided when it passes
    confirmed: bool = True  # False: passed every check it could, but token texts still need comparing


def _token(token_id: int | None) -> int | None:
    return None if token_id is None or token_id < 0 else token_id


def _show(token_id: int | None) -> str:
    return "none" if token_id is None else str(token_id)


def _text(s: str) -> str:
    shown = repr(s)
    return shown if len(shown) <= 40 else shown[:37] + "…"


def _special(kind: str, tgt_add: bool, dft_add: bool, tgt_id: int | None, dft_id: int | None) -> str | None:
    if tgt_add != dft_add:
        who = "target" if tgt_add else "drafter"
        other = "drafter" if tgt_add else "target"
        return (f"the {who} adds a {kind} token to every prompt and the {other} does not "
                f"(add_{kind.lower()} {str(tgt_add).lower()} vs {str(dft_add).lower()})")
    if tgt_add and tgt_id != dft_id:
        return f"{kind} token ids differ ({_show(tgt_id)} vs {_show(dft_id)})"
    return None


def check_compatible(
    target: VocabInfo,
    drafter: VocabInfo,
    target_texts: Sequence[str] | None = None,
    drafter_texts: Sequence[str] | None = None,
) -> CompatResult:
    """llama.cpp's compatibility rule. Token texts, when both are given, decide the last check exactly;
    otherwise equal sizes and equal fingerprints decide it, and a pass that could not be decided comes back
    with confirmed=False."""
    t_type, d_type = vocab_type_name(target.vocab_type), vocab_type_name(drafter.vocab_type)
    if t_type != d_type:
        return CompatResult(False, CHECK_VOCAB_TYPE, (
            f"vocabulary types differ (target {_VOCAB_LABEL.get(t_type, t_type or 'none')}, drafter "
            f"{_VOCAB_LABEL.get(d_type, d_type or 'none')}); llama.cpp needs the same tokenizer type"))
    bad = _special("BOS", target.add_bos, drafter.add_bos, _token(target.bos_id), _token(drafter.bos_id))
    if bad:
        return CompatResult(False, CHECK_BOS, bad)
    bad = _special("EOS", target.add_eos, drafter.add_eos, _token(target.eos_id), _token(drafter.eos_id))
    if bad:
        return CompatResult(False, CHECK_EOS, bad)
    diff = abs(target.n_vocab - drafter.n_vocab)
    if diff > MAX_SIZE_DIFFERENCE:
        return CompatResult(False, CHECK_VOCAB_SIZE, (
            f"vocabulary sizes differ by {diff} ({target.n_vocab} vs {drafter.n_vocab}); llama.cpp allows "
            f"at most {MAX_SIZE_DIFFERENCE}"))
    n = min(target.n_vocab, drafter.n_vocab)

    if target_texts is not None and drafter_texts is not None:
        n = min(n, len(target_texts), len(drafter_texts))
        start = CHECK_START_TOKEN_ID
        if list(target_texts[start:n]) != list(drafter_texts[start:n]):
            i = next(i for i in range(start, n) if target_texts[i] != drafter_texts[i])
            return CompatResult(False, CHECK_TOKEN_TEXT, (
                f"token {i} differs (target {_text(target_texts[i])}, drafter {_text(drafter_texts[i])}); "
                f"llama.cpp needs identical token texts from id {start} on"))
        return CompatResult(True, "", _passed(diff, "compared on the real token texts"))

    if n <= CHECK_START_TOKEN_ID:
        return CompatResult(True, "", _passed(diff, "no token texts to compare"))
    if diff == 0 and target.fingerprint and drafter.fingerprint:
        if target.fingerprint == drafter.fingerprint:
            return CompatResult(True, "", _passed(0, "identical token-text fingerprints"))
        return CompatResult(False, CHECK_TOKEN_TEXT, (
            f"token texts differ from id {CHECK_START_TOKEN_ID} on (fingerprints "
            f"{target.fingerprint[:12]}… vs {drafter.fingerprint[:12]}…); llama.cpp needs identical texts"))
    return CompatResult(True, "", (
        f"vocabulary sizes differ by {diff} ({target.n_vocab} vs {drafter.n_vocab}), within llama.cpp's "
        f"{MAX_SIZE_DIFFERENCE}; the token texts up to {n} still need comparing"), confirmed=False)


def _passed(diff: int, how: str) -> str:
    sizes = "same size" if diff == 0 else f"sizes {diff} apart (within {MAX_SIZE_DIFFERENCE})"
    return (f"same vocabulary type, BOS/EOS handling and token texts from id {CHECK_START_TOKEN_ID} on, "
            f"{sizes} ({how})")
