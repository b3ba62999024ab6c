"""LiveMetrics: the numbers the dashboard plots, fed with synthetic engine events and with a real answer's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.ceiling.builder import CeilingInfo, ceiling_for_loaded
from app.ceiling.calibration import make_calibration
from app.ceiling.memory import MemoryProbe
from app.ceiling.metrics import LiveMetrics, leviathan_curve
from app.ceiling.roofline import Device
from app.events import Finished, Loaded, MessageStats, ModelSummary, PassStats


def loaded(path: str = "/nowhere/model.gguf", n_ctx: int = 4096) -> Loaded:
    target = ModelSummary(path, "t", "llama", 1_000_000, 2_000_000_000, 4096, 8, 269)
    return Loaded(target, None, 0, n_ctx, "cuda", True, 1000, 1000 * n_ctx, 0.5)


def pass_stats(i: int, *, t: float, accepted: tuple[bool, ...] = (True, True, False), k: int = 3,
               drafted: int = 3, request_id: int = 1, context: int = 100, busy: float = 0.01) -> PassStats:
    n_acc = sum(accepted)
    return PassStats(
        request_id=request_id, t_start=t, draft_seconds=busy / 2, verify_seconds=busy / 2, k=k,
        drafted=drafted, accepted=accepted, emitted=n_acc + 1, from_ngram=0, from_model=n_acc,
        context_tokens=context + i, kv_bytes_used=(context + i) * 1000, verify_width=drafted + 1,
    )


def finished(request_id: int = 1) -> Finished:
    stats = MessageStats(10, 30, 0.1, 100.0, 50.0, 0.6, 10, 30, 20, 0.67, 3.0, (0.9, 0.7, 0.4), (3,) * 10,
                         2.0)
    return Finished(request_id, "eog", stats, "text")


def test_leviathan_curve() -> None:
    ks, taus = leviathan_curve(0.8, 3)
    assert ks.tolist() == [0, 1, 2, 3]
    assert taus[3] == pytest.approx(2.952)
    assert taus[0] == pytest.approx(1.0)
    assert leviathan_curve(1.0, 4)[1][-1] == pytest.approx(5.0)


def test_series_per_pass_and_wall_time() -> None:
    m = LiveMetrics(capacity=64)
    m.on_loaded(loaded(), CeilingInfo(contexts=(0, 4096), spec_tps=(100.0, 50.0)))
    # One pass every 20 ms, each emitting 3 tokens (2 accepted of 3 drafted).
    for i in range(10):
        m.on_pass(pass_stats(i, t=5.0 + 0.02 * i))
    s = m.snapshot()
    assert s.passes == 10
    assert s.t == pytest.approx(0.02 * np.arange(10))
    # Completed passes use the wall gap (3 / 0.02 = 150); the last still the measured parts (3 / 0.01).
    assert s.tps[:-1] == pytest.approx(150.0)
    assert s.tps[-1] == pytest.approx(300.0)
    assert s.tps_smooth[-1] == pytest.approx(150.0)
    assert s.acceptance == pytest.approx(2 / 3)
    assert s.acceptance_roll[-1] == pytest.approx(2 / 3)
    assert s.tau == pytest.approx(3.0)
    assert s.k == pytest.approx(3.0)
    assert not s.t.flags.writeable


def test_rolling_values_and_alpha() -> None:
    m = LiveMetrics(accept_window=4)
    m.on_loaded(loaded())
    for i in range(4):
        m.on_pass(pass_stats(i, t=0.02 * i, accepted=(False,)))
    for i in range(4, 8):
        m.on_pass(pass_stats(i, t=0.02 * i, accepted=(True, True, True)))
    cur = m.current()
    assert cur.acceptance == pytest.approx(1.0)  # the window holds only the last 4 passes
    assert cur.alpha == pytest.approx(1.0)
    assert cur.tau == pytest.approx(4.0)
    # Message α: 12 accepted of 16 positions tested (each rejection counts as one tested position).
    assert m.message_alpha() == pytest.approx(12 / 16)
    s = m.snapshot()
    assert s.acceptance_roll[3] == pytest.approx(0.0)
    assert math.isclose(s.curve_tau[3], (1 - 0.75**4) / 0.25)


def test_per_position_and_tau_by_k() -> None:
    m = LiveMetrics()
    m.on_loaded(loaded())
    m.on_pass(pass_stats(0, t=0.0, accepted=(True, True, True), k=3, drafted=3))
    m.on_pass(pass_stats(1, t=0.02, accepted=(True, False), k=3, drafted=3))
    m.on_pass(pass_stats(2, t=0.04, accepted=(False,), k=2, drafted=2))
    m.on_pass(pass_stats(3, t=0.06, accepted=(), k=0, drafted=0))
    s = m.snapshot()
    # Same definition as MessageStats: accepted at position j / drafted at position j.
    assert s.position_drafted.tolist() == [3, 3, 2]
    assert s.position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert s.tau_by_k_k.tolist() == [0, 2, 3]
    assert s.tau_by_k_mean == pytest.approx([1.0, 1.0, 3.0])
    assert math.isnan(s.acceptance[-1])  # nothing drafted


def test_context_fill_and_pct_of_ceiling() -> None:
    m = LiveMetrics()
    m.on_loaded(loaded(n_ctx=2048), CeilingInfo(contexts=(0, 2048), spec_tps=(100.0, 100.0), efficiency=0.8,
                                                  device="GPU (1000 GB/s)"))
    for i in range(20):
        m.on_pass(pass_stats(i, t=0.02 * i, context=500))
    cur = m.current()
    assert cur.context_tokens == 519
    assert cur.context_text == "519 of 2,048 tokens"
    assert cur.kv_bytes_used == 519_000
    assert cur.kv_bytes_total == 2048 * 1000
    assert cur.tps == pytest.approx(150.0)
    assert cur.pct_of_ceiling == pytest.approx(150.0)  # above the one-token wall
    assert cur.pct_of_speculative == pytest.approx(50.0)  # τ = 3
    s = m.snapshot()
    assert s.spec_ceiling == pytest.approx(100.0)
    assert s.measured_ceiling == pytest.approx(80.0)
    assert s.speculative_ceiling == pytest.approx(300.0)
    assert cur.backend == "cuda"
    assert cur.device == "GPU (1000 GB/s)"


def test_ceiling_interpolates_over_context() -> None:
    c = CeilingInfo(contexts=(0, 1000), spec_tps=(100.0, 50.0))
    assert c.spec_at(500) == pytest.approx(75.0)
    assert c.measured_at(500) is None
    assert CeilingInfo(measured_tps=42.0).measured_at(10) == 42.0


def test_new_request_starts_new_generation_and_finish() -> None:
    m = LiveMetrics()
    m.on_loaded(loaded())
    for i in range(5):
        m.on_pass(pass_stats(i, t=float(i)))
    assert m.generating
    m.on_finished(finished())
    assert not m.generating
    assert m.snapshot().last_stats is not None
    m.on_pass(pass_stats(0, t=100.0, request_id=2))
    s = m.snapshot()
    assert s.passes == 1
    assert s.t.tolist() == [0.0]


def test_ring_buffer_keeps_last_capacity_points() -> None:
    m = LiveMetrics(capacity=8)
    m.on_loaded(loaded())
    for i in range(20):
        m.on_pass(pass_stats(i, t=0.01 * i))
    s = m.snapshot()
    assert len(s.t) == 8
    assert s.t == pytest.approx(0.01 * np.arange(12, 20))
    assert s.context.tolist() == list(range(112, 120))


def test_live_measured_ceiling_from_plain_passes() -> None:
    m = LiveMetrics()
    m.on_loaded(loaded())
    for i in range(3):
        m.on_pass(pass_stats(i, t=0.02 * i, accepted=(), k=0, drafted=0, busy=0.02))
    assert m.measured_ceiling() == pytest.approx(100.0)


def test_unloaded_and_reset() -> None:
    m = LiveMetrics()
    m.on_loaded(loaded())
    m.on_pass(pass_stats(0, t=0.0))
    m.reset()
    assert m.snapshot().passes == 0
    assert m.loaded is not None
    m.on_unloaded()
    assert m.loaded is None
    assert m.current().n_ctx == 0


def test_ceiling_for_loaded_with_given_devices(tiny_target: Path) -> None:
    gpu = Device("gpu0", "Test GPU", "gpu", 1e12)
    cpu = Device("cpu", "Test CPU", "cpu", 5e10)
    ld = loaded(str(tiny_target), n_ctx=1024)
    c = ceiling_for_loaded(ld, [cpu, gpu], calibration=make_calibration(50.0, 1.0, 1.0, 100.0))
    assert c is not None
    assert c.contexts[0] == 0
    assert c.contexts[-1] == 1024
    spec0 = c.spec_at(0)
    assert spec0 is not None
    assert spec0 > 0
    assert c.spec_tps[-1] <= c.spec_tps[0]  # more KV read at a fuller context
    assert c.measured_at(0) == pytest.approx(spec0 * 0.5)
    assert "Test GPU" in c.device
    assert ceiling_for_loaded(loaded(n_ctx=1024), [cpu, gpu]) is None  # the file is not there


def test_ceiling_for_loaded_without_devices(tiny_target: Path) -> None:
    assert ceiling_for_loaded(loaded(str(tiny_target)), find_devices=lambda _loaded: None) is None


def test_memory_probe_reads_ram_and_injected_gpus() -> None:
    from app.ceiling.memory import GpuMemory

    r = MemoryProbe(lambda: (GpuMemory(0, "G", 8 << 30, 2 << 30),)).read()
    assert r.ram_total > 0
    assert 0 < r.ram_used <= r.ram_total
    assert r.process_rss > 0
    assert r.gpus[0].total == 8 << 30
    probe = MemoryProbe(lambda: ())
    assert probe.read().gpus == ()


def test_the_dashboards_counts_are_the_answers_own(tiny_target: Path) -> None:
    """One definition: the dashboard's acceptance and τ for an answer equal the Finished stats that the
    chat's stats line and `specdeck bench` report, computed from the same PassStats."""
    from app.engine.session import EngineSession
    from app.params import DraftSettings, LoadSettings, SamplingSettings

    settings = LoadSettings(str(tiny_target), DraftSettings(ngram=2, adaptive=False, k=3, k_max=4), n_ctx=512,
                            n_threads=1)
    session = EngineSession(settings)
    try:
        live = LiveMetrics()
        live.on_loaded(session.loaded_event())
        messages = [{"role": "user", "content": "Count: one two three, one two three, one two"}]
        for event in session.generate(7, messages, SamplingSettings(temperature=0.0, max_tokens=60)):
            if isinstance(event, PassStats):
                live.on_pass(event)
            elif isinstance(event, Finished):
                stats = event.stats
    finally:
        session.close()
    assert stats.drafted > 0
    counts = live.message
    assert (counts.tokens, counts.passes, counts.drafted, counts.accepted) == (
        stats.completion_tokens, stats.passes, stats.drafted, stats.accepted)
    assert counts.acceptance == stats.acceptance
    assert counts.tokens_per_pass == stats.tokens_per_pass
    assert stats.counts.decode_tps == stats.decode_tps
