"""The tiny GGUF fixtures load and decode in llama.cpp and relate to each other as other tests assume."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import jinja2.sandbox
import llama_cpp as L
import numpy as np
import pytest

from tests.gguf_fixtures import (
    BYTES_BOS_ID,
    BYTES_EOS_ID,
    BYTES_EOT_ID,
    BYTES_FIRST_BYTE_ID,
    BYTES_SPECIALS,
    BYTES_VOCAB_SIZE,
    DEFAULT_TEMPLATE,
    SMOLLM2_VOCAB_SIZE,
    gpt2_byte_to_unicode,
    write_tiny_model,
)

PROMPTS = (
    "Hello, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x): return x * 2",
    "<|im_start|>user\nWrite a poem about the sea<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time there was",
)


@L.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    pass


L.llama_log_set(_quiet_log, ctypes.c_void_p(0))
L.llama_backend_init()


class Tiny:
    """Just enough of llama.cpp's low-level API to test fixtures (the engine has its own wrapper)."""

    def __init__(self, path: Path, n_ctx: int = 512) -> None:
        self.model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        assert self.model, f"llama.cpp could not load {path}"
        params = L.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        # One thread: with more, ggml's spinning thread barrier can slow a tiny model 100-1000x whenever
        # the cores are busy with something else (another test process, a compiler).
        params.n_threads = params.n_threads_batch = 1
        self.ctx = L.llama_init_from_model(self.model, params)
        assert self.ctx
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.batch = L.llama_batch_init(n_ctx, 0, 1)

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), add_special, True)
        assert n >= 0
        return list(buf[:n])

    def text(self, token: int) -> str:
        return L.llama_vocab_get_text(self.vocab, token).decode("utf-8")

    def reset(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list[int], start: int, all_logits: bool = False) -> np.ndarray:
        """Decode `tokens` at positions start.. ; logits of every position or of the last one only."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits or i == len(tokens) - 1
        assert L.llama_decode(self.ctx, b) == 0
        if all_logits:
            ptr = L.llama_get_logits(self.ctx)
            return np.ctypeslib.as_array(ptr, shape=(len(tokens), self.n_vocab)).copy()
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()

    def greedy(self, prompt: str, n: int) -> tuple[list[int], list[int]]:
        self.reset()
        tokens = self.tokenize(prompt)
        logits = self.decode(tokens, 0)
        out: list[int] = []
        for i in range(n):
            out.append(int(np.argmax(logits)))
            logits = self.decode([out[-1]], len(tokens) + i)
        return tokens, out

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        self.reset()
        return self.decode(tokens, 0, all_logits=True)


@contextmanager
def loaded(path: Path) -> Iterator[Tiny]:
    tiny = Tiny(path)
    try:
        yield tiny
    finally:
        tiny.close()


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def tensor_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


def test_tiny_target_loads_decodes_and_varies(tiny_target: Path) -> None:
    with loaded(tiny_target) as m:
        assert m.n_vocab == BYTES_VOCAB_SIZE == 269
        outputs = [m.greedy(p, 32)[1] for p in PROMPTS]
    for out in outputs:
        assert len(set(out)) >= 5, out  # greedy output is not one token over and over
        assert not set(out) & set(range(len(BYTES_SPECIALS))), "control tokens should be very unlikely"
    assert len({tuple(o) for o in outputs}) == len(outputs), "greedy output should depend on the prompt"


def test_distribution_is_peaked_but_not_degenerate(tiny_target: Path) -> None:
    with loaded(tiny_target) as m:
        tokens, out = m.greedy(PROMPTS[1], 48)
        probs = softmax(m.all_logits(tokens + out))
    top1 = probs.max(axis=1)
    entropy = -(probs * np.log(probs + 1e-30)).sum(axis=1)
    assert np.isfinite(probs).all()
    assert 0.3 < top1.mean() < 0.85, top1.mean()  # peaked, yet several tokens share the mass
    assert 0.5 < entropy.mean() < 3.5, entropy.mean()  # far below uniform: log(269) = 5.6
    assert (np.sort(probs, axis=1)[:, -3:].sum(axis=1) > 0.5).mean() > 0.5
    assert probs[:, : len(BYTES_SPECIALS)].max() < 1e-3


def test_bytes_vocab_metadata(tiny_target: Path) -> None:
    with loaded(tiny_target) as m:
        assert L.llama_vocab_type(m.vocab) == L.LLAMA_VOCAB_TYPE_BPE
        assert L.llama_vocab_bos(m.vocab) == BYTES_BOS_ID
        assert L.llama_vocab_eos(m.vocab) == BYTES_EOS_ID
        assert L.llama_vocab_eot(m.vocab) == BYTES_EOT_ID
        assert L.llama_vocab_get_add_bos(m.vocab)
        assert not L.llama_vocab_get_add_eos(m.vocab)
        for tok, text in enumerate(BYTES_SPECIALS):
            assert m.text(tok) == text
            assert L.llama_vocab_get_attr(m.vocab, tok) & L.LLAMA_TOKEN_ATTR_CONTROL
        b2u = gpt2_byte_to_unicode()
        assert [m.text(BYTES_FIRST_BYTE_ID + b) for b in range(256)] == [b2u[b] for b in range(256)]
        assert L.llama_vocab_is_eog(m.vocab, BYTES_EOS_ID)
        assert L.llama_vocab_is_eog(m.vocab, BYTES_EOT_ID)
        # Specials are parsed, merges are applied, and BOS is added.
        tokens = m.tokenize("<|im_start|>user\nin the<|im_end|>")
        assert [m.text(t) for t in tokens] == ["<|bos|>", "<|im_start|>", "u", "s", "er", "Ċ", "in", "Ġthe",
                                                "<|im_end|>"]
        assert L.llama_model_chat_template(m.model, None).decode() == DEFAULT_TEMPLATE
        assert L.llama_model_n_ctx_train(m.model) == 4096
        assert L.llama_model_n_embd(m.model) == 64
        assert L.llama_model_n_layer(m.model) == 2

    fields = gguf.GGUFReader(tiny_target).fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["general.name"].contents() == "tiny-target"
    assert fields["llama.attention.head_count_kv"].contents() == 2
    assert set(tensor_types(tiny_target).values()) == {"F32"}


def test_chat_template_renders_to_control_tokens(tiny_target: Path) -> None:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment()
    text = env.from_string(DEFAULT_TEMPLATE).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with loaded(tiny_target) as m:
        tokens = m.tokenize(text)
    assert tokens.count(2) == 2
    assert tokens.count(3) == 1


def test_no_chat_template(tiny_model_factory: Callable[..., Path]) -> None:
    with loaded(tiny_model_factory(chat_template=None)) as m:
        assert L.llama_model_chat_template(m.model, None) is None


def test_identical_drafter_gives_identical_logits(tiny_target: Path, tiny_drafter_same: Path) -> None:
    target_w, drafter_w = tensors(tiny_target), tensors(tiny_drafter_same)
    assert target_w.keys() == drafter_w.keys()
    for name, tensor in target_w.items():
        assert np.array_equal(tensor, drafter_w[name]), name
    with loaded(tiny_target) as t, loaded(tiny_drafter_same) as d:
        for prompt in PROMPTS[:3]:
            tokens, out = t.greedy(prompt, 16)
            assert np.array_equal(t.all_logits(tokens + out), d.all_logits(tokens + out))
            assert d.greedy(prompt, 16)[1] == out


def test_perturbed_drafter_agrees_partially(tiny_target: Path, tiny_drafter_perturbed: Path) -> None:
    agree = []
    with loaded(tiny_target) as t, loaded(tiny_drafter_perturbed) as d:
        assert d.n_vocab == t.n_vocab
        for prompt in PROMPTS:
            tokens, out = t.greedy(prompt, 64)
            seq = tokens + out
            n = len(tokens)
            target_next = t.all_logits(seq)[n - 1 : -1].argmax(axis=1)
            drafter_logits = d.all_logits(seq)
            assert not np.allclose(drafter_logits, t.all_logits(seq))
            agree.append(float((drafter_logits[n - 1 : -1].argmax(axis=1) == target_next).mean()))
    rate = float(np.mean(agree))
    assert 0.3 <= rate <= 0.8, f"greedy acceptance {rate:.2f} ({agree})"


def test_perturb_is_deterministic_and_seeded(tiny_model_factory: Callable[..., Path]) -> None:
    a = tensors(tiny_model_factory(perturb=0.3, perturb_seed=5))
    b = tensors(tiny_model_factory(perturb=0.3, perturb_seed=5))
    c = tensors(tiny_model_factory(perturb=0.3, perturb_seed=6))
    base = tensors(tiny_model_factory())
    for name in base:
        assert np.array_equal(a[name], b[name])
        assert not np.array_equal(a[name], c[name])
        assert not np.array_equal(a[name], base[name])
        rel = np.sqrt(np.mean((a[name] - base[name]) ** 2) / np.mean(base[name] ** 2))
        assert 0.2 < rel < 0.4, (name, rel)


def test_other_vocab_differs_from_id_5_on(tiny_target: Path, tiny_drafter_other_vocab: Path) -> None:
    with loaded(tiny_target) as t, loaded(tiny_drafter_other_vocab) as d:
        assert t.n_vocab == d.n_vocab
        assert L.llama_vocab_type(t.vocab) == L.llama_vocab_type(d.vocab)
        assert L.llama_vocab_bos(t.vocab) == L.llama_vocab_bos(d.vocab)
        assert L.llama_vocab_eos(t.vocab) == L.llama_vocab_eos(d.vocab)
        assert L.llama_vocab_get_add_bos(t.vocab) == L.llama_vocab_get_add_bos(d.vocab)
        differing = [i for i in range(5, t.n_vocab) if t.text(i) != d.text(i)]
        assert differing == [BYTES_VOCAB_SIZE - 1]
        assert [t.text(i) for i in range(5)] == [d.text(i) for i in range(5)]
        _, out = d.greedy("plain text", 8)
        assert len(out) == 8


def test_every_tensor_is_float32(tiny_model_factory: Callable[..., Path]) -> None:
    for kwargs in ({}, {"perturb": 0.5}, {"vocab": "bytes-alt", "n_embd": 32, "n_head": 2, "n_head_kv": 1}):
        assert set(tensor_types(tiny_model_factory(**kwargs)).values()) == {"F32"}, kwargs


def test_factory_shapes_load(tiny_model_factory: Callable[..., Path]) -> None:
    path = tiny_model_factory("small.gguf", n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=64,
                              n_ctx_train=256, seed=3, name="small")
    assert path.name == "small.gguf"
    with loaded(path) as m:
        assert L.llama_model_n_embd(m.model) == 32
        assert L.llama_model_n_layer(m.model) == 1
        assert L.llama_model_n_ctx_train(m.model) == 256
        assert len(m.greedy("abc", 8)[1]) == 8


def test_write_is_reproducible(tiny_model_factory: Callable[..., Path]) -> None:
    assert tiny_model_factory("a.gguf").read_bytes() == tiny_model_factory("b.gguf").read_bytes()
    assert tiny_model_factory("c.gguf").read_bytes() != tiny_model_factory("d.gguf", seed=1).read_bytes()


def test_unknown_vocab_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown vocab"):
        write_tiny_model(tmp_path / "x.gguf", vocab="nope")


@pytest.mark.demo
def test_smollm2_vocab_matches_demo_model(
    demo_models: tuple[Path, Path], tiny_model_factory: Callable[..., Path]
) -> None:
    smollm2, gemma = demo_models
    assert smollm2.is_file()
    assert gemma.is_file()
    path = tiny_model_factory("smol-vocab.gguf", vocab="smollm2")
    with loaded(smollm2) as real, loaded(path) as tiny:
        assert real.n_vocab == tiny.n_vocab == SMOLLM2_VOCAB_SIZE
        for fn in (L.llama_vocab_bos, L.llama_vocab_eos, L.llama_vocab_get_add_bos, L.llama_vocab_type):
            assert fn(real.vocab) == fn(tiny.vocab), fn.__name__
        assert all(real.text(i) == tiny.text(i) for i in range(tiny.n_vocab))
        text = "<|im_start|>user\nHello, world! Speculative decoding is fun.<|im_end|>\n"
        assert real.tokenize(text) == tiny.tokenize(text)
        _, out = tiny.greedy("Hello", 16)
        assert len(set(out)) > 3


def test_specdeck_home_keeps_models_dir(specdeck_home: Path) -> None:
    from app import paths

    assert paths.config_dir().is_relative_to(specdeck_home)
    assert paths.data_dir().is_relative_to(specdeck_home)
    assert not paths.models_dir().is_relative_to(specdeck_home)
