"""llama.cpp's drafter compatibility rule, decided from headers and confirmed on real token texts, and the
drafter ranking built on it."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import pytest

from app.ceiling.speculation import expected_speedup
from app.library.compat import VocabInfo, check_compatible, vocab_type_name
from app.library.gguf_reader import GGUFInfo, read_gguf_info, read_token_texts
from app.measure.recommend import (
    DEFAULT_ACCEPTANCE,
    NGRAM_KEY,
    best_k,
    expected_tokens_per_pass,
    recommend_drafters,
)


def vocab(n: int = 1000, **kw: object) -> VocabInfo:
    base: dict[str, object] = {"vocab_type": "gpt2", "n_vocab": n, "bos_id": 1, "eos_id": 2, "add_bos": True,
                               "add_eos": False, "fingerprint": "f" * 64}
    base.update(kw)
    return VocabInfo(**base)  # type: ignore[arg-type]


# --- the rule on synthetic values ---------------------------------------------------------------------


def test_vocab_type_names_agree_across_forms() -> None:
    assert vocab_type_name("llama") == vocab_type_name(1) == vocab_type_name("spm") == "spm"
    assert vocab_type_name("gpt2") == vocab_type_name(2) == "bpe"
    assert check_compatible(vocab(vocab_type="gpt2"), vocab(vocab_type=2)).ok


def test_vocab_type_mismatch() -> None:
    r = check_compatible(vocab(vocab_type="llama"), vocab(vocab_type="gpt2"))
    assert (r.ok, r.check) == (False, "vocab_type")
    assert "SentencePiece (SPM)" in r.reason
    assert "byte-level BPE" in r.reason


def test_bos_rules() -> None:
    r = check_compatible(vocab(add_bos=True), vocab(add_bos=False))
    assert (r.ok, r.check) == (False, "bos")
    assert "the target adds a BOS token" in r.reason
    assert "add_bos true vs false" in r.reason
    r = check_compatible(vocab(bos_id=1), vocab(bos_id=7))
    assert (r.ok, r.check, r.reason) == (False, "bos", "BOS token ids differ (1 vs 7)")
    # llama.cpp compares BOS ids only when BOS is added.
    assert check_compatible(vocab(add_bos=False, bos_id=1), vocab(add_bos=False, bos_id=7)).ok
    # LLAMA_TOKEN_NULL (-1) from the engine means "none", like None from a header.
    r = check_compatible(vocab(bos_id=-1), vocab(bos_id=None))
    assert r.ok


def test_eos_rules() -> None:
    r = check_compatible(vocab(add_eos=True, eos_id=2), vocab(add_eos=True, eos_id=3))
    assert (r.ok, r.check, r.reason) == (False, "eos", "EOS token ids differ (2 vs 3)")
    assert check_compatible(vocab(eos_id=2), vocab(eos_id=3)).ok


def test_size_difference_limit() -> None:
    r = check_compatible(vocab(262144), vocab(49152))
    assert (r.ok, r.check) == (False, "vocab_size")
    assert r.reason == "vocabulary sizes differ by 212992 (262144 vs 49152); llama.cpp allows at most 128"
    assert not check_compatible(vocab(1129), vocab(1000)).ok
    r = check_compatible(vocab(1128), vocab(1000))
    assert r.ok
    assert not r.confirmed
    assert "still need comparing" in r.reason


def test_fingerprints_decide_equal_sizes() -> None:
    assert check_compatible(vocab(), vocab()).confirmed
    r = check_compatible(vocab(), vocab(fingerprint="e" * 64))
    assert (r.ok, r.check) == (False, "token_text")
    assert "ffffffffffff… vs eeeeeeeeeeee…" in r.reason
    assert not check_compatible(vocab(), vocab(fingerprint="")).confirmed


def test_texts_decide_from_id_5_up_to_the_smaller_size() -> None:
    texts = [f"t{i}" for i in range(10)]
    longer = [*texts, "pad0", "pad1"]
    r = check_compatible(vocab(10), vocab(12), texts, longer)
    assert r.ok
    assert r.confirmed
    assert "real token texts" in r.reason
    below_five = ["X", *texts[1:]]
    assert check_compatible(vocab(10), vocab(10), texts, below_five).ok
    changed = [*texts[:7], "other", *texts[8:]]
    r = check_compatible(vocab(10), vocab(12), texts, [*changed, "p", "q"])
    assert (r.ok, r.check) == (False, "token_text")
    assert r.reason.startswith("token 7 differs (target 't7', drafter 'other')")


# --- real files ---------------------------------------------------------------------------------------


def test_identical_vocab_fixtures_accepted(tiny_target: Path, tiny_drafter_same: Path,
                                           tiny_drafter_perturbed: Path) -> None:
    t = read_gguf_info(tiny_target)
    for path in (tiny_drafter_same, tiny_drafter_perturbed):
        d = read_gguf_info(path)
        assert d.token_fingerprint == t.token_fingerprint
        r = check_compatible(VocabInfo.from_gguf(t), VocabInfo.from_gguf(d))
        assert r.ok
        assert r.confirmed
        r = check_compatible(VocabInfo.from_gguf(t), VocabInfo.from_gguf(d), read_token_texts(tiny_target),
                             read_token_texts(path))
        assert r.ok
        assert r.confirmed


def test_other_vocab_fixture_refused(tiny_target: Path, tiny_drafter_other_vocab: Path) -> None:
    t, d = read_gguf_info(tiny_target), read_gguf_info(tiny_drafter_other_vocab)
    r = check_compatible(VocabInfo.from_gguf(t), VocabInfo.from_gguf(d))
    assert (r.ok, r.check) == (False, "token_text")
    r = check_compatible(VocabInfo.from_gguf(t), VocabInfo.from_gguf(d), read_token_texts(tiny_target),
                         read_token_texts(tiny_drafter_other_vocab))
    assert (r.ok, r.check) == (False, "token_text")
    assert r.reason.startswith("token 268 differs")


@pytest.mark.demo
def test_gemma_and_smollm2_refused_with_the_reason(demo_models: tuple[Path, Path]) -> None:
    smollm2, gemma = (VocabInfo.from_gguf(read_gguf_info(p)) for p in demo_models)
    for target, drafter in ((gemma, smollm2), (smollm2, gemma)):
        r = check_compatible(target, drafter)
        assert (r.ok, r.check) == (False, "vocab_type")
    r = check_compatible(gemma, smollm2)
    assert r.reason == ("vocabulary types differ (target SentencePiece (SPM), drafter byte-level BPE); "
                        "llama.cpp needs the same tokenizer type")
    # With the type check passed, the sizes would refuse them next, as llama.cpp does.
    r = check_compatible(gemma, VocabInfo(**{**smollm2.__dict__, "vocab_type": "llama", "add_bos": True,
                                             "bos_id": 2, "eos_id": 1}))
    assert r.check == "vocab_size"
    assert "differ by 212992 (262144 vs 49152)" in r.reason


@pytest.mark.demo
def test_header_values_match_llama_cpp_loaded_vocab(demo_models: tuple[Path, Path], tiny_target: Path,
                                                    tiny_drafter_other_vocab: Path) -> None:
    """The rule on header values gives llama.cpp's answer on the values it loads (vocab_only)."""
    import llama_cpp as llama

    @llama.llama_log_callback  # type: ignore[misc]
    def quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        pass

    llama.llama_log_set(quiet, ctypes.c_void_p(0))
    llama.llama_backend_init()

    def loaded(path: Path) -> tuple[VocabInfo, list[str]]:
        params = llama.llama_model_default_params()
        params.vocab_only = True
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        assert model
        try:
            v = llama.llama_model_get_vocab(model)
            n = llama.llama_vocab_n_tokens(v)
            texts = [llama.llama_vocab_get_text(v, i).decode("utf-8", "surrogateescape") for i in range(n)]
            info = VocabInfo(llama.llama_vocab_type(v), n, llama.llama_vocab_bos(v), llama.llama_vocab_eos(v),
                             llama.llama_vocab_get_add_bos(v), llama.llama_vocab_get_add_eos(v))
            return info, texts
        finally:
            llama.llama_model_free(model)

    paths = [*demo_models, tiny_target, tiny_drafter_other_vocab]
    headers = {p: read_gguf_info(p) for p in paths}
    real = {p: loaded(p) for p in paths}
    for p in paths:
        h, (v, texts) = headers[p], real[p]
        assert (vocab_type_name(h.vocab_type), h.n_vocab, h.bos_id, h.eos_id, h.add_bos, h.add_eos) == (
            vocab_type_name(v.vocab_type), v.n_vocab, v.bos_id, v.eos_id, v.add_bos, v.add_eos)
        assert read_token_texts(p) == texts
    for t in paths:
        for d in paths:
            from_headers = check_compatible(VocabInfo.from_gguf(headers[t]), VocabInfo.from_gguf(headers[d]))
            from_llama = check_compatible(real[t][0], real[d][0], real[t][1], real[d][1])
            pair = (t.name, d.name)
            assert (from_headers.ok, from_headers.check) == (from_llama.ok, from_llama.check), pair


