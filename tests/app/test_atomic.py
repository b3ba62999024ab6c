"""Atomic writes: the old file survives every failure, no temp file is left behind, errors are sentences."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.errors import StorageError
from app.storage.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text


def _try_mount_tmpfs(folder: Path, size: str) -> bool:
    """A real small file system (root + mount allowed, as on CI); False where that is not possible."""
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, check=False)
    return done.returncode == 0


def _umount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """(folder, is_real_tmpfs): a 512 KiB tmpfs when possible, else a plain folder."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = _try_mount_tmpfs(folder, "512k")
    try:
        yield folder, mounted
    finally:
        if mounted:
            _umount(folder)


def _leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_writes_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "file.bin"
    atomic_write_bytes(target, b"first")
    assert target.read_bytes() == b"first"
    atomic_write_bytes(target, b"second, longer")
    assert target.read_bytes() == b"second, longer"
    atomic_write_bytes(target, b"")
    assert target.read_bytes() == b""
    assert _leftovers(target.parent, {"file.bin"}) == []


def test_text_and_json_round_trip(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "t.txt", "héllo ✓\n")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo ✓\n"
    obj = {"a": [1, 2.5, None, True], "s": "ünï😀", "lone": "x\udc80y"}
    atomic_write_json(tmp_path / "o.json", obj)
    raw = (tmp_path / "o.json").read_bytes()
    raw.decode("utf-8")  # valid UTF-8 even with a lone surrogate inside
    assert json.loads(raw) == obj  # the lone surrogate came back as it was, through a JSON escape
    atomic_write_json(tmp_path / "pair.json", {"p": "\ud83d\ude00"})  # a pair split in two code points
    assert json.loads((tmp_path / "pair.json").read_bytes()) == {"p": "😀"}


def test_json_refuses_nan_and_keeps_old(tmp_path: Path) -> None:
    target = tmp_path / "o.json"
    atomic_write_json(target, {"ok": 1})
    with pytest.raises(ValueError, match="Out of range float"):
        atomic_write_json(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert _leftovers(tmp_path, {"o.json"}) == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_keeps_permissions_of_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x")
    target.chmod(0o640)
    atomic_write_bytes(target, b"y")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_fsyncs_file_and_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write_bytes(tmp_path / "f", b"data")
    assert synced[0] is False  # the file's bytes before the rename
    if os.name == "posix":
        assert synced[-1] is True  # then the folder, so the rename survives a power cut


def test_disk_full(small_disk: tuple[Path, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, real = small_disk
    target = folder / "settings.json"
    atomic_write_bytes(target, b"old content")
    big = os.urandom(1024 * 1024)  # twice the 512 KiB file system
    if not real:
        # No mount here: fail the way a full disk does, after part of the data went out.
        real_write = os.write

        def write(fd: int, data: bytes | memoryview) -> int:
            if len(data) > 4096:
                real_write(fd, bytes(data[:4096]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)
    with pytest.raises(StorageError) as info:
        atomic_write_bytes(target, big)
    message = str(info.value)
    assert message.startswith("Could not save settings.json: the disk is full (errno 28).")
    assert "Free some space" in message
    assert "nothing already saved was changed" in message
    assert target.read_bytes() == b"old content"
    assert _leftovers(folder, {"settings.json"}) == []
    monkeypatch.undo()
    atomic_write_bytes(target, b"small again")  # the space the temp file held was given back
    assert target.read_bytes() == b"small again"


def test_read_only_disk(small_disk: tuple[Path, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, real = small_disk
    target = folder / "settings.json"
    atomic_write_bytes(target, b"old")
    if real:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    else:
        def refuse(*args: object, **kwargs: object) -> int:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(StorageError, match=r"the disk is read-only \(errno 30\)"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"


def test_permission_denied_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root ignores folder permissions, so the refusal is injected where the temp file is created.
    target = tmp_path / "settings.json"
    target.write_bytes(b"old")

    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(StorageError) as info:
        atomic_write_bytes(target, b"new")
    assert "permission was denied (errno 13)" in str(info.value)
    assert str(tmp_path) in str(info.value)
    assert target.read_bytes() == b"old"


def test_failure_at_rename_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def replace(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StorageError, match="input/output error"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path, {"f"}) == []


def test_interrupt_mid_write_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def fsync(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path, {"f"}) == []


def test_check_destination_before_a_long_run(tmp_path: Path) -> None:
    from app.storage.atomic import check_destination

    check_destination(tmp_path / "report.json", "the report")  # a new file in a folder that exists: fine
    with pytest.raises(StorageError, match=r"the folder .*missing does not exist\."):
        check_destination(tmp_path / "missing" / "report.json", "the report")
    with pytest.raises(StorageError, match="it is a folder"):
        check_destination(tmp_path, "the report")
