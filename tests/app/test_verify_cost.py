"""This machine's verify-cost curve: kept per target, and the drafter ranking predicts with it and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.library.gguf_reader import GGUFInfo, read_gguf_info
from app.measure.recommend import BANDWIDTH_BOUND, recommend_drafters
from app.storage.verify_cost import VerifyCurve, load_curve, load_curves, record

# A CPU where a pass costs about 0.9 of a one-token pass per extra token (the AVX2 EPYC's Gemma curve).
STEEP = {"1": 19.1, "2": 36.1, "4": 59.2, "8": 96.2, "16": 164.0}
FLAT = {"1": 10.0, "2": 10.2, "4": 10.5, "8": 11.0, "16": 12.0}  # a GPU-like curve


def test_record_and_load(tmp_path: Path) -> None:
    path = tmp_path / "verify_cost.json"
    assert record("/m/t.gguf", STEEP, "cpu", path)
    curve = load_curve("/m/t.gguf", path)
    assert curve is not None
    assert curve.widths_ms[16] == 164.0
    assert curve.backend == "cpu"
    assert curve.relative(2) == pytest.approx(36.1 / 19.1)
    assert curve.relative(3) == pytest.approx((36.1 + 59.2) / 2 / 19.1)  # between measured widths
    assert curve.relative(20) > curve.relative(16)  # beyond them, the widest slope goes on
    assert load_curve("/m/other.gguf", path) is None


def test_a_narrower_run_keeps_the_wider_widths(tmp_path: Path) -> None:
    path = tmp_path / "verify_cost.json"
    record("/m/t.gguf", STEEP, "cpu", path)
    record("/m/t.gguf", {"1": 20.0, "2": 37.0}, "cpu", path)
    curve = load_curve("/m/t.gguf", path)
    assert curve is not None
    assert curve.widths_ms[1] == 20.0
    assert curve.widths_ms[16] == 164.0
    record("/m/t.gguf", {"1": 5.0, "2": 5.1}, "cuda", path)  # another backend: the old curve is not mixed in
    curve = load_curve("/m/t.gguf", path)
    assert curve is not None
    assert sorted(curve.widths_ms) == [1, 2]


@pytest.mark.parametrize("widths", [{}, {"2": 30.0}, {"1": -1.0}, {"1": float("nan")}, {"x": 1.0}])
def test_invalid_curves_are_not_kept(tmp_path: Path, widths: dict[str, float]) -> None:
    path = tmp_path / "verify_cost.json"
    assert not record("/m/t.gguf", widths, "cpu", path)
    assert load_curve("/m/t.gguf", path) is None


def test_damaged_file_gives_no_curve(tmp_path: Path) -> None:
    path = tmp_path / "verify_cost.json"
    path.write_text("{broken")
    assert load_curves(path) == {}
    path.write_text(json.dumps({"/m/t.gguf": {"widths_ms": {"1": "fast"}}, "/m/u.gguf": [1, 2]}))
    assert load_curves(path) == {}


def _curve(widths: dict[str, float]) -> VerifyCurve:
    return VerifyCurve({int(w): ms for w, ms in widths.items()}, "cpu", 0.0)


@pytest.fixture(scope="module")
def target_info(tiny_target: Path) -> GGUFInfo:
    return read_gguf_info(tiny_target)


def test_ngram_prediction_uses_the_measured_curve_and_says_so(target_info: GGUFInfo) -> None:
    measured = {(target_info.path, "ngram"): 0.87}
    gpu = recommend_drafters(target_info, [], measured, verify_curves={})[-1]
    cpu = recommend_drafters(target_info, [], measured, verify_curves={target_info.path: _curve(STEEP)})[-1]
    assert gpu.curve == BANDWIDTH_BOUND
    assert "GPU-style" in gpu.curve
    assert "measured" in cpu.curve
    assert "cpu" in cpu.curve
    # The same acceptance predicts far less where a wide pass costs nearly its width in one-token passes.
    assert cpu.speedup < gpu.speedup
    assert cpu.bandwidth_speedup == pytest.approx(gpu.speedup)  # the GPU-style figure is kept, labelled
    flat = recommend_drafters(target_info, [], measured, verify_curves={target_info.path: _curve(FLAT)})[-1]
    assert flat.speedup > cpu.speedup


def test_a_drafter_that_cannot_pay_here_gets_depth_zero(target_info: GGUFInfo, tiny_drafter_same: Path) -> None:
    drafter = read_gguf_info(tiny_drafter_same)
    measured = {(target_info.path, drafter.path): 0.6}
    # The drafter's own one-token pass costs as much as the target's: c = 1, so no depth pays.
    curves = {target_info.path: _curve(STEEP), drafter.path: _curve(STEEP)}
    rec = recommend_drafters(target_info, [drafter], measured, verify_curves=curves)[0]
    assert rec.best_k == 0
    assert rec.speedup == 1.0
    assert "no depth beats plain decoding" in rec.note
