"""The app's settings: one typed, versioned schema, saved atomically as JSON.

``load_settings`` never raises: a missing file gives the defaults; a file that is corrupt, from a newer
SpecDeck, or holds invalid values is moved aside (``settings.json.bad-<timestamp>``) and a warning says
what happened. Each invalid value falls back to its own default, so one bad number does not reset the rest.

To change the schema: bump ``SCHEMA_VERSION`` and add ``MIGRATIONS[old] = fn`` turning a version-``old``
dict into a version-``old + 1`` dict. Files are migrated step by step on load.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.errors import SettingsError, StorageError
from app.params import (
    HISTORY_TOKENS,
    NGRAM_KEY_LENGTH,
    DraftSettings,
    LoadSettings,
    SamplingSettings,
    as_dict,
    parse_rpc_servers,
)
from app.paths import config_dir
from app.storage.atomic import atomic_write_json

SCHEMA_VERSION = 1
FILE_NAME = "settings.json"
MAX_SYSTEM_PROMPT_CHARS = 1_000_000  # about 250k tokens: more than any context SpecDeck loads
MAX_FILE_BYTES = 16 * 1024 * 1024  # far above any real settings file; a bigger one is not ours
MAX_BANDWIDTH_GBPS = 100_000.0

_DRAFT = DraftSettings()
_LOAD = LoadSettings(target_path="")


@dataclass(frozen=True)
class AppSettings:
    """Everything SpecDeck remembers between runs. Frozen: change it with ``dataclasses.replace``."""

    schema_version: int = SCHEMA_VERSION
    target_path: str | None = None  # last target model
    drafter_path: str | None = None  # last drafter model
    # The suffix drafter's shortest match; 0 = off. On in a fresh home: it costs nothing to run, and speculation
    # is the point of the app (DraftSettings stays off by default, so bench's and the API's plain runs stay plain).
    ngram: int = NGRAM_KEY_LENGTH
    draft_from_history: bool = True  # the suffix drafter also drafts from earlier answers in the chat history
    adaptive: bool = _DRAFT.adaptive
    k: int = _DRAFT.k
    k_max: int = _DRAFT.k_max
    n_ctx: int = _LOAD.n_ctx
    n_gpu_layers: int = _LOAD.n_gpu_layers
    kv_type: str = _LOAD.kv_type
    flash_attn: str = _LOAD.flash_attn
    main_gpu: int | None = _LOAD.main_gpu  # the one GPU chosen; None: all GPUs, split by free memory
    rpc_servers: tuple[str, ...] = _LOAD.rpc_servers  # llama.cpp RPC servers that take the layers
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    system_prompt: str = ""
    model_folders: tuple[str, ...] = ()  # extra folders the user added to model discovery
    reload_last_pair_on_start: bool = False
    bandwidth_override_gbps: float | None = None  # replaces the spec-sheet bandwidth when set
    # Models the user switched from their default chat mode (chat with a template, completion without one).
    switched_mode_models: tuple[str, ...] = ()
    # When a chat no longer fits the context (OVERFLOW_POLICIES): stop and offer a new chat, or leave out the
    # oldest messages. Stopping is the default: nothing the model reads is dropped without the user knowing.
    context_overflow: str = "stop"

    def draft_settings(self) -> DraftSettings:
        return DraftSettings(drafter_path=self.drafter_path, ngram=self.ngram, adaptive=self.adaptive,
                             k=self.k, k_max=self.k_max,
                             history_tokens=HISTORY_TOKENS if self.draft_from_history else 0)

    def to_load_settings(self) -> LoadSettings | None:
        """The settings to load the remembered pair with; None when no target was chosen yet."""
        if not self.target_path:
            return None
        return LoadSettings(
            target_path=self.target_path,
            draft=self.draft_settings(),
            n_ctx=self.n_ctx,
            n_gpu_layers=self.n_gpu_layers,
            kv_type=self.kv_type,
            flash_attn=self.flash_attn,
            main_gpu=self.main_gpu,
            rpc_servers=self.rpc_servers,
        )

    def validate(self) -> AppSettings:
        """Raises SettingsError naming the first invalid value."""
        for f in fields(self):
            if f.name == "sampling":
                self.sampling.validate()
            else:
                _FIELD_CHECKS[f.name](getattr(self, f.name))
        _check_combination(self)
        return self


# --- one check per field: returns the normalised value or raises SettingsError ----------------------


def _via(factory: Callable[[Any], Any], convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Check a value with app.params's own validate(), so the rules and messages live in one place."""

    def check(value: Any) -> Any:
        factory(value).validate()
        return convert(value)

    return check


def _draft(name: str) -> Callable[[Any], Any]:
    return lambda v: replace(_DRAFT, **{name: v})


def _load(name: str) -> Callable[[Any], Any]:
    return lambda v: replace(_LOAD, target_path="-", **{name: v})


