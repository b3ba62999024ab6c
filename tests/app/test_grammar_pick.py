"""The greedy grammar path asks the grammar about one token per row; its answers are those of the full mask."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.adaptive import DepthController
from app.engine.grammar import GrammarMask
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.speculative import SpeculativeDecoder
from app.engine.suffix_tree import SuffixDrafter
from app.events import PassStats, Token
from app.params import JSON_OBJECT, SamplingSettings

PARAMS = ContextParams(n_ctx=512, n_batch=64, n_threads=1)
YES_NO = json.dumps({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
                     "required": ["answer"], "additionalProperties": False})
PROMPT = 'As JSON: {"answer": "yes", "n": 12} {"answer": "no", "n": 3} {"answer":'


@pytest.fixture(scope="module")
def target(tiny_target: Path) -> Iterator[tuple[Model, Context]]:
    init_backend(None)
    model = Model(tiny_target, n_gpu_layers=0)
    ctx = Context(model, PARAMS)
    yield model, ctx
    model.close()


def full_mask_answer(model: Model, ctx: Context, prompt: list[int], response_format: str, n: int,
                     penalty: float) -> list[int]:
    """Greedy decoding one token at a time, every row masked over the whole vocabulary."""
    grammar = GrammarMask(model.vocab, model.n_vocab, response_format, model.native)
    ctx.clear()
    row = np.array(ctx.prefill(prompt)[-1])
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(n):
        row[~grammar.allowed(grammar._sampler, row)] = -np.inf
        if penalty != 1.0:
            recent = np.unique(np.array(tokens[-64:]))
            row[recent] = np.where(row[recent] > 0, row[recent] / penalty, row[recent] * penalty)
        tok = int(np.argmax(row))
        if model.is_eog(tok):
            break
        out.append(tok)
        tokens.append(tok)
        grammar.accept([tok])
        row = np.array(ctx.decode([tok])[-1])
    grammar.close()
    return out


@pytest.mark.parametrize("penalty", [1.0, 1.3], ids=["no-penalty", "penalty"])
@pytest.mark.parametrize("response_format", [YES_NO, JSON_OBJECT], ids=["schema", "json-object"])
def test_greedy_answers_under_a_grammar_equal_the_full_mask(target: tuple[Model, Context], response_format: str,
                                                            penalty: float) -> None:
    model, ctx = target
    prompt = model.tokenize(PROMPT, add_special=True)
    settings = SamplingSettings(temperature=0.0, max_tokens=40, response_format=response_format,
                                repeat_penalty=penalty)
    expected = full_mask_answer(model, ctx, prompt, response_format, 40, penalty)
    assert expected
    for k in (0, 4):
        decoder = SpeculativeDecoder(model, ctx, ngram=SuffixDrafter(2), controller=DepthController(k_max=8, fixed=k))
        decoder.reset_cache()
        out: list[int] = []
        drafted = 0
        for event in decoder.generate(prompt, settings):
            if isinstance(event, Token):
                out += event.token_ids
            elif isinstance(event, PassStats):
                drafted += event.drafted
        assert out == expected, k
        assert (drafted > 0) == (k > 0)
