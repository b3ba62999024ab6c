"""The window names the suffix drafter as what it is (no "n-gram" or "prompt lookup" left on screen), and the
Models panel has the "Draft from earlier answers" switch, which Load and the saved settings follow."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QAbstractButton, QLabel, QWidget
from pytestqt.qtbot import QtBot

from app.params import HISTORY_TOKENS
from app.storage.settings import AppSettings
from tests.ui.conftest import choose_pair


def _texts(root: QWidget) -> list[str]:
    out = []
    for widget in root.findChildren(QWidget):
        if isinstance(widget, QAbstractButton | QLabel):
            out.append(widget.text())
        out.append(widget.toolTip())
    return out


def test_the_suffix_drafter_is_named_and_drafting_from_history_is_a_switch(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    choose_pair(qtbot, window, tiny_target, ngram=2)
    picker = window.picker
    assert picker.ngram_check.text() == "Suffix drafter, shortest match"
    shown = [t.lower() for t in _texts(window)]
    assert not [t for t in shown if "n-gram" in t or "prompt lookup" in t or "key length" in t]
    assert any("suffix drafter" in t for t in shown)  # the colour key and the highlight switch too

    check = picker.history_check
    assert check.text() == "Draft from earlier answers"
    assert check.isChecked() == (AppSettings().load.draft.history_tokens > 0)
    check.setChecked(True)
    assert picker.load_settings().draft.history_tokens == HISTORY_TOKENS
    check.setChecked(False)
    assert picker.load_settings().draft.history_tokens == 0
    assert picker.update_settings(AppSettings()).load.draft.history_tokens == 0
    picker.apply_settings(AppSettings())
    assert check.isChecked()
