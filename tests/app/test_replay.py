"""The oracle replay: llama.cpp's n-gram modes as reimplemented, the longest-match oracle, the cost curve.

Token lists built so that the right drafts hold by construction; simulated seconds only (no timing).
"""

from __future__ import annotations

import random

import pytest

from app.measure.replay import (
    CostCurve,
    Trace,
    best_width,
    longest_source_match,
    replay_oracle,
    replay_specdeck,
    total,
)
from benchmarks.ngram_modes import MOD_MIN, NgramMod, ngram_simple_draft, replay_ngram_mod, replay_ngram_simple

CPU = CostCurve({1: 0.019, 2: 0.036, 4: 0.059, 8: 0.096, 16: 0.164})
FLAT = CostCurve({1: 0.010, 65: 0.0101})


def copy_trace(length: int = 200, seed: int = 3) -> Trace:
    rng = random.Random(seed)
    code = [rng.randrange(100, 1000) for _ in range(length)]
    return Trace(prompt=[*code, 1, 2, 3], answer=list(code))


def test_the_curve_interpolates_and_extends_with_its_mean_slope() -> None:
    assert CPU.seconds(3) == pytest.approx((0.036 + 0.059) / 2)
    slope = (0.164 - 0.019) / 15
    assert CPU.seconds(32) == pytest.approx(0.164 + 16 * slope)
    noisy = CostCurve({1: 0.01, 8: 0.05, 9: 0.04})  # a falling last step does not make wide passes free
    assert noisy.seconds(40) > noisy.seconds(9)
    wider = CostCurve({1: 0.02, 16: 0.2, 64: 0.6}).merged(CostCurve({1: 0.01, 64: 0.3, 128: 0.5}))
    assert wider.seconds(128) == pytest.approx(1.0)  # the wider curve's width, at this curve's scale
    with pytest.raises(ValueError, match="width 1"):
        CostCurve({2: 0.1})


def test_ngram_simple_copies_after_the_latest_12_token_match() -> None:
    rng = random.Random(1)
    text = [rng.randrange(100, 1000) for _ in range(100)]
    tokens = [*text, 7, *text[10:22]]  # the last 12 tokens (the sampled one included) occur at 10..21
    assert ngram_simple_draft(tokens) == text[22:70]  # size_m 48
    short = [*text[:50], *text[30:42], *text[30:42]]
    assert ngram_simple_draft(short) == []  # 11 tokens follow the latest match, fewer than size_n: no draft
    assert ngram_simple_draft(tokens[:60]) == []  # too little text for a 12-gram and a 48-gram


def test_ngram_mod_drafts_only_long_chains_and_indexes_answers_late() -> None:
    trace = copy_trace(200)
    mod = NgramMod()
    mod.begin(trace.prompt)
    # Copying the prompt: a 24-token match, then at least MOD_MIN tokens chain from the table.
    draft = mod.draft([*trace.prompt, *trace.answer[:30]])
    assert len(draft) >= MOD_MIN
    assert draft == trace.answer[30 : 30 + len(draft)]
    # A repeat of text generated in the last 32 tokens is not in the table yet.
    fresh = NgramMod()
    fresh.begin([5] * 30)
    rng = random.Random(2)
    said = [rng.randrange(100, 1000) for _ in range(30)]
    assert fresh.draft([5] * 30 + said + said[:24]) == []


def test_ngram_mod_empties_its_table_after_five_poor_rounds() -> None:
    mod = NgramMod()
    mod.begin(copy_trace(200).prompt)
    assert mod.table
    for _ in range(5):
        mod.n_draft_last = 50
        mod.accept(2)
    assert mod.table == {}
    assert mod.i_last == 0


def test_the_oracle_copies_in_the_widest_pass_that_pays() -> None:
    trace = copy_trace(200)
    assert longest_source_match(trace.prompt, trace.answer, 64) == 64
    assert best_width(FLAT, 64) == 64  # on a flat curve, the whole match
    assert best_width(CostCurve({1: 0.01, 2: 0.03}), 10) == 0  # a pass of two costs three: draft nothing
    [run] = replay_oracle([trace], FLAT)
    assert run.tokens == 200
    assert run.passes == 4  # 65 tokens a pass (64 drafted and the bonus), then the last 5
    assert run.accepted == run.drafted


def test_every_replay_emits_the_whole_answer_and_never_more() -> None:
    traces = [copy_trace(150, seed) for seed in range(3)]
    for runs in (replay_specdeck(traces, CPU, count_draft_time=False), replay_ngram_simple(traces, CPU),
                 replay_ngram_mod(traces, CPU), replay_oracle(traces, CPU)):
        assert [r.tokens for r in runs] == [150] * 3
        assert all(r.accepted <= r.drafted for r in runs)
        assert all(r.passes * 1 <= r.tokens for r in runs)
        assert total(runs).tokens == 450


def test_specdeck_replay_is_repeatable_and_copies_fast() -> None:
    traces = [copy_trace(300, seed) for seed in range(2)]
    first = replay_specdeck(traces, CPU, count_draft_time=False)
    again = replay_specdeck(traces, CPU, count_draft_time=False)
    assert [r.as_json() for r in first] == [r.as_json() for r in again]
    assert all(r.tau > 4 for r in first)
    assert all(r.speedup > 1.3 for r in first)


def test_history_lets_a_second_prompt_draft_from_the_first_answer() -> None:
    rng = random.Random(9)
    answer = [rng.randrange(100, 1000) for _ in range(120)]
    traces = [Trace([1, 2, 3, *answer], answer), Trace([4, 5, 6], answer)]  # the second repeats the first answer
    without = replay_specdeck(traces, CPU, count_draft_time=False)
    with_history = replay_specdeck(traces, CPU, count_draft_time=False, history=True)
    assert with_history[1].passes < without[1].passes / 3
    assert replay_oracle(traces, CPU)[1].passes < replay_oracle(traces, CPU, history=False)[1].passes
