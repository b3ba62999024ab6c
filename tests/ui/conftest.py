"""Fixtures for the window tests: a MainWindow on an isolated SPECDECK_HOME, and a helper to load models."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pytestqt.qtbot import QtBot

from app.params import DraftSettings, LoadSettings
from app.serve.metrics import ServeMetrics
from app.serve.runner import EngineRunner
from app.serve.server import ServeOptions, Server
from ui.main_window import MainWindow
from ui.notifier import Notifier

LOAD_TIMEOUT_MS = 60_000
# The offscreen platform's screen is 800×800 by default, smaller than any real one: window sizes would be
# clamped to it. One 1920×1200 screen instead (set before pytest-qt creates the QApplication).
if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
    _screen = Path(tempfile.gettempdir()) / "specdeck-test-screen.json"
    _screen.write_text(json.dumps({"screens": [{"name": "test", "x": 0, "y": 0, "width": 1920,
                                                "height": 1200, "logicalDpi": 96}]}))
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={_screen}"


THREAD_GRACE_S = 5.0


@pytest.fixture(autouse=True)
def no_thread_left_running() -> Iterator[None]:
    """Fail a test that leaves a Python thread running (a reader, a probe) after its windows closed."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREAD_GRACE_S
    while True:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()
                and not isinstance(t, threading._DummyThread)]  # Qt's pool threads: waited for by TaskRunner
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"threads left running: {[t.name for t in left]}"


@pytest.fixture
def make_window(qtbot: QtBot, specdeck_home: Path) -> Iterator[object]:
    """`make(start_engine=True) -> MainWindow`, its library scanned; closed (engine shut down) afterwards."""
    windows: list[MainWindow] = []

    def make(*, start_engine: bool = True, folders: tuple[Path, ...] = ()) -> MainWindow:
        notifier = Notifier(modal=False)
        window = MainWindow(notifier=notifier, start_engine=start_engine)
        qtbot.addWidget(window)
        windows.append(window)
        qtbot.waitUntil(lambda: not window.picker.scanning, timeout=30_000)
        for folder in folders:
            with qtbot.waitSignal(window.picker.library_changed, timeout=30_000):
                window.picker.add_folder(str(folder))
        return window

    yield make
    for window in windows:
        window.close()
        window.notifier.uninstall_hooks()


@pytest.fixture
def no_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose every model folder is empty (SpecDeck's, LM Studio's, the Hub cache, Ollama's): the empty
    SpecDeck models folder."""
    empty = tmp_path / "no-models"
    empty.mkdir()
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    return empty


def choose_pair(qtbot: QtBot, window: MainWindow, target: Path, drafter: Path | None = None,
                ngram: int = 0) -> None:
    picker = window.picker
    with qtbot.waitSignal(picker.drafters_ranked, timeout=30_000):
        assert picker.select_target(target) or picker.target_path() == str(target)
        if picker.target_path() == str(target) and picker._report_for == str(target):
            picker.drafters_ranked.emit()  # already ranked for this target
    assert picker.select_drafter(drafter)  # None: no drafter model (a fresh home would choose one)
    picker.ngram_check.setChecked(ngram > 0)
    if ngram:
        picker.ngram_spin.setValue(ngram)
    picker.load_box.threads_spin.setValue(1)  # llama.cpp threads spin; this machine has two shared cores
    picker.load_box.ctx_spin.setValue(1024)


def load_pair(qtbot: QtBot, window: MainWindow, target: Path, drafter: Path | None = None,
              ngram: int = 0) -> None:
    choose_pair(qtbot, window, target, drafter, ngram)
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS):
        assert window.picker.request_load(), window.picker.load_box.status_label.text()


def set_sampling(window: MainWindow, **values: object) -> None:
    """Set sampling values in the form's fields, as a user would."""
    for name, value in values.items():
        window.sampling_form.set_value(name, value)  # type: ignore[arg-type]


@pytest.fixture
def served(tiny_target: Path, tmp_path: Path) -> Iterator[Server]:
    """`specdeck serve` on 127.0.0.1 (a real HTTP server and its own engine) with the tiny target, its history
    in tmp_path/served.sqlite3; stopped afterwards."""
    settings = LoadSettings(target_path=str(tiny_target), n_ctx=512, n_threads=1,
                            draft=DraftSettings(ngram=2, adaptive=False, k=3))
    metrics = ServeMetrics()
    server = Server(EngineRunner(settings, metrics, history_path=tmp_path / "served.sqlite3"), metrics,
                    ServeOptions(port=0))
    server.start_in_thread()
    deadline = time.monotonic() + 120
    while httpx.get(server.base_url + "/health").status_code != 200:
        assert time.monotonic() < deadline, "the served model did not load"
        time.sleep(0.1)
    yield server
    server.stop()
