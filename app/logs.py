"""Where SpecDeck logs go: the standard `logging` module, one rotating file per process kind, in the
platform's log folder (platformdirs' user_log_dir; SPECDECK_HOME/logs when set).

``setup_logging`` is called once by each entry point (the window, the CLI, the engine worker); modules only
call ``logging.getLogger(__name__)``. The engine worker's llama.cpp output goes to its own file, named by
``new_engine_log_path``: the last few are kept, so the log of a worker that crashed is still there to read.
"""

from __future__ import annotations

import itertools
import logging
import logging.handlers
import os
import tempfile
import threading
import time
from pathlib import Path

from app.paths import logs_dir

LOG_FILE_BYTES = 1 << 20  # a rotated file holds about a day of heavy use
LOG_BACKUPS = 3
KEEP_ENGINE_LOGS = 5
ENGINE_LOG_PREFIX = "engine-"
LOG_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"

_lock = threading.Lock()
_handler: logging.Handler | None = None
_handler_path: Path | None = None
_engine_log_serial = itertools.count()


def log_file(name: str = "specdeck") -> Path:
    """The rotating log file of one process kind ("specdeck": the window and the CLI)."""
    return logs_dir() / f"{name}.log"


def setup_logging(level: int = logging.INFO, *, name: str = "specdeck") -> Path | None:
    """Send this process's log records to a rotating file, once; later calls only change the level.

    Returns the file, or None when the log folder cannot be written (the app runs on without a log)."""
    global _handler, _handler_path
    root = logging.getLogger()
    with _lock:
        root.setLevel(level)
        # httpx logs every request at INFO: the Remote engine dock's once-a-second reading filled the log.
        logging.getLogger("httpx").setLevel(max(level, logging.WARNING))
        if _handler is not None:
            return _handler_path
        path = log_file(name)
        if path.exists() and not path.is_file():
            return None  # a FIFO in its place would block the first log line for ever; a device is no log
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8", delay=True)
        except OSError:
            return None
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        _handler, _handler_path = handler, path
        return path


def engine_logs_dir() -> Path:
    return logs_dir() / "engine"


def new_engine_log_path(folder: Path | None = None, keep: int = KEEP_ENGINE_LOGS) -> Path:
    """A fresh, empty file for one engine worker's log (llama.cpp's lines, its stderr), in ``folder``
    (default ``engine_logs_dir()``). Older engine logs there beyond the newest ``keep - 1`` are deleted
    first, so with the new one at most ``keep`` remain: a crashed worker's log survives the next few starts."""
    folder = folder if folder is not None else engine_logs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    prune_engine_logs(max(keep - 1, 0), folder)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(1000):
        path = folder / f"{ENGINE_LOG_PREFIX}{stamp}-{os.getpid()}-{next(_engine_log_serial):06d}.log"
        try:
            path.touch(exist_ok=False)
        except FileExistsError:
            continue
        return path
    raise OSError(f"could not create an engine log file in {folder}")


def engine_log_path_or_fallback(folder: Path | None = None) -> Path:
    """``new_engine_log_path``, or where the log folder cannot be written (a read-only or full home) a file in
    the system's temporary folder, or at the last ``os.devnull``: the engine runs without its log file rather
    than not at all (a read-only home made every model load fail)."""
    try:
        return new_engine_log_path(folder)
    except OSError:
        pass
    try:
        fd, name = tempfile.mkstemp(prefix=ENGINE_LOG_PREFIX, suffix=".log")
    except OSError:
        return Path(os.devnull)
    os.close(fd)
    return Path(name)


def engine_logs(folder: Path | None = None) -> list[Path]:
    """The kept engine logs, newest first."""
    folder = folder if folder is not None else engine_logs_dir()
    try:
        found = [p for p in folder.glob(f"{ENGINE_LOG_PREFIX}*.log") if p.is_file()]
    except OSError:
        return []
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)


def prune_engine_logs(keep: int, folder: Path | None = None) -> None:
    """Delete all but the newest ``keep`` engine logs (a file another process still writes to is only
    unlinked; its writer keeps it open)."""
    for old in engine_logs(folder)[keep:]:
        try:
            old.unlink()
        except OSError:
            continue
