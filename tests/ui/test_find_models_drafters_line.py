"""The Find models view's drafters line: a model with the quant's tokenizer is offered as a drafter only when it
is predicted to be faster than plain decoding; a copy of the model itself is named as no faster."""

from __future__ import annotations

from typing import Any

from app.measure.recommend import DrafterReport, Recommendation
from ui.hub.results import Judged, drafters_text


def _model(name: str, speedup: float) -> Recommendation:
    return Recommendation(f"/models/{name}.gguf", name, "model", 0.1, 0.7, "default", 3, 2.0, speedup, "")


def _line(*recs: Recommendation) -> str:
    verdict: Any = None  # the line reads only the drafters
    return drafters_text(Judged(verdict, DrafterReport(list(recs), [])), ())


def test_only_drafters_predicted_faster_pair() -> None:
    line = _line(_model("small", 1.6), _model("same-model", 1.0))
    pairs, _, rest = line.partition("Sharing its tokenizer")
    assert "small (1.60× predicted)" in pairs
    assert "same-model" not in pairs
    assert "same-model (1.00× predicted)" in rest


def test_a_copy_of_the_model_alone_is_not_offered() -> None:
    line = _line(_model("same-model", 0.95))
    assert line.startswith("Drafters: no model in your library that shares its tokenizer is predicted")
    assert "same-model (0.95× predicted)" in line
    assert "pair with it" not in line