# --- recommendations ----------------------------------------------------------------------------------


def test_leviathan_arithmetic() -> None:
    assert expected_tokens_per_pass(0.6, 4) == pytest.approx((1 - 0.6**5) / 0.4)
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_speedup(0.8, 3, 0.1) == pytest.approx((1 - 0.8**4) / 0.2 / 1.3)
    k, s = best_k(0.8, 0.05, 16)
    assert s == max(expected_speedup(0.8, j, 0.05) for j in range(1, 17))
    assert expected_speedup(0.8, k, 0.05) == s
    assert best_k(0.9, 0.0, 16)[0] == 16  # a free drafter drafts as deep as allowed


def _info(path: str, tensor_bytes: int, **kw: object) -> GGUFInfo:
    base: dict[str, object] = {
        "path": path, "file_size": tensor_bytes + 1000, "version": 3, "kind": "model",
        "architecture": "llama",
        "name": Path(path).stem, "n_params": tensor_bytes, "tensor_bytes": tensor_bytes, "file_type": 15,
        "quantization": "Q4_K_M", "context_length": 4096, "n_layer": 2, "n_embd": 64, "n_head": 4,
        "n_head_kv": 2, "head_dim_k": 16, "head_dim_v": 16, "sliding_window": 0, "swa_layers": (False, False),
        "vocab_type": "gpt2", "n_vocab": 1000, "bos_id": 1, "eos_id": 2, "add_bos": True, "add_eos": False,
        "token_fingerprint": "a" * 64, "has_chat_template": False, "chat_template": None,
    }
    base.update(kw)
    return GGUFInfo(**base)  # type: ignore[arg-type]


