"""Facts with one home each: the KV cache types, the depth cap, the drafter's acceptance prior, the cost of a pass,
the exit statuses and completion mode's prompt. Each test fails if a copy comes back beside the home."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from app.ceiling import metrics, roofline, speculation
from app.engine import adaptive
from app.engine.chat_template import completion_text
from app.engine_limits import DEPTH_CAP, KV_CACHE_TYPES, KV_TYPES, kv_quantized
from app.errors import SettingsError
from app.measure import recommend
from app.params import DraftSettings, LoadSettings

ROOT = Path(__file__).resolve().parents[2]


def _sources(*homes: str) -> list[tuple[str, int, str]]:
    """(file, line number, line) of every line of app/ and ui/, the named home files left out."""
    out = []
    for path in sorted([*ROOT.glob("app/**/*.py"), *ROOT.glob("ui/**/*.py")]):
        name = path.relative_to(ROOT).as_posix()
        if name not in homes:
            out += [(name, n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
    return out


def _copies(pattern: str, *homes: str) -> list[str]:
    found = re.compile(pattern)
    return [f"{name}:{n}: {line.strip()}" for name, n, line in _sources(*homes) if found.search(line)]


# --- KV cache types ----------------------------------------------------------------------------------


def test_the_kv_cache_types_are_llama_cpps() -> None:
    """The one table holds ggml's own type ids and block sizes (gguf-py's copy of ggml.h)."""
    for name, kv in KV_CACHE_TYPES.items():
        ggml = GGMLQuantizationType[name.upper()]
        assert kv.ggml_type == ggml.value, name
        assert (kv.block, kv.block_bytes) == GGML_QUANT_SIZES[ggml], name
        assert kv.quantized == (kv.block > 1) == kv_quantized(name)


def test_every_reader_of_the_kv_cache_types_takes_exactly_the_one_list() -> None:
    for name in KV_TYPES:
        flash = "on" if kv_quantized(name) else "off"
        LoadSettings(target_path="/m.gguf", kv_type=name, flash_attn=flash).validate()
        assert roofline.kv_row_bytes(name, 64) == KV_CACHE_TYPES[name].row_bytes(64)
        if kv_quantized(name):  # the flash-attention rule follows the table, not a list of its own
            with pytest.raises(SettingsError, match="quantized KV cache needs flash attention"):
                LoadSettings(target_path="/m.gguf", kv_type=name, flash_attn="off").validate()
    for other in ("q5_0", "q4_1", "iq4_nl", "F16"):
        with pytest.raises(SettingsError, match="KV cache type must be one of"):
            LoadSettings(target_path="/m.gguf", kv_type=other).validate()
        with pytest.raises(ValueError, match="unknown KV cache type"):
            roofline.kv_row_bytes(other, 64)


def test_no_second_list_of_kv_cache_types() -> None:
    assert _copies(r"""["'](q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|bf16|f32)["']""", "app/engine_limits.py") == []


# --- the depth cap -------------------------------------------------------------------------------------


def test_the_depth_cap_has_one_home() -> None:
    DraftSettings(k=DEPTH_CAP, k_max=DEPTH_CAP).validate()
    for too_deep in (DraftSettings(k=DEPTH_CAP + 1), DraftSettings(k_max=DEPTH_CAP + 1)):
        with pytest.raises(SettingsError, match=f"between 0 and {DEPTH_CAP}"):
            too_deep.validate()
    assert metrics.MAX_K == DEPTH_CAP
    assert _copies(r"(0, 32\b|> 32\b|MAX_K = 32\b)", "app/engine_limits.py") == []


# --- the acceptance prior and the cost model -------------------------------------------------------------


def test_the_model_drafters_prior_has_one_home() -> None:
    assert recommend.DEFAULT_ACCEPTANCE == adaptive.MODEL_PRIOR
    assert [line for line in _copies(r"=\s*0\.6\b", "app/engine/adaptive.py") if line.startswith("app/")] == []


def test_the_policy_the_ranking_and_the_roofline_price_a_pass_alike() -> None:
    """One cost model (``pass_seconds``) and one search (``best_depth``): the ranking's prediction is the policy's
    own rule, and the roofline's speedup is tokens over the same pass cost."""
    def verify(width: int) -> float:
        return 1.0 + 0.05 * (width - 1)  # a CPU-like pass that widens

    rates = [0.9, 0.8, 0.7, 0.5, 0.3]
    k, rate = adaptive.best_depth(rates, len(rates), verify, draft_step=0.1)
    best = max(range(len(rates) + 1), key=lambda d: adaptive.expected_tokens(rates, d) / adaptive.pass_seconds(
        d, verify, draft_seconds=d * 0.1))
    assert k == best
    assert rate == pytest.approx(adaptive.expected_tokens(rates, k) / adaptive.pass_seconds(
        k, verify, draft_seconds=k * 0.1))
    assert recommend.predict([0.8] * 8, 8, 0.1)[0] == adaptive.best_depth(
        [0.8] * 8, 8, speculation.bandwidth_bound_pass, draft_step=0.1)[0]
    for alpha, depth, c in ((0.8, 4, 0.05), (0.5, 0, 0.2), (0.95, 8, 0.0)):
        assert speculation.expected_speedup(alpha, depth, c) == pytest.approx(
            speculation.expected_tokens_per_pass(alpha, depth)
            / adaptive.pass_seconds(depth, speculation.bandwidth_bound_pass, draft_seconds=depth * c))
    # The pass cost is written once: no module adds a wide pass to its drafting by hand.
    assert _copies(r"verify\(k \+ 1\) \+|bandwidth_bound_pass\(k \+ 1\) \+", "app/ceiling/speculation.py") == []


def test_the_ranking_drafts_as_deep_as_the_engine() -> None:
    """The suffix drafter is ranked at the policy's own cap (it once had a cap of 8 of its own)."""
    assert _copies(r"NGRAM_K_MAX") == []
    rates, limit = recommend.acceptance_rates(0.99, [], recommend.K_MAX)
    assert recommend.predict(rates, limit, 0.0)[0] == DraftSettings().k_max


# --- exit statuses and completion mode ---------------------------------------------------------------------


def test_exit_statuses_have_one_home() -> None:
    assert _copies(r"^EXIT_\w+ = ", "app/cli/exit_codes.py") == []
    assert [line for line in _copies(r"return [1-9]\d*\s*$") if line.startswith("app/cli/")] == []


def test_completion_mode_reads_one_prompt() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Once"},
                {"role": "assistant", "content": " upon"}, {"role": "user", "content": " a time"}]
    assert completion_text(messages) == "Once upon a time"
    assert _copies(r"""m\.get\("role"\) in \("user", "assistant"\)""", "app/engine/chat_template.py") == []
