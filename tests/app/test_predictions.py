"""Predicted speedups from acceptance measured per position: the ranking, the roofline and the depth policy
share one expected-tokens rule and one best-depth rule, and a clustered profile is not treated as i.i.d."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from app.ceiling.speculation import expected_speedup, expected_tokens, expected_tokens_per_pass
from app.engine.adaptive import CostModel, DepthController, best_depth, conditional
from app.events import MessageStats
from app.measure.recommend import NGRAM_KEY, acceptance_rates, predict, recommend_drafters
from app.storage.pair_stats import load_measured, load_profiles, record
from app.storage.verify_cost import VerifyCurve
from tests.app.test_compat import _info

# A quiet CPU's verify cost (ms by width; the README's AMD EPYC curve for SmolLM2).
CPU_CURVE = VerifyCurve({1: 10.1, 2: 16.4, 4: 29.6, 8: 45.3, 16: 95.8}, "cpu", 0.0)
DEPTH = 8


def profile_of(accepted_per_pass: list[int], depth: int = DEPTH) -> tuple[float, ...]:
    """Per-position acceptance as the engine counts it (passes whose first i + 1 drafts were all accepted,
    over passes that drafted position i), every pass drafting ``depth``."""
    return tuple(sum(1 for a in accepted_per_pass if a > i) / len(accepted_per_pass) for i in range(depth))


# Chance matches: most drafts hold a token or three, few go on (the suffix drafter on prose):
# per position 0.90, 0.65, 0.40, 0.25, 0.15, 0.07, 0.03, 0.01.
CHANCE = [0] * 10 + [1] * 25 + [2] * 25 + [3] * 15 + [4] * 10 + [5] * 8 + [6] * 4 + [7] * 2 + [8] * 1
# Copies or nothing: a third of the drafts are a copy accepted whole, the rest fail at once.
COPIES = [8] * 30 + [1] * 35 + [0] * 35


def stats_with(profile: tuple[float, ...], drafted: int = 400) -> MessageStats:
    return MessageStats(prompt_tokens=10, completion_tokens=100, ttft_seconds=0.1, prefill_tps=100.0,
                        decode_tps=50.0, decode_seconds=1.0, passes=50, drafted=drafted, accepted=100,
                        acceptance=0.25, tokens_per_pass=2.0, per_position_acceptance=profile, k_history=(),
                        speedup_estimate=1.0)


@pytest.mark.parametrize("outcomes", [CHANCE, COPIES], ids=["chance", "copies"])
def test_the_profile_gives_the_tokens_per_pass_that_were_measured(outcomes: list[int]) -> None:
    """At a fixed depth the policy's expected_tokens on the measured profile is the measured mean exactly;
    the i.i.d. formula from the first position's α is not."""
    profile = profile_of(outcomes)
    measured = 1 + sum(outcomes) / len(outcomes)
    assert expected_tokens(conditional(profile), DEPTH) == pytest.approx(measured, rel=1e-12)
    assert abs(expected_tokens_per_pass(profile[0], DEPTH) - measured) > 0.4


def test_iid_over_predicts_chance_matches_and_drafts_too_deep() -> None:
    profile = profile_of(CHANCE)
    alpha = profile[0]
    iid_k, iid_tau, iid_speedup = predict([alpha] * DEPTH, DEPTH, 0.0, CPU_CURVE)
    k, tau, speedup = predict(*acceptance_rates(alpha, profile, DEPTH), 0.0, CPU_CURVE)
    assert iid_k > k  # its best depth is too deep (6 against 1 on this curve)
    assert iid_speedup > speedup * 1.05  # and it promises what the measured profile does not give
    # What the i.i.d. depth really gives, by the measured profile: slower than plain decoding.
    real_at_iid_k = expected_tokens(conditional(profile), iid_k) / CPU_CURVE.relative(iid_k + 1)
    assert real_at_iid_k < 1.0 < speedup
    assert iid_tau > expected_tokens(conditional(profile), iid_k) + 0.3
    assert tau == expected_tokens(conditional(profile), k)


def test_a_recorded_profile_is_what_the_ranking_predicts_from(tmp_path: Path) -> None:
    """bench/the window record the profile; the ranking's figures are the policy's expected_tokens and
    best_depth on it, on this machine's curve and on a bandwidth-bound device."""
    path = tmp_path / "acceptance.json"
    profile = profile_of(CHANCE)
    target = _info("/m/target.gguf", 100_000)
    assert record(target.path, NGRAM_KEY, stats_with(profile), path) == pytest.approx(profile[0])
    profiles = load_profiles(path)
    assert profiles[(target.path, NGRAM_KEY)] == pytest.approx(profile)
    rec = recommend_drafters(target, [], load_measured(path), profiles=profiles,
                             verify_curves={target.path: CPU_CURVE})[-1]
    assert rec.kind == "ngram"
    assert rec.acceptance_source == "measured per position"
    rates = conditional(rec.per_position)
    k, per_ms = best_depth(rates, len(profile), CPU_CURVE.relative)
    assert rec.best_k == k
    assert rec.tokens_per_pass == expected_tokens(rates, k)
    assert rec.speedup == pytest.approx(per_ms * CPU_CURVE.relative(1))
    # The i.i.d. figure the ranking gave before from the same α promised more.
    assert predict([rec.acceptance] * DEPTH, DEPTH, 0.0, CPU_CURVE)[2] > rec.speedup * 1.05


