"""The download into the models folder: each file streamed to `NAME.part` beside its target and resumed from
there with a Range request after a fresh URL is resolved, checked against the Hub's sha256, and renamed into
place only when every part of the model has verified. An HTTP error body never reaches a model file."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

from app.hub.client import HubError, Resolved, resolve
from app.hub.files import MODEL, ModelFiles, split_of
from app.hub.pending import part_path, remove_record, target_folder, write_record
from app.paths import ensure
from app.storage.atomic import fsync_folder
from app.units import format_bytes

CHUNK = 1 << 20
RETRIES = 3  # reconnections within one pull after a dropped connection that had made progress
FREE_MARGIN = 64 << 20
TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class PullStopped(HubError):
    """The pull was asked to stop; the partial file is kept for the next one."""


@dataclass(frozen=True)
class Progress:
    file: str
    done: int  # bytes of this model on disk
    total: int
    rate: float  # bytes/s during this pull
    eta: float | None  # seconds left at that rate


@dataclass(frozen=True)
class Pulled:
    paths: tuple[Path, ...]
    already_there: bool
    verified: bool  # every part was checked against a sha256 from the Hub


def _hash_prefix(path: Path, n: int) -> hashlib._Hash:
    h = hashlib.sha256()
    with path.open("rb") as f:
        left = n
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h


class _Meter:
    def __init__(self, total: int, done: int, report: Callable[[Progress], None] | None,
                 stop: Callable[[], bool] | None) -> None:
        self.total = total
        self.done = done
        self.start_done = done
        self.start = time.monotonic()
        self.report = report
        self.stop = stop
        self.file = ""

    def add(self, n: int) -> None:
        if self.stop is not None and n > 0 and self.stop():
            raise PullStopped(f"The pull of {self.file} was stopped at {format_bytes(self.done)} of "
                              f"{format_bytes(self.total)}; the partial file is kept, pull again to continue.")
        self.done += n
        if self.report is None:
            return
        elapsed = time.monotonic() - self.start
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else None
        self.report(Progress(self.file, self.done, self.total, rate, eta))


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed + FREE_MARGIN > free:
        raise HubError(f"Not enough free space in {folder}: {format_bytes(free)} free, {format_bytes(needed)} "
                       "needed (nothing was downloaded).")


def _stream_into(part: Path, resolved: Resolved, size: int, hasher: hashlib._Hash, meter: _Meter,
                 client: httpx.Client) -> hashlib._Hash:
    """Append the bytes after ``part``'s end, hashed on into ``hasher`` (or, when the server restarts at 0 with
    a 200, into a fresh one, which is returned)."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity", **resolved.headers}
    if have:
        # No If-Range: the CDN's own ETag is not the Hub's sha256, so it would restart every resume at 0. The
        # signed URL names the content, and the whole file is checked against the sha256 at the end.
        headers["Range"] = f"bytes={have}-"
    with client.stream("GET", resolved.url, headers=headers) as r:
        name = part.name.removesuffix(".part")
        if r.status_code not in (200, 206):
            raise HubError(f"The Hub's file server answered {r.status_code} for {name}; the partial file is kept, "
                           "pull again to continue.")
        if r.status_code == 206:
            span = r.headers.get("Content-Range", "").removeprefix("bytes ")
            first, _, total = span.partition("/")
            if first.split("-", 1)[0] != str(have) or total not in (str(size), "*"):
                raise HubError(f"The Hub's file server sent {name} from the wrong place ({span!r} for byte "
                               f"{have:,} of {size:,}); the partial file is kept, pull again to continue.")
            mode = "ab"
        else:
            meter.add(-have)
            hasher = hashlib.sha256()
            mode = "wb"
        with part.open(mode) as f:
            for chunk in r.iter_bytes():  # as they arrive: nothing held back from the file
                if f.tell() + len(chunk) > size:
                    raise HubError(f"The Hub's file server sent more than the {size:,} bytes of {name}; the "
                                   "partial file is kept, pull again to continue.")
                meter.add(len(chunk))  # raises PullStopped before the chunk is written, when asked to
                f.write(chunk)
                f.flush()
                hasher.update(chunk)
            os.fsync(f.fileno())
    return hasher


