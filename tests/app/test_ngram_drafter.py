"""The n-gram drafter's proposals: key matching, the pool of earlier contexts, and its bookkeeping.

Plain token lists, built so that the right proposal holds by construction; no model, no timing.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.drafters import NGramDrafter


def proposals(drafter: NGramDrafter, prompt: list[int], answer: list[int], k: int = 4) -> list[list[int]]:
    """The drafter's proposal before each answer token, as the decoder asks for them."""
    tokens, out = list(prompt), []
    for tok in answer:
        out.append(drafter.propose(tokens, k).tokens)
        tokens.append(tok)
    return out


def test_the_furthest_reaching_occurrence_wins() -> None:
    # "x a b c" and "y a b c" occur; the end "y a b" matches the second one further back.
    seq = [1, 5, 6, 7, 40, 2, 5, 6, 7, 41, 3, 2, 5, 6]
    draft = NGramDrafter(3).propose(seq, 2)
    assert draft.tokens == [7, 41]
    assert draft.match_len == 3


def test_rewritten_context_starts_over() -> None:
    drafter = NGramDrafter(2)
    proposals(drafter, [1, 2, 3, 60, 61, 99, 4], [60, 61])
    other = [60, 61, 62, 60, 61]
    assert drafter.propose(other, 3).tokens == [62, 60, 61]  # only the new context is known


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=60), st.lists(st.integers(0, 6), max_size=30),
       st.integers(0, 12), st.integers(1, 4))
def test_proposals_are_bounded_and_come_from_the_context(prompt: list[int], answer: list[int], k: int,
                                                        n: int) -> None:
    drafter = NGramDrafter(n)
    tokens = list(prompt)
    for tok in [*answer, None]:
        draft = drafter.propose(tokens, k)
        assert len(draft.tokens) <= k
        assert set(draft.tokens) <= set(tokens)
        assert len(draft.q) == len(draft.sources) == len(draft.tokens)
        assert 0 <= draft.match_len <= NGramDrafter.MATCH_CAP
        if tok is not None:
            tokens.append(tok)


def test_earlier_answers_draft_in_a_new_context() -> None:
    drafter = NGramDrafter(3)
    answer = [70, 71, 72, 73, 74, 75, 76, 77]
    proposals(drafter, [1, 2, 3], answer)  # the first chat: its answer goes to the pool when the next starts
    tokens = [9, 8, 70, 71]  # a new chat whose context has "70 71" only once: no continuation in it
    draft = drafter.propose(tokens, 4)
    assert draft.tokens == [72, 73, 74, 75]
    assert draft.match_len == 2  # the key that matched: a short match, drafted with care


def test_pool_follows_the_most_frequent_continuation_and_stops_where_it_is_unsure() -> None:
    drafter = NGramDrafter(2)
    # After "5 6": 30 in three contexts of four, then 31, 32 or 33 once each.
    for tail in ([30, 31, 40], [30, 32, 41], [30, 33, 42], [35, 36, 37]):
        drafter.observe([1, 5, 6, *tail])
        drafter.observe([2])  # a new context: the previous one goes to the pool
    # 30 has a chance of 3/4; a second token would bring it to 3/4 * 1/3, below POOL_MIN_PROB.
    assert drafter.propose([4, 5, 6], 4).tokens == [30]


def test_reset_empties_the_pool() -> None:
    drafter = NGramDrafter(3)
    proposals(drafter, [1, 2, 3], [70, 71, 72, 73])
    drafter.observe([9])
    drafter.reset()
    assert drafter.propose([9, 70, 71], 4).tokens == []


def test_pool_is_bounded_and_drops_the_oldest_context_first() -> None:
    drafter = NGramDrafter(2)
    chunk = NGramDrafter.POOL_TOKENS // 3
    for start in range(5):
        drafter.observe(list(range(start * chunk, (start + 1) * chunk)))
    drafter.observe([-1])
    first, last = 0, 4 * chunk  # keys from the first and the last context
    assert drafter.propose([-2, first, first + 1], 2).tokens == []
    assert drafter.propose([-3, last, last + 1], 2).tokens == [last + 2, last + 3]