def test_the_policy_and_the_ranking_choose_the_same_depth_from_the_same_rates() -> None:
    """The depth policy, fed the same curve and with rates measured per position, picks the ranking's depth."""
    profile = profile_of(CHANCE)
    rates = conditional(profile)
    policy = DepthController(k_max=DEPTH, cost=CostModel())
    for width in range(1, DEPTH + 2):
        for _ in range(3):
            policy.cost.observe_verify(width, CPU_CURVE.widths_ms[1] * CPU_CURVE.relative(width) / 1000)
    bucket = policy.ngram_buckets[0]
    for i, rate in enumerate(rates):  # as measured: a correction of exactly the rate, with outcomes seen
        bucket.rates[i], bucket.seen[i] = rate, 10
    chosen = policy.choose(DEPTH, False, match_len=1, probe=False)
    assert chosen == predict(rates, DEPTH, 0.0, CPU_CURVE)[0]


def test_profiles_are_merged_weighted_and_old_files_still_load(tmp_path: Path) -> None:
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps({"/t.gguf\n/d.gguf": {"alpha": 0.5, "weight": 100}}))  # before profiles existed
    assert load_profiles(path) == {}
    assert load_measured(path) == {("/t.gguf", "/d.gguf"): 0.5}
    record("/t.gguf", "/d.gguf", stats_with((0.8, 0.6), drafted=100), path)
    assert load_profiles(path)[("/t.gguf", "/d.gguf")] == pytest.approx((0.8, 0.6))
    record("/t.gguf", "/d.gguf", stats_with((0.4, 0.2, 0.1), drafted=200), path)
    merged = load_profiles(path)[("/t.gguf", "/d.gguf")]
    # The first record folded into the α-only entry: weight 200 against this answer's 200.
    assert merged == pytest.approx((0.8 + (0.4 - 0.8) / 2, 0.6 + (0.2 - 0.6) / 2, 0.1))
    # A damaged profile is dropped; α is kept.
    table = json.loads(path.read_text())
    table["/t.gguf\n/d.gguf"]["per_position"] = [0.5, "x"]
    path.write_text(json.dumps(table))
    assert load_profiles(path) == {}
    assert ("/t.gguf", "/d.gguf") in load_measured(path)


def test_the_roofline_and_the_ranking_use_the_policys_rule() -> None:
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for k in (0, 1, 5):
            assert expected_tokens_per_pass(alpha, k) == expected_tokens([alpha] * k, k)
    k, _tau, s = predict([0.8] * 16, 16, 0.05)
    assert s == pytest.approx(max(expected_speedup(0.8, j, 0.05) for j in range(1, 17)), rel=1e-3)
    assert s == pytest.approx(expected_speedup(0.8, k, 0.05))


def test_hindsight_scores_every_proposal_against_what_was_emitted() -> None:
    """Each pass's proposal, drafted or not, is scored against the tokens the target went on to emit, across
    passes; an empty proposal counts as a pass with nothing to offer."""
    from app.engine.speculative import ProposalHindsight

    h = ProposalHindsight()
    h.add([5, 6, 7, 8], [5])  # open: 1 matched so far
    h.add([], [6])  # the first goes on (2 matched); nothing proposed here
    h.add([7, 9], [7, 8])  # the first matches whole (4); this one matches 1, then 8 ≠ 9
    h.add([1, 2, 3], [1, 2])  # still open when the answer ends
    h.close()
    assert h.passes == 4
    assert h.lengths == [3, 3, 2, 1]  # passes with a proposal of at least 1, 2, 3, 4 tokens
    assert h.matches == [3, 2, 1, 1]  # passes whose first 1, 2, 3, 4 proposed tokens were emitted


def _stats_with_passes(passes: int, lengths: tuple[int, ...], matches: tuple[int, ...]) -> MessageStats:
    return MessageStats(prompt_tokens=10, completion_tokens=100, ttft_seconds=0.1, prefill_tps=100.0,
                        decode_tps=50.0, decode_seconds=1.0, passes=passes, drafted=0, accepted=0,
                        acceptance=0.0, tokens_per_pass=1.0, per_position_acceptance=(), k_history=(),
                        speedup_estimate=1.0, proposal_passes=passes, proposal_lengths=lengths,
                        proposal_matches=matches)


