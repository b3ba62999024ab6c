"""A model drafter's confidence (the softmax's top probability, which ``p_min`` cuts at) against a float64
reference, on rows as llama.cpp gives them: wide logits, ties, banned tokens at -inf."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.drafters import _top_prob


def _reference(row: np.ndarray) -> float:
    wide = row.astype(np.float64)
    weights = np.exp(wide - wide.max())
    return float(weights.max() / weights.sum())


@pytest.mark.parametrize("scale", [0.1, 3.0, 30.0, 1000.0])
def test_the_top_probability_matches_a_float64_softmax(scale: float) -> None:
    rng = np.random.default_rng(7)
    row = (rng.standard_normal(151_936) * scale).astype(np.float32)
    row[rng.integers(0, row.size, 500)] = -np.inf  # banned by a logit bias or a grammar
    before = row.copy()
    assert _top_prob(row) == pytest.approx(_reference(row), rel=1e-5)
    assert np.array_equal(row, before)  # the drafter's row is read, never changed


def test_ties_and_one_sure_token() -> None:
    assert _top_prob(np.zeros(4, dtype=np.float32)) == pytest.approx(0.25)
    sure = np.full(32_000, -1e4, dtype=np.float32)
    sure[5] = 0.0
    assert _top_prob(sure) == 1.0