def test_drafters_ranked_by_predicted_speedup() -> None:
    target = _info("/m/big.gguf", 8_000_000_000)
    small = _info("/m/small.gguf", 400_000_000)
    medium = _info("/m/medium.gguf", 1_600_000_000)
    other_vocab = _info("/m/other.gguf", 100_000_000, token_fingerprint="b" * 64)
    mmproj = _info("/m/proj.gguf", 100_000_000, kind="mmproj")
    recs = recommend_drafters(target, [medium, other_vocab, target, small, mmproj])
    assert [r.drafter_path for r in recs] == ["/m/small.gguf", "/m/medium.gguf", None]
    first = recs[0]
    assert first.cost_ratio == pytest.approx(0.05)
    assert (first.acceptance, first.acceptance_source) == (DEFAULT_ACCEPTANCE, "default")
    assert (first.best_k, first.speedup) == best_k(DEFAULT_ACCEPTANCE, 0.05)
    assert first.tokens_per_pass == pytest.approx(expected_tokens_per_pass(DEFAULT_ACCEPTANCE, first.best_k))
    assert recs[-1].kind == "ngram"
    assert recs[-1].cost_ratio == 0.0


def test_measured_acceptance_changes_the_ranking() -> None:
    target = _info("/m/big.gguf", 8_000_000_000)
    small = _info("/m/small.gguf", 400_000_000)
    medium = _info("/m/medium.gguf", 1_600_000_000)
    measured = {("/m/big.gguf", "/m/small.gguf"): 0.2, ("/m/big.gguf", "/m/medium.gguf"): 0.95,
                ("/m/big.gguf", NGRAM_KEY): 0.5}
    recs = recommend_drafters(target, [small, medium], measured)
    assert [r.drafter_path for r in recs] == ["/m/medium.gguf", "/m/small.gguf", None]
    assert (recs[0].acceptance, recs[0].acceptance_source) == (0.95, "measured")
    assert (recs[-1].acceptance, recs[-1].acceptance_source) == (0.5, "measured")
    # A measurement that is not a probability is ignored.
    bad = {("/m/big.gguf", "/m/small.gguf"): math.nan}
    assert recommend_drafters(target, [small], bad)[0].acceptance_source == "default"


def test_ngram_is_listed_even_without_candidates() -> None:
    recs = recommend_drafters(_info("/m/big.gguf", 1000), [])
    assert len(recs) == 1
    assert recs[0].kind == "ngram"
    assert recs[0].drafter_path is None
    assert recs[0].speedup > 1.0


def test_a_drafter_as_large_as_the_target_is_flagged() -> None:
    target = _info("/m/a.gguf", 1000)
    twin = _info("/m/b.gguf", 1000)
    rec = recommend_drafters(target, [twin])[0]
    assert (rec.best_k, rec.speedup) == (0, 1.0)  # as the depth policy would: no depth beats plain decoding
    assert "not smaller than the target" in rec.note
