"""The files SpecDeck keeps, each replaced by something hostile (issue 28 §4): a FIFO, a folder, a link to
/dev/zero, a 1 GB file, invalid UTF-8, JSON nested 100,000 deep. Each reader gives the defaults (and one sentence
where the user is told), never a hang, a traceback or an exception; each writer on a data folder that cannot be
written raises the app's own error, in one sentence."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app import logs
from app.errors import AppError, StorageError
from app.library.header_cache import HeaderCache
from app.storage import pair_stats, tuned, verify_cost
from app.storage.atomic import read_json_object
from app.storage.history import HistoryStore
from app.storage.settings import AppSettings, load_settings, save_settings

KINDS = ("fifo", "folder", "dev_zero", "huge", "bad_utf8", "nested")
HANG_SECONDS = 60  # far beyond any of these reads; a FIFO read would wait for ever


def make_hostile(path: Path, kind: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        with path.open("wb") as fh:  # sparse: 1 GB on paper, nothing on disk
            fh.truncate(1 << 30)
    elif kind == "bad_utf8":
        path.write_bytes(b'{"a": "\xff\xfe\xfa"}')
    elif kind == "nested":
        path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    return path


def finishes(call: Callable[[], Any]) -> Any:
    """``call()`` on a thread; fails the test if it is still running after HANG_SECONDS."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_SECONDS)
    assert not thread.is_alive(), "it hung"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def one_sentence(text: str | None) -> None:
    assert text
    assert "Traceback" not in text
    assert "\n" not in text


@pytest.mark.parametrize("kind", KINDS)
def test_settings(tmp_path: Path, kind: str) -> None:
    path = make_hostile(tmp_path / "settings.json", kind)
    settings, warning = finishes(lambda: load_settings(path))
    assert settings == AppSettings()
    one_sentence(warning)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["acceptance.json", "tuned.json", "verify_cost.json", "unsaved.json"])
def test_json_records(tmp_path: Path, kind: str, name: str) -> None:
    path = make_hostile(tmp_path / name, kind)
    assert finishes(lambda: read_json_object(path)) == {}
    if name == "acceptance.json":
        assert finishes(lambda: pair_stats.load_measured(path)) == {}
    elif name == "tuned.json":
        assert finishes(lambda: tuned.load_tuned("t.gguf", None, path)) is None
    elif name == "verify_cost.json":
        assert finishes(lambda: verify_cost.load_curves(path)) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_header_cache(tmp_path: Path, kind: str) -> None:
    path = make_hostile(tmp_path / "gguf-headers.json", kind)
    cache = finishes(lambda: HeaderCache(path))
    assert cache.entries == {}


@pytest.mark.parametrize("kind", ["fifo", "folder", "dev_zero", "bad_utf8", "nested"])
def test_history_database(tmp_path: Path, kind: str) -> None:
    path = make_hostile(tmp_path / "history.sqlite3", kind)

    def open_store() -> str | None:
        try:
            with HistoryStore(path) as store:  # a damaged file is moved aside and a new history started
                chat = store.new_chat("still works")
                store.add_message(chat, "user", "hello")
                return store.warning
        except StorageError as exc:
            return str(exc)

    message = finishes(open_store)
    if kind in ("fifo", "folder", "dev_zero"):
        one_sentence(message)
        assert "not a regular file" in message


@pytest.mark.parametrize("kind", ["fifo", "folder", "dev_zero"])
def test_log_file(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path / "home"))
    make_hostile(logs.log_file(), kind)
    monkeypatch.setattr(logs, "_handler", None)
    monkeypatch.setattr(logs, "_handler_path", None)
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        assert finishes(logs.setup_logging) is None  # the app runs on without a log file
        finishes(lambda: logging.getLogger("specdeck.test").warning("a line that must not block"))
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)


def test_the_engine_log_folder_that_cannot_be_created_falls_back(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    path = logs.engine_log_path_or_fallback(blocked / "engine")
    assert path.exists()
    with open(path, "a") as fh:
        fh.write("llama.cpp line\n")


def test_writers_on_a_data_folder_that_cannot_be_written(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.write_text("a file where the folder should be")
    with pytest.raises(AppError) as caught:
        save_settings(AppSettings(), folder / "settings.json")
    one_sentence(str(caught.value))
    with pytest.raises(StorageError) as caught_history:
        HistoryStore(folder / "history.sqlite3")
    assert str(caught_history.value)
    assert verify_cost.record("t.gguf", {"1": 10.0, "2": 12.0}, "cpu", folder / "verify_cost.json") is False
