"""A pair `specdeck tune` measured: the picker says what its winner gave and applies it only when asked, so the
user's own drafting settings win; the Tune window runs the sweep on the loaded pair and plots it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from pytestqt.qtbot import QtBot

from app.events import Loaded, ModelSummary
from app.measure.bench import BENCH_SAMPLING
from app.measure.tune import Candidate, TuneConfig, TuneReport
from app.params import DraftSettings, LoadSettings
from app.storage.settings import AppSettings, save_settings, with_settings
from app.storage.tuned import TunedSettings, load_tuned, save_tuned
from ui.dashboard.sweep import TuneDialog, TunePair

SWEEP_TIMEOUT_MS = 300_000


def test_choosing_a_tuned_pair_keeps_the_users_settings_until_asked(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path,  # type: ignore[no-untyped-def]
) -> None:
    tuned = TunedSettings(DraftSettings(ngram=5, adaptive=False, k=6, k_max=6), 1.9, 1.8, 2.0, 3, "p.jsonl", 0.0)
    save_tuned(str(tiny_target), None, tuned)  # into the test's scratch SPECDECK_HOME
    # The user's own saved drafting settings, as the window finds them at start-up.
    save_settings(with_settings(AppSettings(), {"load.target_path": str(tiny_target), "load.draft.ngram": 2,
                                                "load.draft.adaptive": True, "load.draft.k": 3,
                                                "load.draft.k_max": 12}))
    window = make_window(start_engine=False, folders=(tiny_target.parent,))
    picker = window.picker
    with qtbot.waitSignal(picker.drafters_ranked, timeout=30_000):
        assert picker.select_target(tiny_target) or picker.target_path() == str(tiny_target)
        if picker._report_for == str(tiny_target):
            picker.drafters_ranked.emit()
    draft = picker.load_settings().draft
    assert (draft.ngram, draft.adaptive, draft.k, draft.k_max) == (2, True, 3, 12)  # the user's, not the tune's
    assert picker.tuned_label.text() == "tuned: 1.90× on your prompts"
    assert picker.use_tuned_button.isVisibleTo(picker)

    picker.use_tuned_button.click()
    draft = picker.load_settings().draft
    assert (draft.ngram, draft.adaptive, draft.k, draft.k_max) == (5, False, 6, 6)

    # Afterwards the user's own change wins, also when the pair is chosen again.
    picker.k_spin.setValue(3)
    assert picker.select_drafter(tiny_drafter_same)
    assert picker.tuned_label.text() == ""  # another pair was never tuned: nothing is claimed for it
    assert not picker.use_tuned_button.isVisibleTo(picker)
    assert picker.select_drafter(None)
    assert picker.tuned_label.text() == "tuned: 1.90× on your prompts"
    assert picker.load_settings().draft.k == 3


def write_prompts(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Copy: one two three, one two three"}]})
                    + "\n")
    return path


def test_tune_window_sweeps_plots_saves_and_uses_the_winner(
    qtbot: QtBot, specdeck_home: Path, tiny_target: Path, tmp_path: Path,
) -> None:
    dialog = TuneDialog(TunePair(LoadSettings(str(tiny_target), n_ctx=512, n_threads=1)))
    qtbot.addWidget(dialog)
    dialog.plan = [Candidate(use_model=False, ngram=3), Candidate(use_model=False, ngram=2, k_max=4)]
    dialog.file_radio.setChecked(True)
    dialog.file_edit.setText(str(write_prompts(tmp_path)))
    dialog.max_tokens_spin.setValue(16)
    dialog.repeat_spin.setValue(2)
    with qtbot.waitSignal(dialog.finished_sweep, timeout=SWEEP_TIMEOUT_MS) as finished:
        assert dialog.start()
        assert dialog.cancel_button.isEnabled()
    report: TuneReport = finished.args[0]
    assert report.stopped == "done"
    assert [m.candidate for m in report.results] == dialog.plan

    plot = dialog.plot
    _xs, ys = plot.points.getData()
    assert list(ys) == [m.speedup for m in report.results]  # each setting's median, in the order measured
    bars = plot.bars.opts
    assert np.allclose(bars["y"] + bars["top"], [m.speedup_max for m in report.results])
    assert np.allclose(bars["y"] - bars["bottom"], [m.speedup_min for m in report.results])
    assert plot.plain_line.value() == 1.0
    best = report.best
    assert best is not None
    wx, wy = plot.winner.getData()
    if best in report.results:  # the winner is starred where it was measured
        assert list(wy) == [best.speedup]
        assert list(wx) == [float(report.results.index(best) + 1)]
    else:  # plain decoding won: no measured setting is starred
        assert len(wx) == 0

    lines = dialog.settings_label.text().splitlines()  # what each number along x stands for
    assert [line.split(": ", 1)[1].split(",")[0] for line in lines] == ["n-gram", "n-gram"]
    assert len(lines) == 2
    assert sum("★" in line for line in lines) == (1 if best in report.results else 0)

    saved = load_tuned(str(tiny_target), None)
    assert saved is not None
    assert saved.speedup == best.speedup
    assert dialog.use_button.isEnabled()
    with qtbot.waitSignal(dialog.use_settings, timeout=5_000) as used:
        dialog.use_button.click()
    assert used.args[0] == saved.draft


def test_tune_window_hands_the_sweep_a_typed_config_with_the_prompts_as_data(
    qtbot: QtBot, specdeck_home: Path, tiny_target: Path, tmp_path: Path,
) -> None:
    """No argv and no temporary prompts file: the sweep gets a TuneConfig holding the prompts themselves, the
    pair's load settings and the chat's sampling defaults, as `specdeck tune` builds it."""
    from app.storage.history import HistoryStore

    settings = LoadSettings(str(tiny_target), DraftSettings(drafter_path="/m/d.gguf"), n_ctx=512, n_threads=1)
    dialog = TuneDialog(TunePair(settings))
    qtbot.addWidget(dialog)
    prompts = write_prompts(tmp_path)
    config = dialog.tune_config(str(prompts), 10, 16, 3)
    assert config == TuneConfig(settings, ([{"role": "user", "content": "Copy: one two three, one two three"}],),
                                str(prompts), replace(BENCH_SAMPLING, max_tokens=16), repeat=3)

    with HistoryStore() as store:
        chat = store.new_chat("a chat")
        store.add_message(chat, "user", "a question")
        store.add_message(chat, "assistant", "an answer")
    dialog.plan = [Candidate(use_model=False, ngram=2)]
    config = dialog.tune_config("history", 5, 32, 1)
    assert config.prompts == ([{"role": "user", "content": "a question"}],)
    assert (config.source, config.sampling.max_tokens, config.repeat) == ("history", 32, 1)
    assert config.plan == (Candidate(use_model=False, ngram=2),)


def test_tune_window_cancel_keeps_what_was_measured(
    qtbot: QtBot, specdeck_home: Path, tiny_target: Path, tmp_path: Path,
) -> None:
    dialog = TuneDialog(TunePair(LoadSettings(str(tiny_target), n_ctx=512, n_threads=1)))
    qtbot.addWidget(dialog)
    dialog.plan = [Candidate(use_model=False, ngram=3), Candidate(use_model=False, ngram=2),
                   Candidate(use_model=False, ngram=4)]
    dialog.file_radio.setChecked(True)
    dialog.file_edit.setText(str(write_prompts(tmp_path)))
    dialog.max_tokens_spin.setValue(16)
    dialog.repeat_spin.setValue(1)
    dialog._signals.progress.connect(lambda _p: dialog.cancel())  # Cancel as soon as one setting is in
    with qtbot.waitSignal(dialog.finished_sweep, timeout=SWEEP_TIMEOUT_MS) as finished:
        assert dialog.start()
    report: TuneReport = finished.args[0]
    assert report.stopped == "cancelled"
    assert 1 <= len(report.results) < 3
    assert dialog.status_label.text().startswith("Cancelled")
    assert load_tuned(str(tiny_target), None) is not None  # the best of what was measured is saved
    assert dialog.start_button.isEnabled()


def test_picker_tunes_the_loaded_pair(
    qtbot: QtBot, make_window, tiny_target: Path,  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(start_engine=False, folders=(tiny_target.parent,))
    picker = window.picker
    assert not picker.tune_button.isEnabled()  # nothing loaded yet
    assert picker.open_tune() is None
    summary = ModelSummary(path=str(tiny_target), name="tiny", architecture="llama", n_params=1, size_bytes=1,
                           n_ctx_train=4096, n_layer=2, n_vocab=269)
    picker.show_loaded(Loaded(target=summary, drafter=None, ngram=3, n_ctx=512, backend="cpu", gpu_offload=False,
                              kv_bytes_per_token=1, kv_bytes_total=1, load_seconds=0.1))
    assert picker.tune_button.isEnabled()
    dialog = picker.open_tune()
    assert dialog is not None
    threads = picker.load_box.threads_spin.value()
    assert dialog.pair == TunePair(LoadSettings(str(tiny_target), n_ctx=512, n_threads=threads))
    tuned = DraftSettings(ngram=4, adaptive=True, k=4, k_max=16)
    dialog.use_settings.emit(tuned)
    draft = picker.shown_values()
    assert (draft["load.draft.ngram"], draft["load.draft.adaptive"], draft["load.draft.k_max"]) == (4, True, 16)
    dialog.close()
