"""The soak's freeze report: while the GUI thread is late, the watcher records where it was stuck."""

from __future__ import annotations

import sys
import time

from ui.soak.stall_watch import StallWatch


def held_by_a_blocking_call(watch: StallWatch) -> None:
    deadline = time.monotonic() + 30
    while not (watch.stalls and watch.stalls[0].samples) and time.monotonic() < deadline:
        time.sleep(0.005)  # a blocking call on the "GUI thread": no beat meanwhile


def test_a_stall_is_reported_with_the_stack_that_caused_it() -> None:
    watch = StallWatch(threshold_s=0.05)
    try:
        watch.beat()
        held_by_a_blocking_call(watch)
        watch.beat()
    finally:
        watch.stop()
    report = watch.report()
    assert report["stalls"] >= 1
    top = report["top_stacks"][0]
    assert any("held_by_a_blocking_call" in frame for frame in top["stack"])
    assert any(frame.startswith("tests/ui/test_stall_watch.py:") for frame in top["stack"])
    stall = report["each"][0]
    assert stall["ms"] >= 50
    assert "held_by_a_blocking_call" in stall["where"]
    if sys.platform.startswith("linux"):  # the thread CPU clock and schedstat tell blocked from computing
        assert stall["gui_cpu"] is not None
        assert stall["gui_cpu"] < 0.5  # it slept: blocked, not computing
        assert stall["gui_runqueue"] is not None


def test_no_stall_while_the_loop_beats() -> None:
    watch = StallWatch(threshold_s=10.0)
    try:
        for _ in range(5):
            watch.beat()
            time.sleep(0.01)
    finally:
        watch.stop()
    assert watch.report()["stalls"] == 0
