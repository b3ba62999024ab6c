"""The dashboard's bandwidth roof is the same from one start to the next: the CPU's bandwidth is probed once
per machine (the best of several probes, cached), and the window never takes a cached probe again, even one
taken while the machine was busy (doctor does that)."""

from __future__ import annotations

import json
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.ceiling.cpu import PROBE_CACHE_FILE
from app.paths import cache_dir
from tests.ui.conftest import load_pair

CEILING_TIMEOUT_MS = 120_000


def _roof(qtbot: QtBot, window, target: Path) -> tuple[str, float]:  # type: ignore[no-untyped-def]
    load_pair(qtbot, window, target)
    metrics = window.dashboard.metrics
    qtbot.waitUntil(lambda: metrics.ceiling is not None and metrics.ceiling.contexts != (), timeout=CEILING_TIMEOUT_MS)
    ceiling = metrics.ceiling
    spec = ceiling.spec_at(1024)
    assert spec is not None
    return ceiling.device, spec


def test_a_second_start_shows_the_same_roof(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    first = make_window(folders=(tiny_target.parent,))
    device, roof = _roof(qtbot, first, tiny_target)
    assert "GB/s" in device
    first.close()
    # As if the first start had probed while the machine was busy: the figure read low and is marked so.
    cache = cache_dir() / PROBE_CACHE_FILE
    saved = json.loads(cache.read_text())
    assert saved["runs"] == 1
    cache.write_text(json.dumps({**saved, "quiet": False}))

    second = make_window(folders=(tiny_target.parent,))
    assert _roof(qtbot, second, tiny_target) == (device, roof)
    assert json.loads(cache.read_text()) == {**saved, "quiet": False}  # not measured again