def _bool(label: str) -> Callable[[Any], Any]:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise SettingsError(f"{label} must be true or false, not {value!r}.")
        return value

    return check


def _optional_path(label: str) -> Callable[[Any], Any]:
    def check(value: Any) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str) or "\x00" in value:
            raise SettingsError(f"{label} must be a file path, not {value!r}.")
        return value

    return check


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise SettingsError(f"The system prompt must be text, not {type(value).__name__}.")
    if len(value) > MAX_SYSTEM_PROMPT_CHARS:
        raise SettingsError(f"The system prompt is {len(value):,} characters long; at most "
                            f"{MAX_SYSTEM_PROMPT_CHARS:,} are accepted.")
    return value


def _folders(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, str) and v and "\x00" not in v for v in value
    ):
        raise SettingsError(f"Model folders must be a list of folder paths, not {value!r}.")
    return tuple(dict.fromkeys(value))  # drop repeats, keep order


def _rpc_servers(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise SettingsError(f"RPC servers must be a list of host:port, not {value!r}.")
    return parse_rpc_servers(value)


def _model_paths(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, str) and v and "\x00" not in v for v in value
    ):
        raise SettingsError(f"The models with a switched chat mode must be a list of file paths, not {value!r}.")
    return tuple(dict.fromkeys(value))


def _bandwidth(value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_BANDWIDTH_GBPS
    ):
        raise SettingsError(
            f"The bandwidth override must be empty or a number of GB/s above 0 and up to "
            f"{MAX_BANDWIDTH_GBPS:g}, not {value!r}."
        )
    return float(value)


OVERFLOW_POLICIES = ("stop", "drop_oldest")


def _overflow(value: Any) -> str:
    if value not in OVERFLOW_POLICIES:
        raise SettingsError(f"context_overflow must be one of {', '.join(OVERFLOW_POLICIES)}, not {value!r}.")
    return str(value)


def _version(value: Any) -> int:
    if value != SCHEMA_VERSION:
        raise SettingsError(f"schema_version must be {SCHEMA_VERSION}, not {value!r}.")
    return SCHEMA_VERSION


_FIELD_CHECKS: dict[str, Callable[[Any], Any]] = {
    "schema_version": _version,
    "target_path": _optional_path("The target model"),
    "drafter_path": _optional_path("The drafter model"),
    "ngram": _via(_draft("ngram"), int),
    "draft_from_history": _bool("Draft from earlier answers"),
    "adaptive": _bool("Adaptive draft depth"),
    "k": _via(_draft("k"), int),
    "k_max": _via(_draft("k_max"), int),
    "n_ctx": _via(_load("n_ctx"), int),
    "n_gpu_layers": _via(_load("n_gpu_layers"), int),
    "kv_type": _via(_load("kv_type"), str),
    "flash_attn": _via(_load("flash_attn"), str),
    "main_gpu": _via(_load("main_gpu"), lambda v: None if v is None else int(v)),
    "rpc_servers": _rpc_servers,
    "system_prompt": _text,
    "model_folders": _folders,
    "reload_last_pair_on_start": _bool("Reload the last models on start"),
    "bandwidth_override_gbps": _bandwidth,
    "switched_mode_models": _model_paths,
    "context_overflow": _overflow,
}

_SAMPLING_DEFAULTS = SamplingSettings()


PER_REQUEST_SAMPLING = ("response_format",)  # set by an API request, never kept as a window setting


def _sampling_field(name: str, value: Any) -> Any:
    replace(_SAMPLING_DEFAULTS, **{name: value}).validate()
    # JSON has one number type: store ints where the field is an int and floats where it is a float.
    return type(getattr(_SAMPLING_DEFAULTS, name))(value)


def _check_combination(s: AppSettings) -> None:
    """Rules that span fields (a quantized KV cache needs flash attention, ...)."""
    replace(_LOAD, target_path="-", draft=s.draft_settings(), n_ctx=s.n_ctx, n_gpu_layers=s.n_gpu_layers,
            kv_type=s.kv_type, flash_attn=s.flash_attn).validate()


# --- migrations ------------------------------------------------------------------------------------


def _from_v0(raw: dict[str, Any]) -> dict[str, Any]:
    # Version 0 = a file written before the schema carried a version; its keys already match version 1.
    return {**raw, "schema_version": 1}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _from_v0}


class _Unreadable(Exception):
    """The file cannot be used at all; the message is the reason, for the warning."""


def _migrate(raw: dict[str, Any]) -> dict[str, Any]:
    version = raw.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise _Unreadable(f"its schema_version {version!r} is not a version number")
    if version > SCHEMA_VERSION:
        raise _Unreadable(
            f"it was written by a newer SpecDeck (settings version {version}; this one reads up to "
            f"{SCHEMA_VERSION})"
        )
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise _Unreadable(f"settings version {version} cannot be upgraded")
        raw = step(raw)
        version += 1
        raw["schema_version"] = version
    return raw