def test_per_pass_shares_are_kept_from_answers_that_drafted_nothing(tmp_path: Path) -> None:
    """An answer the policy did not draft in still says how often the text offered a draft: prose is kept,
    so it does not flatter the prediction; two answers fold by their passes."""
    from app.storage.pair_stats import load_pass_profiles

    path = tmp_path / "acceptance.json"
    record("/t.gguf", NGRAM_KEY, _stats_with_passes(100, (50, 40), (20, 10)), path)
    drafted, matched = load_pass_profiles(path)[("/t.gguf", NGRAM_KEY)]
    assert drafted == pytest.approx((0.5, 0.4))
    assert matched == pytest.approx((0.2, 0.1))
    record("/t.gguf", NGRAM_KEY, _stats_with_passes(300, (30,), (30,)), path)
    drafted, matched = load_pass_profiles(path)[("/t.gguf", NGRAM_KEY)]
    assert drafted == pytest.approx(((50 + 30) / 400, 40 / 400))
    assert matched == pytest.approx(((20 + 30) / 400, 10 / 400))


def test_verify_seconds_charges_only_the_drafts_on_offer() -> None:
    verify = CPU_CURVE.relative
    assert best_depth([0.9] * 4, 4, verify) == best_depth([0.9] * 4, 4, verify, drafted=[1.0] * 4)
    from app.ceiling.speculation import verify_seconds

    assert verify_seconds(verify, 3, [1.0, 1.0, 1.0]) == pytest.approx(verify(4))
    # Half the passes offer no draft at all: they cost a one-token pass.
    assert verify_seconds(verify, 3, [0.5, 0.5, 0.5]) == pytest.approx((verify(1) + verify(4)) / 2)


def test_the_ngram_prediction_uses_the_per_pass_shares(tmp_path: Path) -> None:
    """A fifth of the passes copy 8 tokens, the rest offer nothing: per pass that is τ 2.6 at depth 8 with
    four fifths of the passes one token wide; the drafted positions alone (all accepted) would promise τ 9."""
    path = tmp_path / "acceptance.json"
    passes = 100
    stats = dataclasses.replace(_stats_with_passes(passes, (20,) * 8, (20,) * 8), drafted=160, accepted=160,
                                per_position_acceptance=(1.0,) * 8)
    record("/t.gguf", NGRAM_KEY, stats, path)
    from app.storage.pair_stats import load_pass_profiles

    target = _info("/t.gguf", 1000)
    rec = recommend_drafters(target, [], load_measured(path), profiles=load_profiles(path),
                             pass_profiles=load_pass_profiles(path), verify_curves={"/t.gguf": CPU_CURVE})[-1]
    assert rec.acceptance_source == "measured per pass"
    assert rec.tokens_per_pass == pytest.approx(1 + 8 * 0.2)
    verify = CPU_CURVE.relative
    assert rec.speedup == pytest.approx(2.6 * verify(1) / (0.8 * verify(1) + 0.2 * verify(9)))
    drafted_only = recommend_drafters(target, [], load_measured(path), profiles=load_profiles(path),
                                      pass_profiles={}, verify_curves={"/t.gguf": CPU_CURVE})[-1]
    assert drafted_only.tokens_per_pass > 2 * rec.tokens_per_pass  # what the drafted positions alone say


def test_a_measured_drafter_step_prices_the_model_drafter(tmp_path: Path) -> None:
    """A drafter step timed in the loop (bench's c) replaces the weight-byte ratio: on a CPU two small models
    share the cores, and a step can cost twice what the bytes say, enough to turn a predicted gain into a loss."""
    from app.storage.pair_stats import load_pass_profiles, load_step_costs, record_step_cost

    path = tmp_path / "acceptance.json"
    target, drafter = _info("/t.gguf", 1000), _info("/d.gguf", 360)
    record_step_cost("/t.gguf", "/d.gguf", 2.0, path)  # nothing drafted yet: the step is kept, no α is made up
    assert load_step_costs(path) == {("/t.gguf", "/d.gguf"): 2.0}
    assert load_measured(path) == {}
    record("/t.gguf", "/d.gguf", stats_with((0.99, 0.98, 0.97, 0.96)), path)
    assert load_step_costs(path) == {("/t.gguf", "/d.gguf"): 2.0}
    record_step_cost("/t.gguf", "/d.gguf", 0.36, path)
    curves = {"/t.gguf": CPU_CURVE}

    def ranked() -> object:
        return recommend_drafters(target, [drafter], load_measured(path), profiles=load_profiles(path),
                                  pass_profiles=load_pass_profiles(path), step_costs=load_step_costs(path),
                                  verify_curves=curves)[0]

    by_bytes = ranked()  # a step costing what the bytes say
    record_step_cost("/t.gguf", "/d.gguf", 0.9, path)
    by_step = ranked()
    assert load_step_costs(path) == {("/t.gguf", "/d.gguf"): 0.9}
    assert by_bytes.cost_ratio == pytest.approx(0.36)
    assert by_step.cost_ratio == pytest.approx(0.9)
    assert by_step.speedup < by_bytes.speedup
    record("/t.gguf", "/d.gguf", stats_with((0.99, 0.98, 0.97, 0.96)), path)  # a later answer keeps the step
    assert load_step_costs(path) == {("/t.gguf", "/d.gguf"): 0.9}
