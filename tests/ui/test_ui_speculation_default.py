"""Speculation is on from the first answer in a fresh home: the n-gram drafter is checked, and the best
compatible drafter model predicted to pay is chosen; a pair the user saved (or a drafter they chose, "none"
included) is kept as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.params import NGRAM_KEY_LENGTH
from app.storage.settings import AppSettings, save_settings, setting, with_settings


def _big_and_small(factory: Callable[..., Path]) -> tuple[Path, Path]:
    """A target and a same-vocabulary drafter a sixteenth its size: predicted to pay by construction."""
    target = factory("big-target.gguf", n_embd=256, n_layer=4, n_ff=512, name="big-target")
    drafter = factory("small-drafter.gguf", name="small-drafter")
    return target, drafter


def _choose_target(qtbot: QtBot, window, target: Path) -> None:  # type: ignore[no-untyped-def]
    picker = window.picker
    if picker.target_path() == str(target) and picker._report_for == str(target):
        return
    with qtbot.waitSignal(picker.drafters_ranked, timeout=30_000):
        assert picker.select_target(target) or picker.target_path() == str(target)


def test_a_fresh_home_drafts_with_the_ngram_drafter_and_the_best_drafter_model(
    qtbot: QtBot, make_window, tiny_model_factory  # type: ignore[no-untyped-def]
) -> None:
    target, drafter = _big_and_small(tiny_model_factory)
    window = make_window(folders=(target.parent,))
    picker = window.picker
    assert picker.ngram_check.isChecked()
    assert picker.ngram_spin.value() == NGRAM_KEY_LENGTH == AppSettings().load.draft.ngram
    _choose_target(qtbot, window, target)
    assert picker.drafter_path() == str(drafter), picker.drafter_combo.currentText()
    draft = picker.load_settings().draft
    assert draft.speculative
    assert draft.ngram == NGRAM_KEY_LENGTH
    assert draft.drafter_path == str(drafter)


def test_the_widgets_show_the_settings_defaults(make_window) -> None:  # type: ignore[no-untyped-def]
    """One home for each default: what a fresh window shows is AppSettings()'s."""
    window = make_window(start_engine=False)
    shown = window.picker.shown_values()
    defaults = AppSettings()
    assert shown == {name: setting(defaults, name) for name in shown}


def test_a_saved_pair_without_a_drafter_model_stays_without_one(
    qtbot: QtBot, make_window, tiny_model_factory  # type: ignore[no-untyped-def]
) -> None:
    target, _drafter = _big_and_small(tiny_model_factory)
    save_settings(with_settings(AppSettings(model_folders=(str(target.parent),)),
                                {"load.target_path": str(target), "load.draft.drafter_path": None}))
    window = make_window(start_engine=False)
    picker = window.picker
    qtbot.waitUntil(lambda: picker._report_for == str(target), timeout=30_000)
    assert picker.drafter_path() is None


def test_a_drafter_the_user_turned_off_stays_off_for_the_next_target(
    qtbot: QtBot, make_window, tiny_model_factory  # type: ignore[no-untyped-def]
) -> None:
    target, drafter = _big_and_small(tiny_model_factory)
    other = tiny_model_factory("other-target.gguf", n_embd=256, n_layer=4, n_ff=512, seed=3, name="other")
    window = make_window(start_engine=False, folders=(target.parent,))
    picker = window.picker
    _choose_target(qtbot, window, target)
    assert picker.drafter_path() == str(drafter)
    picker.drafter_combo.setCurrentIndex(0)
    picker.drafter_combo.activated.emit(0)  # what a user's click sends
    _choose_target(qtbot, window, other)
    assert picker.drafter_path() is None
