"""Where a pull's files are on disk (models/<owner>/<name>/NAME.gguf, its `.part` while unfinished), and the
small record a pull keeps beside its first `.part` file (`NAME.gguf.pull.json`: the repository, the
revision and every part of the model with its size and sha256), so the next start of the window knows what to
fetch to finish it. Written atomically; read back bounded, and a record that is corrupt, or names a file
outside its own repository's folder, is ignored with one log line."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from app.errors import StorageError
from app.hub.client import repo_id
from app.hub.files import ModelFiles, RemoteFile, is_safe_name
from app.paths import models_dir
from app.storage.atomic import atomic_write_json, read_regular_bytes

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".pull.json"
MAX_RECORD_BYTES = 64 << 10  # a model of a few hundred parts is a few kB
MAX_RECORDS = 16  # pulls interrupted at once, found at a start
MAX_PARTS = 512
MAX_SIZE = 1 << 50
_REVISION = re.compile(r"^[\w.-]{1,100}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PendingPull:
    repo: str
    revision: str
    group: ModelFiles
    done: int  # bytes of the model already on disk, partial files included


def target_folder(repo: str, root: Path | None = None) -> Path:
    """models/<owner>/<name>: quants in sub-folders of the repository land beside the others."""
    owner, name = repo.split("/", 1)
    return (root or models_dir()) / owner / name


def part_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def on_disk(repo: str, group: ModelFiles, root: Path | None = None) -> tuple[bool, int]:
    """Whether every part is in the models folder, and the bytes there (finished parts and .part files)."""
    folder = target_folder(repo, root)
    whole, done = True, 0
    for p in group.parts:
        target = folder / PurePosixPath(p.path).name
        if target.is_file() and target.stat().st_size == p.size:
            done += p.size
            continue
        whole = False
        part = part_path(target)
        if part.is_file():
            done += min(part.stat().st_size, p.size)
    return whole, done


def record_path(first_target: Path) -> Path:
    return first_target.with_name(first_target.name + RECORD_SUFFIX)


def write_record(first_target: Path, repo: str, revision: str, group: ModelFiles) -> None:
    """Kept beside the first part while the pull is unfinished; a record that cannot be written costs only
    the resume at the next start (the pull itself goes on, and `pull` resumes it as before)."""
    doc = {"repo": repo, "revision": revision, "kind": group.kind, "quant": group.quant, "name": group.name,
           "expected_parts": group.expected_parts,
           "parts": [{"path": p.path, "size": p.size, "sha256": p.sha256} for p in group.parts]}
    try:
        atomic_write_json(record_path(first_target), doc)
    except (StorageError, OSError) as exc:
        logger.warning("The download record beside %s was not written (%s)", first_target, exc)


def remove_record(first_target: Path) -> None:
    record_path(first_target).unlink(missing_ok=True)


def _parse(path: Path, root: Path) -> tuple[str, str, ModelFiles]:
    """ValueError with the reason for anything but a record this pull wrote for this very folder."""
    doc = json.loads(read_regular_bytes(path, MAX_RECORD_BYTES).decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    repo, revision, kind, quant, name = (doc.get(k) for k in ("repo", "revision", "kind", "quant", "name"))
    expected, parts = doc.get("expected_parts"), doc.get("parts")
    if not isinstance(repo, str) or repo_id(repo) != repo:
        raise ValueError("no valid repository")
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise ValueError("no valid revision")
    if not isinstance(kind, str) or not isinstance(quant, str) or not isinstance(name, str):
        raise ValueError("no kind, quant or name")
    if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS or not isinstance(expected, int) \
            or isinstance(expected, bool) or expected != len(parts):
        raise ValueError("no valid list of parts")
    if path.parent != target_folder(repo, root):
        raise ValueError("it lies outside its repository's folder")
    files = []
    for p in parts:
        if not isinstance(p, dict):
            raise ValueError("a part is not an object")
        rel, size, sha = p.get("path"), p.get("size"), p.get("sha256")
        if not isinstance(rel, str) or not rel.lower().endswith(".gguf") or not is_safe_name(rel) \
                or ".." in PurePosixPath(rel).parts:
            raise ValueError("a part has no safe .gguf path")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size < MAX_SIZE:
            raise ValueError("a part has no valid size")
        if sha is not None and (not isinstance(sha, str) or not _SHA256.match(sha)):
            raise ValueError("a part has no valid sha256")
        files.append(RemoteFile(rel, size, sha))
    first = PurePosixPath(files[0].path).name
    if path.name != first + RECORD_SUFFIX or len({PurePosixPath(f.path).name for f in files}) != len(files):
        raise ValueError("its name does not match its first part")
    return repo, revision, ModelFiles(kind, quant, name, tuple(files), expected)


def pending_pulls(root: Path | None = None) -> list[PendingPull]:
    """The pulls that were interrupted with a partial file on disk, from the records in the models folder
    (models/<owner>/<name>/*.pull.json). A record whose pull is finished or has nothing on disk is removed."""
    top = root or models_dir()
    found: list[PendingPull] = []
    try:
        records = sorted(top.glob(f"*/*/*{RECORD_SUFFIX}"))
    except OSError:
        return []
    for path in records[:MAX_RECORDS]:
        try:
            repo, revision, group = _parse(path, top)
        except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            logger.warning("Ignored the download record %s: %s", path, exc)
            continue
        whole, done = on_disk(repo, group, top)
        if whole or done == 0:
            path.unlink(missing_ok=True)
            continue
        found.append(PendingPull(repo, revision, group, done))
    return found
