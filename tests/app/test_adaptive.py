"""The adaptive depth policy: chooses k from measured acceptance and measured pass costs."""

from __future__ import annotations

from app.engine.adaptive import CostModel, DepthController, expected_tokens


def controller(costs: dict[int, float], k_max: int = 8) -> DepthController:
    c = DepthController(k_max=k_max)
    for width, seconds in costs.items():
        for _ in range(3):
            c.cost.observe_verify(width, seconds)
    return c


def cpu_costs(k_max: int = 8) -> dict[int, float]:
    # A small CPU: a pass of w tokens costs much more than one (about 2.7x at w = 4).
    return {w: 0.010 * (1 + 0.57 * (w - 1)) for w in range(1, k_max + 2)}


def gpu_costs(k_max: int = 8) -> dict[int, float]:
    # A GPU: memory-bound, so a wider pass costs almost the same.
    return {w: 0.010 * (1 + 0.02 * (w - 1)) for w in range(1, k_max + 2)}


def feed(c: DepthController, match_len: int, hits: bool, times: int, depth: int = 8) -> None:
    rates = c.ngram_buckets[c.bucket(match_len)]
    for _ in range(times):
        for i in range(depth):
            rates.update_at(i, hits)
            if not hits:
                break


def test_expected_tokens_is_leviathan_for_a_constant_rate() -> None:
    assert abs(expected_tokens([0.8] * 3, 3) - (1 - 0.8**4) / 0.2) < 1e-12
    assert expected_tokens([0.5] * 8, 0) == 1.0


def test_backs_off_to_zero_when_drafts_miss_and_comes_back_when_they_hit() -> None:
    c = controller(cpu_costs())
    feed(c, match_len=20, hits=True, times=30)
    assert c.choose(8, False, match_len=20, probe=False) >= 4
    feed(c, match_len=20, hits=False, times=30)
    assert c.choose(8, False, match_len=20, probe=False) == 0
    feed(c, match_len=20, hits=True, times=30)
    assert c.choose(8, False, match_len=20, probe=False) >= 4


def test_the_same_acceptance_drafts_deeper_where_wide_passes_are_cheap() -> None:
    cpu, gpu = controller(cpu_costs()), controller(gpu_costs())
    for c in (cpu, gpu):
        c.ngram_buckets[2].rates = [0.6] * 8
    k_cpu = cpu.choose(8, False, match_len=10, probe=False)
    k_gpu = gpu.choose(8, False, match_len=10, probe=False)
    assert k_cpu <= 1  # 0.6 acceptance barely pays for one more token at 1.57x the cost
    assert k_gpu >= 4


def test_prefers_a_cheap_width_over_a_slightly_shorter_expensive_one() -> None:
    costs = cpu_costs()
    costs[8] = costs[5]  # like llama.cpp's repacked Q4_K: 8 rows cost about what 5 do
    c = controller(costs)
    c.ngram_buckets[3].rates = [0.95] * 8
    assert c.choose(8, False, match_len=30, probe=False) == 7


def test_never_drafts_more_than_the_ngram_offers_without_a_model() -> None:
    c = controller(gpu_costs())
    c.ngram_buckets[3].rates = [0.99] * 8
    assert c.choose(3, False, match_len=30, probe=False) == 3


def test_costs_are_medians_so_one_slow_pass_does_not_change_the_policy() -> None:
    cost = CostModel()
    for seconds in (0.010, 0.011, 0.010, 0.500, 0.010):
        cost.observe_verify(1, seconds)
    assert abs(cost.verify(1) - 0.010) < 1e-9


def test_fixed_depth_ignores_the_measurements() -> None:
    c = DepthController(k_max=8, fixed=5)
    assert c.choose(8, False) == 5
    assert c.choose(2, False) == 2  # an n-gram draft of two tokens cannot be made longer
    assert c.choose(0, True) == 5
