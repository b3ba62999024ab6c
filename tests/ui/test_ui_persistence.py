"""Settings and history around the window: the last pair reloads on start when asked, a failing history
store is reported while the chat goes on in memory, and a crash restarts the engine by itself."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.errors import StorageError
from app.storage.settings import AppSettings, load_settings, save_settings, with_settings
from tests.ui.conftest import LOAD_TIMEOUT_MS, load_pair

TIMEOUT_MS = 30_000


def test_last_pair_reloads_on_start_and_settings_are_saved(
    qtbot: QtBot, make_window, tiny_target: Path, tiny_drafter_same: Path  # type: ignore[no-untyped-def]
) -> None:
    saved = AppSettings(model_folders=(str(tiny_target.parent),), reload_last_pair_on_start=True,
                        system_prompt="Be brief.")
    save_settings(with_settings(saved, {"load.target_path": str(tiny_target), "load.n_ctx": 512,
                                        "load.draft.drafter_path": str(tiny_drafter_same)}))
    window = make_window()
    qtbot.waitUntil(lambda: window.bridge.loaded is not None, timeout=LOAD_TIMEOUT_MS)
    assert window.bridge.loaded.target.path == str(tiny_target)
    assert window.bridge.loaded.drafter is not None
    assert window.chat.system_prompt.text() == "Be brief."
    window.sampling_form.set_value("temperature", 0.7)
    window.close()
    saved, warning = load_settings()
    assert warning is None
    assert saved.sampling.temperature == 0.7
    assert saved.load.draft.drafter_path == str(tiny_drafter_same)


def test_storage_failure_is_shown_and_the_chat_stays_in_memory(
    qtbot: QtBot, make_window, tiny_target: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    window.sampling_form.set_value("max_tokens", 16)
    assert window.store is not None

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise StorageError("Could not save the chat history: the disk is full.")

    monkeypatch.setattr(window.store, "add_message", disk_full)
    monkeypatch.setattr(window.store, "finish_answer", disk_full)
    with qtbot.waitSignal(window.bridge.generation_finished, timeout=TIMEOUT_MS):
        assert window.chat.send("hello")
    assert "disk is full" in window.notifier.last_message
    assert [m.role for m in window.chat.messages] == ["user", "assistant"]
    assert window.chat.messages[-1].status == "complete"


def test_crash_restarts_and_reloads_automatically(
    qtbot: QtBot, make_window, tiny_target: Path  # type: ignore[no-untyped-def]
) -> None:
    window = make_window(folders=(tiny_target.parent,))
    load_pair(qtbot, window, tiny_target)
    pid = window.bridge.worker_pid
    assert pid is not None
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        os.kill(pid, signal.SIGKILL)
    assert window.bridge.worker_pid != pid
    assert "Restarting" in window.banner.headline.text()
