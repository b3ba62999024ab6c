"""The picker and settings: compatibility badge and refusal, invalid sampling values, the first-run panel."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.ui.conftest import choose_pair
from ui.models.picker import TOOLTIP_ROLE


def test_incompatible_drafter_shows_reason_and_load_refuses(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path,  # type: ignore[no-untyped-def]
    tiny_drafter_other_vocab: Path,
) -> None:
    window = make_window(start_engine=False, folders=(tiny_target.parent,))
    picker = window.picker
    choose_pair(qtbot, window, tiny_target, tiny_drafter_other_vocab)
    listed = picker.drafter_combo.model().item(picker.drafter_combo.findData(str(tiny_drafter_other_vocab)))
    assert not listed.isEnabled()  # listed with its reason, never offered to click
    assert picker.drafter_combo.model().item(picker.drafter_combo.findData(str(tiny_drafter_same))).isEnabled()
    badge = picker.compat_badge.text()
    assert "Incompatible" in badge
    assert "token" in badge  # the reason names the failing check
    assert not picker.load_box.load_button.isEnabled()
    loads: list[object] = []
    picker.load_requested.connect(loads.append)
    assert not picker.request_load()
    assert loads == []
    assert "cannot speculate" in window.notifier.last_message
    assert window.bridge.last_load is None

    # The same target with a matching drafter is fine, and the fit estimate is shown before loading.
    assert picker.select_drafter(tiny_drafter_same)
    assert picker.compat_badge.text().startswith("✓")
    assert picker.load_box.load_button.isEnabled()
    # worked out off the GUI thread
    qtbot.waitUntil(lambda: "needs" in picker.load_box.fit_label.text(), timeout=10_000)
    assert "KV" in picker.load_box.fit_label.text()
    settings = picker.load_settings()
    assert settings.draft.drafter_path == str(tiny_drafter_same)
    assert settings.n_threads == 1


def test_sampling_fields_are_spin_boxes_with_the_ranges_validation_accepts(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    form = window.sampling_form
    form.set_value("temperature", 9.0)  # clamped to the top of its range, never refused later
    form.set_value("top_p", 0.0)  # 0 is refused by validation, so the field stops above it
    form.set_value("top_k", -5)
    settings = form.settings()
    assert (settings.temperature, settings.top_k) == (5.0, 0)
    assert settings.top_p > 0
    assert form.error_label.isHidden()
    for name, spin in form.spins.items():  # each end of each range is a valid setting
        for value in (spin.minimum(), spin.maximum()):
            form.set_value(name, value)
            assert form.error() is None, (name, value)


def test_first_run_panel_when_there_are_no_models(
    qtbot: QtBot, make_window, no_models: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    assert window.stack.currentWidget() is window.first_run
    assert window.first_run.demo_button.isEnabled()


def test_gpu_layers_on_a_cpu_only_build_says_nothing_is_offloaded(
    qtbot: QtBot, make_window  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False)
    picker = window.picker
    assert picker.load_box.gpu_note.isHidden()  # not known yet: nothing said
    picker.set_gpu_offload_available(False)  # what the build probe reports on a CPU-only llama.cpp
    assert not picker.load_box.gpu_note.isHidden()
    assert "no layer will be offloaded" in picker.load_box.gpu_note.text()
    picker.set_gpu_offload_available(True)
    assert picker.load_box.gpu_note.isHidden()


def test_fit_estimate_reads_the_model_off_the_gui_thread_and_drops_an_earlier_choice(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fit estimate parses the model's tensor table. Here each estimate is held until the test lets it go:
    choosing another model meanwhile goes on at once, and the held estimate, for the earlier model, is never
    shown."""
    import ui.models.load_box as load_box_module

    real_fit_text = load_box_module.fit_text
    gates: dict[str, threading.Event] = {}  # the models whose estimate is held, until their event is set
    asked: list[tuple[str, threading.Thread]] = []

    def held_fit_text(target, *args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append((target.path, threading.current_thread()))
        gate = gates.get(target.path)
        if gate is not None:
            gate.wait(timeout=10)
        return real_fit_text(target, *args, **kwargs)

    monkeypatch.setattr(load_box_module, "fit_text", held_fit_text)
    window = make_window(start_engine=False, folders=(tiny_target.parent,))
    picker = window.picker
    qtbot.waitUntil(lambda: "needs" in picker.load_box.fit_label.text(), timeout=10_000)  # the start-up choice's
    first, second = ((tiny_target, tiny_drafter_same) if picker.target_path() != str(tiny_target)
                     else (tiny_drafter_same, tiny_target))
    gates.update({str(first): threading.Event(), str(second): threading.Event()})
    try:
        assert picker.select_target(first)
        qtbot.waitUntil(lambda: asked[-1][0] == str(first), timeout=10_000)
        assert picker.load_box.fit_label.text() == load_box_module.FIT_READING
        # The first model's estimate is still held: choosing another one does not wait for it.
        assert picker.select_target(second)
        assert picker.target_path() == str(second)
        assert picker.load_box.fit_label.text() == load_box_module.FIT_READING
        gates[str(first)].set()
        # The second estimate starts only once the first has come back (one at a time), which was dropped.
        qtbot.waitUntil(lambda: asked[-1][0] == str(second), timeout=10_000)
        assert picker.load_box.fit_label.text() == load_box_module.FIT_READING
        gates[str(second)].set()
        qtbot.waitUntil(lambda: "needs" in picker.load_box.fit_label.text(), timeout=10_000)
        assert all(thread is not threading.main_thread() for _, thread in asked), asked
    finally:
        for gate in gates.values():
            gate.set()


def test_trained_heads_are_offered_as_drafters_for_their_target_with_the_reason_where_they_do_not_fit(
    qtbot: QtBot, make_window, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    from app.library.heads import OWN_MTP_HEADS
    from tests.gguf_fixtures import write_dflash_drafter, write_eagle3_drafter, write_tiny_model

    folder = tmp_path / "heads"
    target = write_tiny_model(folder / "llama-target.gguf", n_layer=4, name="llama-target")
    mtp_target = write_tiny_model(folder / "qwen-mtp.gguf", arch="qwen35", n_layer=4, mtp_layers=1, name="qwen-mtp")
    eagle = write_eagle3_drafter(folder / "head-eagle3.gguf")
    dflash = write_dflash_drafter(folder / "head-dflash.gguf")
    narrow = write_dflash_drafter(folder / "head-narrow.gguf", n_embd=32, name="narrow")
    window = make_window(start_engine=False, folders=(folder,))
    picker = window.picker
    # Heads are never chat models.
    targets = [picker.target_combo.itemData(i) for i in range(picker.target_combo.count())]
    assert str(target) in targets
    assert not {str(eagle), str(dflash), str(narrow)} & set(targets)

    choose_pair(qtbot, window, target)
    combo = picker.drafter_combo
    labels = {combo.itemData(i): combo.itemText(i) for i in range(combo.count())}
    # Heads that fit are ranked with a prediction, as the drafter models are.
    assert "(EAGLE-3 drafter) — predicted" in labels[str(eagle)]
    assert "(DFlash drafter) — predicted" in labels[str(dflash)]
    assert labels[str(narrow)].startswith("✗")
    assert OWN_MTP_HEADS not in labels  # a llama file has no MTP heads
    tip = combo.itemData(combo.findData(str(narrow)), TOOLTIP_ROLE)
    assert "trained on a target 32 wide" in tip
    assert picker.select_drafter(narrow)
    assert "trained on a target 32 wide" in picker.compat_badge.text()
    assert not picker.load_box.load_button.isEnabled()
    assert picker.select_drafter(dflash)
    assert picker.compat_badge.text().startswith("✓")
    assert picker.load_settings().draft.drafter_path == str(dflash)

    choose_pair(qtbot, window, mtp_target)
    index = combo.findData(OWN_MTP_HEADS)
    assert combo.itemText(index).startswith(f"{OWN_MTP_HEADS} — predicted")
    combo.setCurrentIndex(index)
    settings = picker.load_settings()
    assert settings.draft.mtp
    assert settings.draft.drafter_path is None
