"""The model library: GGUF files found on this machine, described from their headers, and which drafter
fits which target.

Looks in SpecDeck's models folder, LM Studio's folders, the Hugging Face hub cache (snapshot links followed
to their blobs), Ollama's store (its manifests name the blobs) and folders the user adds. Headers are read
with the bounded reader and cached by path + size + mtime in a JSON file written atomically. A file that
cannot be read is listed with its reason, never dropped silently. (Just over 450 lines: the four stores'
layouts and the pairing of what was found belong together.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.errors import StorageError
from app.library.compat import CHECK_TOKEN_TEXT, CompatResult, VocabInfo, check_compatible
from app.library.gguf_format import GGUFError, MissingShardError
from app.library.gguf_reader import GGUFInfo, read_gguf_info, read_token_texts
from app.library.header_cache import HeaderCache, stat_sig
from app.library.heads import DRAFTER_HEADS, HeadOffer, heads_for
from app.library.model_file import ensure_complete
from app.paths import models_dir
from app.storage.atomic import read_regular_bytes

SPECDECK = "specdeck"
LMSTUDIO = "lmstudio"
HUGGINGFACE = "huggingface"
OLLAMA = "ollama"
FOLDER = "folder"
SOURCES = (SPECDECK, LMSTUDIO, HUGGINGFACE, OLLAMA, FOLDER)

MAX_FILES = 20_000  # per discovery, all roots together
MAX_DEPTH = 8
MAX_MANIFEST_BYTES = 1 << 20
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")  # fullmatch only
_OLLAMA_KINDS = {
    "application/vnd.ollama.image.model": "model",
    "application/vnd.ollama.image.projector": "mmproj",
    "application/vnd.ollama.image.adapter": "lora",
}


@dataclass(frozen=True)
class LibraryEntry:
    path: str  # as the user knows it: the HF snapshot link, the Ollama blob, the file in a folder
    source: str  # one of SOURCES
    label: str  # "org/repo/file.gguf" (HF), "llama3.2:1b" (Ollama), else the path under its folder
    real_path: str  # the file read (symlinks resolved)
    size: int
    info: GGUFInfo | None
    error: str | None = None  # one sentence: why it cannot be used (unreadable, broken, shards missing)
    error_type: str | None = None  # the GGUFError subclass name

    @property
    def usable(self) -> bool:
        return self.info is not None and self.error is None

    @property
    def is_model(self) -> bool:
        """A model to chat with (drafter heads such as EAGLE-3 only draft for one)."""
        return (self.usable and self.info is not None and self.info.kind == "model"
                and self.info.architecture not in DRAFTER_HEADS)


@dataclass(frozen=True)
class Root:
    path: Path
    source: str
    layout: str  # "tree" (any folder of .gguf files), "hf" (hub cache) or "ollama" (models store)


@dataclass(frozen=True)
class _Found:
    path: Path
    source: str
    label: str
    missing: str | None = None  # a reason when the file a manifest or link names is not there


# --- where to look ------------------------------------------------------------------------------


def default_roots(
    home: Path | None = None,
    env: Mapping[str, str] | None = None,
    specdeck_dir: Path | None = None,
) -> list[Root]:
    """The folders SpecDeck looks in, for Linux, macOS and Windows (all three apps keep their stores
    under the home folder on every platform). A given `home` stands for another user: the environment's
    overrides are then ignored unless `env` is passed too."""
    system_home = home is None
    home = Path.home() if home is None else Path(home)
    env = (os.environ if system_home else {}) if env is None else env
    roots = [Root(specdeck_dir if specdeck_dir is not None else models_dir(), SPECDECK, "tree")]

    lm = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    pointer = home / ".lmstudio-home-pointer"  # newer LM Studio: a file naming its home folder
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if pointer.is_file() and pointer.stat().st_size < 4096:
            target = pointer.read_text(encoding="utf-8").strip()
            if target:
                lm.insert(0, Path(target) / "models")
    roots += [Root(p, LMSTUDIO, "tree") for p in lm]

    if env.get("HF_HUB_CACHE"):
        hub = Path(env["HF_HUB_CACHE"])
    elif env.get("HUGGINGFACE_HUB_CACHE"):
        hub = Path(env["HUGGINGFACE_HUB_CACHE"])
    elif env.get("HF_HOME"):
        hub = Path(env["HF_HOME"]) / "hub"
    elif env.get("XDG_CACHE_HOME"):
        hub = Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    else:
        hub = home / ".cache" / "huggingface" / "hub"
    roots.append(Root(hub, HUGGINGFACE, "hf"))

    if env.get("OLLAMA_MODELS"):
        roots.append(Root(Path(env["OLLAMA_MODELS"]), OLLAMA, "ollama"))
    roots.append(Root(home / ".ollama" / "models", OLLAMA, "ollama"))
    if system_home and sys.platform.startswith("linux"):
        roots.append(Root(Path("/usr/share/ollama/.ollama/models"), OLLAMA, "ollama"))  # the Linux service
    return roots


# --- walking ------------------------------------------------------------------------------------


class _Budget:
    def __init__(self, n: int) -> None:
        self.left = n


def _walk_gguf(top: Path, budget: _Budget, max_depth: int = MAX_DEPTH) -> Iterator[Path]:
    """*.gguf files under top, links followed, loops and hidden folders skipped, depth and count capped."""
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Path, int]] = [(top, 0)]
    while stack and budget.left > 0:
        folder, depth = stack.pop()
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for item in items:
            if item.name.startswith("."):
                continue
            try:
                is_dir = item.is_dir()
            except OSError:
                continue
            if is_dir:
                if depth < max_depth:
                    subdirs.append((Path(item.path), depth + 1))
            elif item.name.lower().endswith(".gguf"):
                if budget.left <= 0:
                    return
                budget.left -= 1
                yield Path(item.path)
        stack.extend(reversed(subdirs))


def _find_tree(root: Root, budget: _Budget) -> Iterator[_Found]:
    if root.path.is_file() and root.path.name.lower().endswith(".gguf"):
        budget.left -= 1
        yield _Found(root.path, root.source, root.path.name)
        return
    for path in _walk_gguf(root.path, budget):
        yield _Found(path, root.source, _relative_label(path, root.path))


def _relative_label(path: Path, top: Path) -> str:
    try:
        return path.relative_to(top).as_posix()
    except ValueError:
        return path.name


def _find_hf(root: Root, budget: _Budget) -> Iterator[_Found]:
    """hub/models--org--name/snapshots/<revision>/**.gguf, each usually a link to ../../blobs/<hash>.
    Newer revisions first, so when several snapshots share a blob the newest one names it."""
    try:
        repos = sorted(p for p in root.path.iterdir() if p.name.startswith("models--") and p.is_dir())
    except OSError:
        return
    for repo in repos:
        repo_id = repo.name[len("models--"):].replace("--", "/")
        try:
            snapshots = sorted((s for s in (repo / "snapshots").iterdir() if s.is_dir()),
                               key=lambda s: s.stat().st_mtime, reverse=True)
        except OSError:
            continue
        for snap in snapshots:
            for path in _walk_gguf_links(snap, budget):
                rel = _relative_label(path, snap)
                missing = None
                if not path.exists():
                    missing = (f"{repo_id}/{rel} links to a blob that is not there "
                               "(the download is incomplete or the cache was pruned).")
                yield _Found(path, root.source, f"{repo_id}/{rel}", missing)


def _walk_gguf_links(top: Path, budget: _Budget) -> Iterator[Path]:
    """Like _walk_gguf, but also yields broken links (so a pruned blob is reported, not ignored)."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        depth = len(Path(dirpath).relative_to(top).parts)
        if depth >= MAX_DEPTH:
            dirnames[:] = []
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.lower().endswith(".gguf"):
                if budget.left <= 0:
                    return
                budget.left -= 1
                yield Path(dirpath) / name


def _ollama_label(rel: Sequence[str]) -> str:
    """manifests/<host>/<namespace>/<model>/<tag> -> "model:tag", "ns/model:tag" or "host/ns/model:tag"."""
    if len(rel) < 2:
        return ":".join(rel)
    *prefix, model, tag = rel
    name = f"{model}:{tag}"
    if len(prefix) == 2 and prefix[0] == "registry.ollama.ai":
        return name if prefix[1] == "library" else f"{prefix[1]}/{name}"
    return "/".join([*prefix, name])


def _find_ollama(root: Root, budget: _Budget) -> Iterator[_Found]:
    """Each manifest under manifests/ names its layers by digest; the model layer is a GGUF blob."""
    manifests = root.path / "manifests"
    blobs = root.path / "blobs"
    if not manifests.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(manifests):
        rel_dir = Path(dirpath).relative_to(manifests)
        if len(rel_dir.parts) >= MAX_DEPTH:
            dirnames[:] = []
        dirnames.sort()
        for name in sorted(filenames):
            if budget.left <= 0:
                return
            if name.startswith("."):
                continue
            label = _ollama_label([*rel_dir.parts, name])
            manifest = Path(dirpath) / name
            try:
                doc = json.loads(read_regular_bytes(manifest, MAX_MANIFEST_BYTES))
            except (OSError, ValueError, RecursionError):  # a FIFO, a huge file, JSON nested thousands deep
                continue
            layers = doc.get("layers") if isinstance(doc, dict) else None
            if not isinstance(layers, list):
                continue
            for layer in layers:
                if not isinstance(layer, dict) or layer.get("mediaType") not in _OLLAMA_KINDS:
                    continue
                m = _DIGEST.fullmatch(str(layer.get("digest", "")))
                if m is None:  # never build a path from an unchecked digest
                    continue
                budget.left -= 1
                kind = _OLLAMA_KINDS[str(layer["mediaType"])]
                shown = label if kind == "model" else f"{label} ({kind})"
                blob = blobs / f"sha256-{m.group(1)}"
                if not blob.exists() and (blobs / f"sha256:{m.group(1)}").exists():
                    blob = blobs / f"sha256:{m.group(1)}"  # older Ollama on Linux/macOS
                missing = None if blob.exists() else \
                    f"Ollama's manifest for {label} names blob sha256-{m.group(1)[:12]}…, which is missing."
                yield _Found(blob, root.source, shown, missing)


_FINDERS = {"tree": _find_tree, "hf": _find_hf, "ollama": _find_ollama}


# --- discovery ----------------------------------------------------------------------------------


def describe(path: Path, cache: HeaderCache | None = None) -> tuple[GGUFInfo | None, str | None, str | None]:
    """(info, error, error type) for one file, through the cache when given. A split model with missing
    shards comes back with both its info and the MissingShardError's sentence."""
    sig = stat_sig(path)
    if cache is not None and sig is not None:
        hit = cache.get(path, sig)
        if hit is not None:
            return hit
    info: GGUFInfo | None = None
    error: str | None = None
    error_type: str | None = None
    try:
        info = read_gguf_info(path)
        if info.missing_shards:
            ensure_complete(info)
    except MissingShardError as exc:
        error, error_type = str(exc), type(exc).__name__
    except GGUFError as exc:
        info, error, error_type = None, str(exc), type(exc).__name__
    if cache is not None and sig is not None:
        cache.put(path, sig, info, error, error_type)
    return info, error, error_type


def discover(
    extra_folders: Sequence[str | Path] = (),
    home: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    specdeck_dir: Path | None = None,
    cache_path: Path | None = None,
    use_cache: bool = True,
) -> list[LibraryEntry]:
    """Every GGUF file in the known folders and `extra_folders`, each once (by resolved path; the first
    source in SOURCES order names it), with its header description or the reason it cannot be read."""
    roots = default_roots(home, env, specdeck_dir)
    roots += [Root(Path(f).expanduser(), FOLDER, "tree") for f in extra_folders]
    cache = HeaderCache(cache_path) if use_cache else None
    budget = _Budget(MAX_FILES)
    entries: list[LibraryEntry] = []
    seen_real: set[str] = set()
    seen_roots: set[str] = set()
    for root in roots:
        try:
            root_key = str(root.path.resolve())
        except OSError:
            continue
        if root_key in seen_roots and root.layout == "tree":
            continue
        seen_roots.add(root_key)
        for found in _FINDERS[root.layout](root, budget):
            entry = _entry(found, cache)
            if entry.real_path in seen_real:
                continue
            seen_real.add(entry.real_path)
            entries.append(entry)
    if cache is not None:
        cache.prune({e.path for e in entries})
        with contextlib.suppress(StorageError):  # a read-only cache folder must not break discovery
            cache.save()
    return entries


def _entry(found: _Found, cache: HeaderCache | None) -> LibraryEntry:
    try:
        real = str(found.path.resolve())
    except OSError:
        real = str(found.path)
    if found.missing is not None:
        return LibraryEntry(str(found.path), found.source, found.label, real, 0, None, found.missing,
                            "UnreadableError")
    info, error, error_type = describe(found.path, cache)
    size = info.file_size if info is not None else (stat_sig(found.path) or [0])[0]
    return LibraryEntry(str(found.path), found.source, found.label, real, size, info, error, error_type)


# --- compatibility ------------------------------------------------------------------------------


def _vocab_key(info: GGUFInfo) -> tuple[object, ...]:
    return (info.vocab_type, info.n_vocab, info.bos_id, info.eos_id, info.add_bos, info.add_eos,
            info.token_fingerprint)


class _Texts:
    """Token texts read once per file for the pairs a fingerprint cannot decide."""

    def __init__(self) -> None:
        self.texts: dict[str, list[str] | GGUFError] = {}

    def get(self, path: str) -> list[str] | GGUFError:
        if path not in self.texts:
            try:
                self.texts[path] = read_token_texts(path)
            except GGUFError as exc:
                self.texts[path] = exc
        return self.texts[path]


def _confirm(target: GGUFInfo, drafter: GGUFInfo, texts: _Texts) -> CompatResult:
    t, d = texts.get(target.path), texts.get(drafter.path)
    tv, dv = VocabInfo.from_gguf(target), VocabInfo.from_gguf(drafter)
    if isinstance(t, GGUFError) or isinstance(d, GGUFError):
        err = t if isinstance(t, GGUFError) else d
        first = check_compatible(tv, dv)
        return CompatResult(first.ok, first.check,
                            f"{first.reason}; the token texts could not be read: {err}", confirmed=False)
    return check_compatible(tv, dv, t, d)


def _worth_confirming(result: CompatResult) -> bool:
    """Undecided passes need the texts; so do fingerprint refusals, to name the first differing token."""
    return (result.ok and not result.confirmed) or result.check == CHECK_TOKEN_TEXT


def compat_matrix(entries: Sequence[LibraryEntry], *, confirm: bool = True
                  ) -> dict[tuple[str, str], CompatResult]:
    """check_compatible for every (target, drafter) pair of usable models, keyed by their paths. Pairs
    with the same vocabulary signature share one decision. With `confirm`, a pass the fingerprints cannot
    decide (sizes 1..128 apart) is decided on the real token texts, and a text refusal names the token."""
    models = [e for e in entries if e.is_model and e.info is not None and e.info.n_vocab > 0]
    decided: dict[tuple[tuple[object, ...], tuple[object, ...]], CompatResult] = {}
    texts = _Texts()
    out: dict[tuple[str, str], CompatResult] = {}
    for t in models:
        for d in models:
            if t is d or t.info is None or d.info is None:
                continue
            key = (_vocab_key(t.info), _vocab_key(d.info))
            result = decided.get(key)
            if result is None:
                result = check_compatible(VocabInfo.from_gguf(t.info), VocabInfo.from_gguf(d.info))
                if confirm and _worth_confirming(result):
                    result = _confirm(t.info, d.info, texts)
                decided[key] = result
            out[(t.path, d.path)] = result
    return out


def compatible_drafters(target: GGUFInfo, entries: Sequence[LibraryEntry], *, confirm: bool = True
                        ) -> tuple[list[GGUFInfo], list[tuple[LibraryEntry, CompatResult]]]:
    """The library's models that can draft for `target` (which need not be in the library), and those that
    cannot, with why. With `confirm`, what the fingerprints leave open is decided on the real token texts (as
    compat_matrix does); equal fingerprints of equal-size vocabularies are sha256 of the very texts, so they
    decide alone."""
    texts = _Texts()
    tv = VocabInfo.from_gguf(target)
    ok: list[GGUFInfo] = []
    refused: list[tuple[LibraryEntry, CompatResult]] = []
    target_real = os.path.realpath(target.path)
    for e in entries:
        if not e.is_model or e.info is None or e.real_path == target_real:
            continue
        result = check_compatible(tv, VocabInfo.from_gguf(e.info))
        if confirm and _worth_confirming(result):
            result = _confirm(target, e.info, texts)
        if result.ok:
            ok.append(e.info)
        else:
            refused.append((e, result))
    return ok, refused


def head_offers(target: GGUFInfo, entries: Sequence[LibraryEntry]) -> list[HeadOffer]:
    """The target's own MTP heads and the library's EAGLE-3 and DFlash files, each with why it cannot draft."""
    return heads_for(target, [(e.label, e.info) for e in entries
                              if e.usable and e.info is not None and e.info.architecture in DRAFTER_HEADS])