# --- load / save -----------------------------------------------------------------------------------


def default_path() -> Path:
    return config_dir() / FILE_NAME


def _parse(raw: dict[str, Any]) -> tuple[AppSettings, list[str]]:
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name, check in _FIELD_CHECKS.items():
        if name in raw:
            try:
                values[name] = check(raw[name])
            except SettingsError as exc:
                problems.append(str(exc))
    sampling = raw.get("sampling", {})
    if isinstance(sampling, dict):
        sampled: dict[str, Any] = {}
        for f in fields(SamplingSettings):
            if f.name in sampling and f.name not in PER_REQUEST_SAMPLING:
                try:
                    sampled[f.name] = _sampling_field(f.name, sampling[f.name])
                except SettingsError as exc:
                    problems.append(str(exc))
        values["sampling"] = SamplingSettings(**sampled)
    else:
        problems.append(f"Sampling settings must be a group of values, not {sampling!r}.")
    settings = AppSettings(**values)
    try:
        _check_combination(settings)
    except SettingsError as exc:
        problems.append(f"{exc} (KV cache type and flash attention were reset)")
        settings = replace(settings, kv_type=_LOAD.kv_type, flash_attn=_LOAD.flash_attn)
    return settings, problems


def _move_aside(path: Path) -> str:
    """Keep the bad file for the user (and for a newer SpecDeck) under a name nothing else uses."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        for n in range(100):
            aside = path.with_name(f"{path.name}.bad-{stamp}" + (f"-{n}" if n else ""))
            if not aside.exists():
                os.replace(path, aside)
                return f"The original file was kept as {aside.name}."
    except OSError as exc:
        return f"It could not be moved aside ({exc.strerror or exc}); the next save will replace it."
    return "It could not be moved aside; the next save will replace it."


def _unreadable(target: Path, exc: OSError) -> str:
    return f"Could not read {target.name} ({exc.strerror or exc}); default settings are in use."


def _read_regular(target: Path) -> bytes:
    """The file's bytes; _Unreadable for a pipe, device or folder (reading a FIFO would block the start)."""
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Unreadable("it is not a regular file (a pipe, a device or a folder)")
        if info.st_size > MAX_FILE_BYTES:
            raise _Unreadable(f"it is {info.st_size / 1e6:.0f} MB, far too large for a settings file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_FILE_BYTES:  # it grew while being read
                raise _Unreadable("it is far too large for a settings file")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_settings(path: str | os.PathLike[str] | None = None) -> tuple[AppSettings, str | None]:
    """The saved settings, or defaults; plus a warning for the user when something was wrong."""
    target = Path(path) if path is not None else default_path()
    if not target.exists() and not target.is_symlink():
        return AppSettings(), None
    try:
        try:
            data = _read_regular(target)
        except FileNotFoundError:
            return AppSettings(), None
        except IsADirectoryError as exc:
            raise _Unreadable("it is a folder, not a file") from exc
        except OSError as exc:
            return AppSettings(), _unreadable(target, exc)
        try:
            # NaN / Infinity load as floats here and are then refused by the field checks. utf-8-sig: an
            # editor's byte-order mark is not an error.
            raw = json.loads(data.decode("utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise _Unreadable("it is not valid JSON") from exc
        if not isinstance(raw, dict):
            raise _Unreadable(f"it holds {type(raw).__name__} instead of a group of settings")
        settings, problems = _parse(_migrate(raw))
    except _Unreadable as exc:
        aside = _move_aside(target)
        return AppSettings(), f"{target.name} was not used: {exc}. {aside} Default settings are in use."
    except Exception as exc:  # never fail the app's start over a settings file
        return AppSettings(), (
            f"{target.name} was not used ({type(exc).__name__}: {exc}). {_move_aside(target)} "
            "Default settings are in use."
        )
    if not problems:
        return settings, None
    listed = " ".join(problems)
    aside = _move_aside(target)
    # Write the repaired settings back at once, so the valid values survive even if nothing saves later.
    with contextlib.suppress(StorageError, SettingsError, ValueError):  # the warning already says enough
        save_settings(settings, target)
    return settings, (
        f"Some values in {target.name} were invalid and were reset to their defaults: {listed} {aside}"
    )


def to_json_dict(settings: AppSettings) -> dict[str, Any]:
    out = as_dict(settings)
    out["model_folders"] = list(settings.model_folders)
    return out


def save_settings(settings: AppSettings, path: str | os.PathLike[str] | None = None) -> None:
    """Validate (SettingsError) and write atomically (StorageError; the old file is then unchanged)."""
    settings.validate()
    atomic_write_json(Path(path) if path is not None else default_path(), to_json_dict(settings))
