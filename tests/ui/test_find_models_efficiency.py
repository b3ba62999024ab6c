"""The Find models view says what its predicted plain tok/s is: the ceiling times doctor's measured efficiency
when this machine has one, else the ceiling, as `specdeck search` does (one fact, from app.hub.verdict)."""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.ceiling.roofline import Device
from app.hub.efficiency import device_id, save_efficiency
from app.hub.verdict import CEILING_ONLY
from tests.gguf_fixtures import write_tiny_model
from tests.hub_lookalike import HubLookalike
from ui.hub.find_models import FindModelsDialog

REPO = "acme/Tiny-GGUF"
Q8 = "Tiny-Q8_0.gguf"
HUB_MS = 60_000  # a bound on a hung request, not a measurement
CPU = Device("cpu", "Test CPU 9000", "cpu", 40e9, None, 8 << 30)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, specdeck_home: Path) -> Iterator[HubLookalike]:
    server = HubLookalike()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(tmp_path / "models"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(FindModelsDialog, "_machine", lambda self: [CPU])  # fixed devices, no probe
    server.add_file(REPO, Q8, write_tiny_model(tmp_path / "tiny.gguf", name="tiny"))
    yield server
    server.close()


def judged_q8(qtbot: QtBot, make_window: object) -> tuple[FindModelsDialog, str, str, str]:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window.find_models.action.trigger()
    dialog = window.find_models.dialog
    assert dialog is not None
    dialog.query_edit.setText("tiny")
    with qtbot.waitSignal(dialog.searched, timeout=HUB_MS):
        dialog.search_button.click()
    with qtbot.waitSignal(dialog.judged, timeout=HUB_MS):
        dialog.repo_tree.setCurrentItem(dialog.repo_tree.topLevelItem(0))
    item = dialog.quant_tree.topLevelItem(0)
    assert item is not None
    assert item.text(1) == Q8
    dialog.select_quant(Q8)
    return dialog, item.text(4), item.toolTip(4), dialog.fit_label.text()


@pytest.mark.parametrize("measured", [False, True])
def test_the_view_says_what_its_speed_is(qtbot: QtBot, make_window: object, hub: HubLookalike,
                                         measured: bool) -> None:
    if measured:
        save_efficiency(device_id("cpu", CPU.name), 0.25, backend="cpu")
    dialog, speed, tip, fit = judged_q8(qtbot, make_window)
    verdict = dialog.verdicts[Q8].verdict
    assert verdict.ceiling_tokens_per_second is not None
    assert verdict.tokens_per_second == pytest.approx(verdict.ceiling_tokens_per_second * (0.25 if measured else 1))
    basis = "predicted from doctor's measured 25 % of the ceiling" if measured else CEILING_ONLY
    assert html.escape(basis) in tip  # a rich-text tooltip
    assert f"Plain decoding {speed} tok/s: {basis}" in fit