def _fetch_part(repo: str, path: str, size: int, sha256: str | None, target: Path, meter: _Meter,
                client: httpx.Client, revision: str) -> bool:
    """Bring ``target``'s .part to full size and verify it; True when a sha256 was checked."""
    part = part_path(target)
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        meter.add(-size)
        have = 0
    hasher = _hash_prefix(part, have) if have else hashlib.sha256()
    meter.file = target.name
    attempts = 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        if have == size:
            break
        resolved = resolve(repo, path, revision)  # a signed URL expires: a fresh one for every attempt
        expected = sha256 or resolved.sha256
        if resolved.size is not None and resolved.size != size:
            raise HubError(f"{target.name} changed on the Hub during the pull ({resolved.size:,} bytes, not "
                           f"{size:,}); pull again.")
        try:
            hasher = _stream_into(part, resolved, size, hasher, meter, client)
        except httpx.TransportError as exc:
            now = part.stat().st_size if part.exists() else 0
            attempts += 1
            if now <= have or attempts > RETRIES:
                raise HubError(f"The connection to the Hub was lost during {target.name} "
                               f"({exc.__class__.__name__}) at {format_bytes(now)} of {format_bytes(size)}: "
                               "the partial file is kept, pull again to continue.") from None
            hasher = _hash_prefix(part, now)
        sha256 = expected
    digest = hasher.hexdigest()
    if sha256 is not None and digest != sha256:
        part.unlink()
        raise HubError(f"{target.name} did not verify (sha256 {digest[:12]}…, the Hub says {sha256[:12]}…), so "
                       "the partial file was deleted; pull again to download it afresh.")
    return sha256 is not None


def pull(repo: str, group: ModelFiles, *, revision: str = "main", root: Path | None = None,
         progress: Callable[[Progress], None] | None = None, stop: Callable[[], bool] | None = None) -> Pulled:
    """Download every part of ``group`` into the models folder, resuming any partial file. ``progress`` is
    called after every chunk received; ``stop`` is asked before each one is written (True: PullStopped, with
    the partial file kept)."""
    folder = ensure(target_folder(repo, root))
    targets = [folder / PurePosixPath(p.path).name for p in group.parts]
    if all(t.is_file() and t.stat().st_size == p.size for t, p in zip(targets, group.parts, strict=True)):
        return Pulled(tuple(targets), True, False)
    on_disk = [part_path(t).stat().st_size if part_path(t).is_file() else 0 for t in targets]
    done = sum(min(n, p.size) for n, p in zip(on_disk, group.parts, strict=True))
    _check_space(folder, group.size - done)
    meter = _Meter(group.size, done, progress, stop)
    verified = True
    write_record(targets[0], repo, revision, group)  # what the next start of the window resumes, if this stops
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True) as client:
        for target, remote in zip(targets, group.parts, strict=True):
            if target.is_file() and target.stat().st_size == remote.size:
                continue
            try:
                verified &= _fetch_part(repo, remote.path, remote.size, remote.sha256, target, meter, client,
                                        revision)
            except HubError:
                if not any(part_path(t).exists() for t in targets):
                    remove_record(targets[0])  # nothing left to resume (a bad checksum deleted it)
                raise
    for target in targets:  # only a whole, verified set is put where discovery sees it
        part = part_path(target)
        if part.exists():
            os.replace(part, target)
    remove_record(targets[0])
    fsync_folder(folder)
    return Pulled(tuple(targets), False, verified)


def choose(groups: Sequence[ModelFiles], *, file: str | None = None, quant: str | None = None,
           repo: str = "") -> ModelFiles:
    """The artefact a pull asked for: by file name (any part of a split model picks all of it) or by quant."""
    if file is not None:
        wanted = file.strip("/")
        for g in groups:
            for p in g.parts:
                if wanted in (p.path, PurePosixPath(p.path).name):
                    if g.kind != MODEL:
                        return g  # a projector or head asked for by name is fetched as it is
                    if not g.complete:
                        raise HubError(f"{wanted} is part of a split model whose parts are not all in {repo} "
                                       f"({len(g.parts)} of {g.expected_parts}).")
                    return g
        hint = " (a split part? name any part)" if split_of(wanted) else ""
        raise HubError(f"{repo} has no GGUF file {wanted}{hint}: `specdeck search {repo}` lists them.")
    models = [g for g in groups if g.kind == MODEL and g.complete]
    if not models:
        raise HubError(f"{repo} has no GGUF model to pull (only {', '.join(sorted({g.kind for g in groups}))})."
                       if groups else f"{repo} has no GGUF files.")
    if quant is not None:
        matches = [g for g in models if g.quant == quant.upper()]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            have = ", ".join(sorted({g.quant or "?" for g in models}))
            raise HubError(f"{repo} has no {quant.upper()} model; its quants: {have}.")
        raise HubError(f"{repo} has {len(matches)} {quant.upper()} models: pass --file with one of "
                       f"{', '.join(g.name for g in matches)}.")
    if len(models) == 1:
        return models[0]
    have = ", ".join(sorted({g.quant or g.name for g in models}))
    raise HubError(f"{repo} has {len(models)} models: pass --quant (one of {have}) or --file NAME.")
