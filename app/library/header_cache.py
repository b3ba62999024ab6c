"""The header cache: GGUF header descriptions keyed by path, kept in a JSON file in the cache folder and
valid while the file's (and its shards') size and mtime are unchanged, so a library scan reads only the
headers of files that changed."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from app.library.gguf_reader import GGUFInfo, shard_siblings
from app.paths import cache_dir
from app.storage.atomic import atomic_write_bytes, read_regular_bytes

CACHE_FILE = "gguf-headers.json"
CACHE_VERSION = 3  # 2: Nemotron-H's MLP-only layers are not recurrent; 3: MLA (no V cache) is read
MAX_CACHE_BYTES = 256 << 20


def stat_sig(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _info_to_json(info: GGUFInfo) -> dict[str, Any]:
    return asdict(info)


def _info_from_json(data: Mapping[str, Any]) -> GGUFInfo:
    names = {f.name for f in fields(GGUFInfo)}
    if set(data) != names:
        raise ValueError("cache entry from another version")
    values = dict(data)
    values["swa_layers"] = tuple(bool(v) for v in values["swa_layers"])
    values["kv_layers"] = tuple(bool(v) for v in values["kv_layers"])
    values["missing_shards"] = tuple(str(v) for v in values["missing_shards"])
    return GGUFInfo(**values)


class HeaderCache:
    """GGUF header descriptions keyed by path, valid while the file's (and its shards') size and mtime
    are unchanged. Saved as JSON: temp file + fsync + os.replace, so a crash never leaves half a file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else cache_dir() / CACHE_FILE
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        self._load()

    def _load(self) -> None:
        try:
            doc = json.loads(read_regular_bytes(self.path, MAX_CACHE_BYTES))
        except (OSError, ValueError, RecursionError):  # a FIFO, a huge file, JSON nested thousands deep
            return
        if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION:
            return
        if isinstance(doc.get("entries"), dict):
            self.entries = {k: v for k, v in doc["entries"].items() if isinstance(v, dict)}

    def _deps(self, path: Path, info: GGUFInfo | None) -> dict[str, list[int] | None]:
        if info is None or info.split_count <= 1 or info.split_index != 0:
            return {}
        siblings = shard_siblings(path, info.split_count) or []
        return {str(s): stat_sig(s) for s in siblings[1:]}

    def get(self, path: Path, sig: list[int]) -> tuple[GGUFInfo | None, str | None, str | None] | None:
        entry = self.entries.get(str(path))
        if entry is None or entry.get("sig") != sig:
            return None
        deps = entry.get("deps") or {}
        if not isinstance(deps, dict) or any(stat_sig(Path(p)) != s for p, s in deps.items()):
            return None
        try:
            info = _info_from_json(entry["info"]) if entry.get("info") is not None else None
            error = entry.get("error")
            if info is None and error is None:
                return None
            if error is None:
                return info, None, None
            return info, str(error), str(entry.get("error_type") or "GGUFError")
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, path: Path, sig: list[int], info: GGUFInfo | None, error: str | None,
            error_type: str | None) -> None:
        entry: dict[str, Any] = {"sig": sig, "deps": self._deps(path, info)}
        if info is not None:
            entry["info"] = _info_to_json(info)
        if error is not None:  # a split model with shards missing has both
            entry["error"] = error
            entry["error_type"] = error_type
        self.entries[str(path)] = entry
        self.dirty = True

    def prune(self, keep: set[str]) -> None:
        """Forget entries for files that no longer exist (entries from other folders stay)."""
        for key in [k for k in self.entries if k not in keep and not os.path.exists(k)]:
            del self.entries[key]
            self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        data = json.dumps({"version": CACHE_VERSION, "entries": self.entries}, separators=(",", ":"))
        atomic_write_bytes(self.path, data.encode("utf-8"))  # temp file + fsync + os.replace
        self.dirty = False
