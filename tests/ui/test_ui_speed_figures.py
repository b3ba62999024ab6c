"""One speed figure: the footer's speedup divides by the plain rate measured at the answer's own time, by its
own passes (never a burst timed at load), and is shown only for an answer that kept a draft token; a Continue's
footer covers the whole answer; the strip names the roof between answers, and a probed bandwidth is called
probed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.ceiling.builder import CeilingInfo
from app.events import MessageStats, continued_stats, message_stats, speedup_over_plain
from tests.ui.conftest import load_pair, set_sampling
from ui.chat.message import format_stats
from ui.figures import speedup_text

ANSWER_TIMEOUT_MS = 60_000
STATS = MessageStats(prompt_tokens=20, completion_tokens=41, ttft_seconds=0.2, prefill_tps=500.0, decode_tps=80.0,
                     decode_seconds=0.5, passes=20, drafted=30, accepted=21, acceptance=0.7, tokens_per_pass=2.05,
                     per_position_acceptance=(0.9, 0.7), k_history=(2,) * 20, speedup_estimate=1.0,
                     decode_tokens=40, end_tokens=0)


def test_the_speedup_is_over_the_plain_rate_and_only_for_an_answer_that_drafted() -> None:
    assert speedup_over_plain(STATS.decode_tps, STATS.accepted, 40.0) == pytest.approx(2.0)
    assert speedup_over_plain(STATS.decode_tps, STATS.accepted, 0.0) == 0.0  # no plain rate measured: no ratio
    plain = replace(STATS, drafted=0, accepted=0, acceptance=0.0)
    assert speedup_over_plain(plain.decode_tps, plain.accepted, 40.0) == 0.0  # nothing drafted: no ratio
    rejected = replace(STATS, accepted=0, acceptance=0.0)
    assert speedup_over_plain(rejected.decode_tps, rejected.accepted, 40.0) == 0.0  # all rejected: no ratio
    assert speedup_text(2.0) in format_stats(replace(STATS, speedup_estimate=2.0))
    assert "×" not in format_stats(replace(plain, speedup_estimate=0.0))
    assert "×" not in format_stats(replace(STATS, speedup_estimate=0.0))


def test_a_continued_answer_adds_up_both_parts() -> None:
    then = replace(STATS, prompt_tokens=61, completion_tokens=10, prefill_tps=0.0, ttft_seconds=0.05, passes=5,
                   drafted=4, accepted=1, decode_tokens=9, decode_seconds=0.25, k_history=(1,) * 5)
    both = continued_stats(STATS, then)
    assert (both.completion_tokens, both.passes, both.drafted, both.accepted) == (51, 25, 34, 22)
    assert both.decode_tps == pytest.approx((40 + 9) / (0.5 + 0.25))
    assert (both.prompt_tokens, both.prefill_tps, both.ttft_seconds) == (20, 500.0, 0.2)  # the first part's
    assert len(both.k_history) == 25
    # The history gives stats back as a JSON object (lists for tuples): they are read back whole.
    stored = {**STATS.__dict__, "k_history": list(STATS.k_history), "unknown": 1}
    assert message_stats(stored) == STATS


def test_the_footer_divides_by_the_plain_rate_of_the_answer_s_own_time(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target, ngram=1)
    loaded = window.bridge.loaded
    assert loaded.plain_tps > 0
    chat = window.chat
    set_sampling(window, temperature=0, max_tokens=24)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS):
        assert chat.send("one two three one two three one two three one two three")
    answer = chat.messages[-1]
    stats = answer.stats
    assert isinstance(stats, MessageStats)
    window.dashboard._paint()
    assert window.dashboard.snapshot().measured_ceiling == loaded.plain_tps  # the chart's plain line
    footer = chat.view.stats_lines()[-1]
    assert stats.plain_tps > 0  # the one-token rate of the end of this answer, from its own passes
    if stats.accepted:  # the tiny model's text decides whether the n-gram drafter found anything
        assert stats.speedup_estimate == pytest.approx(stats.decode_tps / stats.plain_tps)
        assert speedup_text(stats.speedup_estimate) in footer
    else:
        assert "×" not in footer
    assert "suffix drafter (1)" in footer  # the suffix drafter is named with the model
    assert window.store.messages(chat.chat_id)[-1].drafter == "suffix drafter (1)"

    if answer.stop_reason == "max_tokens":
        first = stats
        with qtbot.waitSignal(window.bridge.generation_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
            assert chat.continue_answer()
        more = finished.args[0].stats
        assert chat.messages[-1].stats.completion_tokens == first.completion_tokens + more.completion_tokens
        assert chat.messages[-1].stats.passes == first.passes + more.passes


def test_the_strip_names_the_roof_between_answers_and_calls_a_probed_bandwidth_probed(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    dashboard = window.dashboard
    dashboard.set_ceiling(CeilingInfo(contexts=(0, 4096), spec_tps=(250.0, 200.0), device="CPU (30 GB/s)",
                                      bandwidth_source="probed"))
    pct = dashboard.labels["pct"].text()
    assert pct == "roof 250 tok/s"  # no speed to compare yet, but the roof drawn is named, not "unknown"
    assert "probed bandwidth" in dashboard.tps_legend.text
    assert "spec-sheet" not in dashboard.tps_legend.text + pct
    dashboard.set_ceiling(None)
    assert dashboard.labels["pct"].text() == "roof unknown"
