"""A pair `specdeck tune` measured: the picker starts from its winning settings and shows what they gave."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.engine.params import DraftSettings
from app.library.tuned import TunedSettings, save_tuned


def test_picker_uses_the_tuned_settings_of_the_chosen_pair(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path,  # type: ignore[no-untyped-def]
) -> None:
    tuned = TunedSettings(DraftSettings(ngram=5, adaptive=False, k=6, k_max=6), 1.9, 1.8, 2.0, 3, "p.jsonl", 0.0)
    save_tuned(str(tiny_target), None, tuned)  # into the test's scratch SPECDECK_HOME
    window = make_window(start_engine=False, folders=(tiny_target.parent,))
    picker = window.picker
    with qtbot.waitSignal(picker.drafters_ranked, timeout=30_000):
        assert picker.select_target(tiny_target)
    assert picker.tuned_label.text() == "tuned: 1.90× on your prompts"
    draft = picker.load_settings().draft
    assert (draft.ngram, draft.adaptive, draft.k, draft.k_max) == (5, False, 6, 6)

    # The user's own change stays while the pair stays chosen.
    picker.k_spin.setValue(3)
    picker._apply_tuned()
    assert picker.load_settings().draft.k == 3

    # Another pair was never tuned: nothing is claimed for it, and the settings shown stay as they are.
    assert picker.select_drafter(tiny_drafter_same)
    assert picker.tuned_label.text() == ""
    assert picker.load_settings().draft.k == 3
