"""Trained heads are ranked with the drafter models by predicted speedup: the target's own MTP heads priced by
the bytes a step reads (one MTP block and the output layer) or by the step a bench measured beside the target,
and their answers kept under their own key, never as the suffix drafter's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFReader

from app.ceiling.mtp_heads import mtp_step_ratio
from app.library.discovery import discover, head_offers
from app.library.gguf_reader import read_gguf_info
from app.library.heads import OWN_MTP_HEADS
from app.measure.recommend import recommend_drafters
from app.storage import pair_stats
from app.storage.measured import keep_answer, keep_pass_costs
from app.storage.verify_cost import VerifyCurve
from tests.app.test_measured import answer
from tests.gguf_fixtures import write_eagle3_drafter, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
TARGET = "/m/target.gguf"
HIGH, LOW = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7), (0.2, 0.05)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3.5 target with one MTP block, a smaller same-vocabulary drafter model and an EAGLE-3 head."""
    out = tmp_path_factory.mktemp("heads")
    write_tiny_model(out / "qwen-mtp.gguf", arch="qwen35", n_layer=4, mtp_layers=1, bigram=True, name="qwen-mtp")
    write_tiny_model(out / "small-drafter.gguf", n_layer=1, n_embd=32, name="small-drafter")
    write_eagle3_drafter(out / "head-eagle3.gguf")
    return out


def test_an_mtp_answer_is_kept_under_the_heads_own_key(specdeck_home: Path) -> None:
    keep_answer(TARGET, None, 0, answer(40, 30), mtp=True)
    assert pair_stats.load_measured() == {(TARGET, pair_stats.MTP_KEY): 0.75}
    # Stacked with the suffix drafter: the heads' own tokens, and nothing for the suffix drafter, which did not
    # make the heads' drafts.
    keep_answer("/m/other.gguf", None, 3, answer(60, 40, model_drafted=20, model_accepted=10), mtp=True)
    measured = pair_stats.load_measured()
    assert measured[("/m/other.gguf", pair_stats.MTP_KEY)] == 0.5
    assert ("/m/other.gguf", pair_stats.NGRAM_KEY) not in measured
    keep_pass_costs(TARGET, "cpu", {}, None, 0, 0.07, mtp=True)
    assert pair_stats.load_step_costs() == {(TARGET, pair_stats.MTP_KEY): 0.07}


def test_an_mtp_step_reads_one_block_and_the_output_layer(folder: Path) -> None:
    """Counted again here from the file's own tensor list."""
    path = folder / "qwen-mtp.gguf"
    info = read_gguf_info(path)
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    block = sum(n for name, n in tensors.items() if name.startswith(f"blk.{info.n_layer - 1}."))
    outside = sum(n for name, n in tensors.items() if not name.startswith("blk.") and name != "token_embd.weight")
    trunk = sum(tensors.values()) - block
    assert mtp_step_ratio(info) == pytest.approx((block + outside) / trunk, rel=1e-9)
    assert 0 < mtp_step_ratio(info) < 1


def _ranking(folder: Path, profiles: dict[tuple[str, str], tuple[float, ...]],
             step_costs: dict[tuple[str, str], float] | None = None,
             curve: VerifyCurve | None = None) -> list[tuple[str, str, float, float]]:
    entries = [e for e in discover(extra_folders=[folder]) if e.info is not None and Path(e.info.path).parent == folder]
    target = read_gguf_info(folder / "qwen-mtp.gguf")
    models = [e.info for e in entries if e.info is not None and e.info.path != target.path]
    offers = head_offers(target, entries)
    sizes = {e.info.path: e.info.tensor_bytes for e in entries if e.info is not None}
    recs = recommend_drafters(target, models, {}, verify_curves={target.path: curve} if curve else {},
                              profiles=profiles, pass_profiles={}, step_costs=step_costs or {}, idle={},
                              heads=[(o, sizes.get(o.path, 0) if o.path else 0) for o in offers])
    return [(r.kind, r.name, r.cost_ratio, r.speedup) for r in recs]


def test_the_own_heads_are_ranked_with_the_drafters_by_predicted_speedup(folder: Path) -> None:
    target = str(folder / "qwen-mtp.gguf")
    drafter = str(folder / "small-drafter.gguf")
    heads_win = _ranking(folder, {(target, pair_stats.MTP_KEY): HIGH, (target, drafter): LOW})
    kinds = [kind for kind, *_ in heads_win]
    assert set(kinds) == {"mtp", "model", "head", "ngram"}  # the EAGLE-3 head fits this target too
    assert kinds[0] == "mtp"
    assert kinds[-1] == "ngram"
    mtp = next(r for r in heads_win if r[0] == "mtp")
    assert mtp[1] == OWN_MTP_HEADS
    assert mtp[2] == pytest.approx(mtp_step_ratio(read_gguf_info(Path(target))))
    assert mtp[3] > 1.0
    # Measured the other way round, the order turns.
    model_wins = _ranking(folder, {(target, pair_stats.MTP_KEY): LOW, (target, drafter): HIGH})
    assert [r[0] for r in model_wins].index("model") < [r[0] for r in model_wins].index("mtp")


def test_a_measured_step_prices_the_heads_on_this_machines_curve(folder: Path) -> None:
    target = str(folder / "qwen-mtp.gguf")
    curve = VerifyCurve({1: 10.0, 2: 14.0, 4: 22.0, 8: 40.0, 16: 80.0}, "cpu", 0.0)
    cheap = _ranking(folder, {(target, pair_stats.MTP_KEY): HIGH}, {(target, pair_stats.MTP_KEY): 0.05}, curve)
    dear = _ranking(folder, {(target, pair_stats.MTP_KEY): HIGH}, {(target, pair_stats.MTP_KEY): 0.6}, curve)
    cheap_mtp, dear_mtp = (next(r for r in ranking if r[0] == "mtp") for ranking in (cheap, dear))
    assert (cheap_mtp[2], dear_mtp[2]) == (0.05, 0.6)  # the measured c, not the bytes'
    assert cheap_mtp[3] > dear_mtp[3]


@pytest.mark.process
def test_a_bench_with_the_heads_teaches_specdeck_models_their_rank(folder: Path, tmp_path: Path) -> None:
    """bench --mtp keeps the heads' acceptance and step; `specdeck models --target` then ranks them by it."""
    target = folder / "qwen-mtp.gguf"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "one two three, one two"}]}) + "\n")
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    bench = subprocess.run([sys.executable, "-m", "app", "bench", "--target", str(target), "--mtp", "--k", "3",
                            "--prompts", str(prompts), "--max-tokens", "40", "--threads", "1", "--baseline",
                            "--json", str(tmp_path / "bench.json")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert bench.returncode == 0, bench.stderr[-3000:]
    c = json.loads((tmp_path / "bench.json").read_text())["c"]
    models = subprocess.run([sys.executable, "-m", "app", "models", "--folder", str(folder), "--target",
                             str(target), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert models.returncode == 0, models.stderr[-3000:]
    mtp = next(d for d in json.loads(models.stdout)["drafters"] if d["kind"] == "mtp")
    assert mtp["acceptance_source"] == "measured per position"
    assert mtp["acceptance"] == 1.0  # the bigram fixture's head agrees by construction
    assert mtp["cost_ratio"] == pytest.approx(c, abs=1e-3)  # bench's step, on the curve bench kept
    text = subprocess.run([sys.executable, "-m", "app", "models", "--folder", str(folder), "--target", str(target)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert any(OWN_MTP_HEADS in line and "measured per position" in line for line in text.stdout.splitlines())
