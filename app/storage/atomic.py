"""Atomic file writes: a reader (or a crash, or a power cut) sees the old file or the new one, never half.

The new bytes go to a temp file in the same folder (so ``os.replace`` stays a rename on one file system),
are flushed and fsynced, renamed over the target, and then the folder itself is fsynced so the rename
survives a power cut. Any ``OSError`` before the rename removes the temp file and raises
:class:`app.errors.StorageError` with a sentence for the user; the old file is untouched.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from app.errors import StorageError

StrPath = str | os.PathLike[str]

# errno -> (what happened, what the user can do about it)
_REASONS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", "Free some space and try again"),
    errno.EACCES: ("permission was denied", "Check that you may write to {folder}"),
    errno.EPERM: ("the operation was not permitted", "Check that you may write to {folder}"),
    errno.EROFS: ("the disk is read-only", "Save to a writable disk or remount it read-write"),
    errno.EIO: ("the disk reported an input/output error", "Check the disk for errors"),
    errno.ENAMETOOLONG: ("the path is too long", "Use a shorter folder path"),
    errno.ENOENT: ("its folder does not exist", "Check that {folder} exists"),
}
if hasattr(errno, "EDQUOT"):
    _REASONS[errno.EDQUOT] = ("the disk quota is exceeded", "Free some space and try again")


def describe_os_error(exc: OSError, what: str, folder: StrPath, *, kept: str) -> str:
    """One sentence for a failed save: what failed, why (with errno), what to do, and what was kept."""
    unknown = (exc.strerror or str(exc) or "an unknown error", "Try again")
    reason, advice = _REASONS.get(exc.errno or -1, unknown)
    code = f" (errno {exc.errno})" if exc.errno else ""
    advice = advice.format(folder=os.fspath(folder))
    return f"Could not save {what}: {reason}{code}. {advice}; {kept}."


def storage_error(exc: OSError, path: StrPath) -> StorageError:
    p = Path(path)
    return StorageError(
        describe_os_error(exc, p.name, p.parent, kept="nothing already saved was changed")
    )


def fsync_folder(folder: Path) -> None:
    # Makes the rename durable. Windows cannot open a folder, and some file systems refuse to fsync
    # one; the new file is already in place then, so this is best effort, never an error.
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write_bytes(path: StrPath, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (creating its folder). Raises StorageError."""
    target = Path(path)
    folder = target.parent
    tmp: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            mode: int | None = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = None
        # A name no other writer uses; the leading dot keeps it out of casual listings.
        tmp = folder / f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
            if mode is not None:
                os.chmod(tmp, mode)  # keep the permissions the user gave the old file
        finally:
            os.close(fd)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise storage_error(exc, target) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    fsync_folder(folder)


def atomic_write_text(path: StrPath, text: str) -> None:
    """UTF-8; a lone surrogate (which UTF-8 cannot hold) is written as '?' rather than failing the save."""
    atomic_write_bytes(path, text.encode("utf-8", errors="replace"))


def atomic_write_json(path: StrPath, obj: Any) -> None:
    """Pretty JSON. NaN/infinity are refused (ValueError) since other JSON readers reject them.

    Lone surrogates are written as ``\\udXXX`` escapes, which is valid JSON and reads back unchanged.
    """
    text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))


MAX_RECORD_BYTES = 64 << 20  # far beyond any file SpecDeck writes; a 1 GB file put in its place is not read


class NotAFile(OSError):
    """The path is a FIFO, a device, a folder or far too large: nothing is read from it."""


def irregular(path: StrPath, max_bytes: int = MAX_RECORD_BYTES) -> str | None:
    """Why ``path`` cannot be read as a file SpecDeck keeps, or None (also None when it does not exist)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file (a pipe, a device or a folder)"
    if info.st_size > max_bytes:
        return f"it is {info.st_size / 1e6:.0f} MB, far larger than SpecDeck writes it"
    return None


def read_regular_bytes(path: StrPath, max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; NotAFile for anything else.

    Opened with O_NONBLOCK and checked on the open descriptor: a FIFO put in the file's place neither blocks
    the open (no writer) nor the read, and a symlink to /dev/zero is never read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(f"{path} is not a regular file (a pipe, a device or a folder)")
        if info.st_size > max_bytes:
            raise NotAFile(f"{path} is {info.st_size} bytes, larger than {max_bytes}")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > max_bytes:
                raise NotAFile(f"{path} is larger than {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json_object(path: StrPath) -> dict[str, Any]:
    """The JSON object a file written by ``atomic_write_json`` holds; {} when the file is missing,
    unreadable, not JSON or not an object (a lost record is measured or chosen again, never an error). Only a
    regular file is read: reading a FIFO put in its place would wait for a writer for ever."""
    try:
        raw = json.loads(read_regular_bytes(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return {}
    return raw if isinstance(raw, dict) else {}


def check_destination(path: StrPath, what: str) -> None:
    """Refuse, before a long run, a file that could not be written at its end: StorageError says why."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise StorageError(f"Cannot write {what} to {target}: it is a folder; name a file inside it.")
    if not folder.is_dir():
        raise StorageError(f"Cannot write {what} to {target}: the folder {folder} does not exist.")
    if not os.access(folder, os.W_OK):
        raise StorageError(f"Cannot write {what} to {target}: you may not write to {folder}.")
    if target.exists() and not os.access(target, os.W_OK):
        raise StorageError(f"Cannot write {what} to {target}: the file is read-only.")
