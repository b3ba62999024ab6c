"""The app's settings: one typed, versioned schema, saved atomically as JSON.

The schema is ``AppSettings``: the engine's own ``LoadSettings`` (with its ``DraftSettings``) and
``SamplingSettings``, whole, beside what only the window keeps. Every field is read and written from the
dataclasses' own annotations (pydantic types and converts each value), and checked by the dataclass's own
``validate()``, so a new load setting is saved without a line here and each rule keeps one sentence.

``load_settings`` never raises: a missing file gives the defaults; a file that is corrupt, from a newer
SpecDeck, or holds invalid values is moved aside (``settings.json.bad-<timestamp>``) and a warning says
what happened. Each invalid value falls back to its own default, so one bad number does not reset the rest.

To change the schema: bump ``SCHEMA_VERSION`` and add ``MIGRATIONS[old] = fn`` turning a version-``old``
dict into a version-``old + 1`` dict. Files are migrated step by step on load.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import reprlib
import stat
import time
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from app.errors import SettingsError, StorageError
from app.params import (
    HISTORY_TOKENS,
    NGRAM_KEY_LENGTH,
    DraftSettings,
    LoadSettings,
    SamplingSettings,
)
from app.paths import config_dir
from app.storage.atomic import atomic_write_json

SCHEMA_VERSION = 2
FILE_NAME = "settings.json"
MAX_SYSTEM_PROMPT_CHARS = 1_000_000  # about 250k tokens: more than any context SpecDeck loads
MAX_PRESETS = 100  # system-prompt presets: a menu longer than this is no longer a menu
MAX_PRESET_NAME = 80
MAX_FILE_BYTES = 16 * 1024 * 1024  # far above any real settings file; a bigger one is not ours
MAX_BANDWIDTH_GBPS = 100_000.0
OVERFLOW_POLICIES = ("stop", "drop_oldest")

# Fields of the engine's dataclasses that are not settings, and why. Every other field is saved.
NOT_SAVED = {
    "DraftSettings.model_start": "the pair's acceptance measured in earlier runs, read afresh at each load",
    "SamplingSettings.response_format": "set by an API request, never kept as a window setting",
    "SamplingSettings.presence_penalty": "set by an API request, never kept as a window setting",
    "SamplingSettings.frequency_penalty": "set by an API request, never kept as a window setting",
    "SamplingSettings.logit_bias": "set by an API request, never kept as a window setting",
    "SamplingSettings.logprobs": "set by an API request, never kept as a window setting",
    "SamplingSettings.top_logprobs": "set by an API request, never kept as a window setting",
}


def fresh_load() -> LoadSettings:
    """The load settings of a fresh home: the engine's defaults with no target yet, and the suffix drafter on,
    reading the chat history. It costs nothing to run, and speculation is the point of the app
    (DraftSettings stays off by default, so bench's and the API's plain runs stay plain)."""
    return LoadSettings(target_path="", draft=DraftSettings(ngram=NGRAM_KEY_LENGTH, history_tokens=HISTORY_TOKENS))


@dataclass(frozen=True)
class AppSettings:
    """Everything SpecDeck remembers between runs. Frozen: change it with ``dataclasses.replace`` (or
    ``with_settings`` for a nested field)."""

    schema_version: int = SCHEMA_VERSION
    load: LoadSettings = field(default_factory=fresh_load)  # the last pair and how it loads ("" target: none yet)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    system_prompt: str = ""
    # Named system prompts (name, text), in the order the menu shows them.
    system_prompt_presets: tuple[tuple[str, str], ...] = ()
    model_folders: tuple[str, ...] = ()  # extra folders the user added to model discovery
    reload_last_pair_on_start: bool = False
    bandwidth_override_gbps: float | None = None  # replaces the spec-sheet bandwidth when set
    # Models the user switched from their default chat mode (chat with a template, completion without one).
    switched_mode_models: tuple[str, ...] = ()
    # When a chat no longer fits the context (OVERFLOW_POLICIES): stop and offer a new chat, or leave out the
    # oldest messages. Stopping is the default: nothing the model reads is dropped without the user knowing.
    context_overflow: str = "stop"

    def to_load_settings(self) -> LoadSettings | None:
        """The settings to load the remembered pair with; None when no target was chosen yet."""
        return self.load if self.load.target_path else None

    def validate(self) -> AppSettings:
        """Raises SettingsError naming the first invalid value."""
        if self.schema_version != SCHEMA_VERSION:
            raise SettingsError(f"schema_version must be {SCHEMA_VERSION}, not {self.schema_version!r}.")
        # No target chosen yet is a valid setting; every other load rule is the engine's.
        replace(self.load, target_path=self.load.target_path or "-").validate()
        self.sampling.validate()
        if not isinstance(self.system_prompt, str):
            raise SettingsError(f"The system prompt must be text, not {type(self.system_prompt).__name__}.")
        if len(self.system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
            raise SettingsError(f"The system prompt is {len(self.system_prompt):,} characters long; at most "
                                f"{MAX_SYSTEM_PROMPT_CHARS:,} are accepted.")
        check_presets(self.system_prompt_presets)
        _check_paths("Model folders must be a list of folder paths", self.model_folders)
        _check_paths("The models with a switched chat mode must be a list of file paths", self.switched_mode_models)
        if not isinstance(self.reload_last_pair_on_start, bool):
            raise SettingsError(f"Reload the last models on start must be true or false, not "
                                f"{_shown(self.reload_last_pair_on_start)}.")
        _check_bandwidth(self.bandwidth_override_gbps)
        if self.context_overflow not in OVERFLOW_POLICIES:
            raise SettingsError(f"context_overflow must be one of {', '.join(OVERFLOW_POLICIES)}, not "
                                f"{_shown(self.context_overflow)}.")
        return self


def check_presets(presets: object) -> None:
    """Raises SettingsError naming what is wrong with a list of (name, text) system-prompt presets."""
    if not isinstance(presets, tuple | list) or not all(
            isinstance(p, tuple | list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in presets):
        raise SettingsError(f"System-prompt presets must be a list of [name, text] pairs, not {_shown(presets)}.")
    if len(presets) > MAX_PRESETS:
        raise SettingsError(f"At most {MAX_PRESETS} system-prompt presets are kept; {len(presets)} are given.")
    names: set[str] = set()
    for name, text in presets:
        if not name.strip() or len(name) > MAX_PRESET_NAME or not name.isprintable():
            raise SettingsError(f"A preset's name is one line of 1 to {MAX_PRESET_NAME} characters, not "
                                f"{_shown(name)}.")
        if name in names:
            raise SettingsError(f"There are two presets named “{name}”.")
        if len(text) > MAX_SYSTEM_PROMPT_CHARS:
            raise SettingsError(f"The preset “{name}” is {len(text):,} characters long; at most "
                                f"{MAX_SYSTEM_PROMPT_CHARS:,} are accepted.")
        names.add(name)


def _shown(value: object) -> str:
    """A value from the file, short enough for a sentence (a file may hold megabytes in one field)."""
    return reprlib.repr(value)


def _check_paths(sentence: str, value: object) -> None:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v and "\x00" not in v for v in value):
        raise SettingsError(f"{sentence}, not {_shown(value)}.")


def _check_bandwidth(value: object) -> None:
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            or not 0 < value <= MAX_BANDWIDTH_GBPS):
        raise SettingsError(f"The bandwidth override must be empty or a number of GB/s above 0 and up to "
                            f"{MAX_BANDWIDTH_GBPS:g}, not {_shown(value)}.")


# --- nested fields by path ("load.draft.k"): the window's one map between widgets and settings ------------


def setting(settings: AppSettings, path: str) -> Any:
    """The value at a dotted path of fields, e.g. ``setting(s, "load.draft.k")``."""
    value: Any = settings
    for name in path.split("."):
        value = getattr(value, name)
    return value


def with_settings(settings: AppSettings, values: Mapping[str, Any]) -> AppSettings:
    """``settings`` with the value at each dotted path of ``values`` replaced."""
    out: AppSettings = settings
    for path, value in values.items():
        out = _replaced(out, path.split("."), value)
    return out


def _replaced(obj: Any, names: list[str], value: Any) -> Any:
    head, *rest = names
    return replace(obj, **{head: _replaced(getattr(obj, head), rest, value) if rest else value})


# --- reading a file's values into the schema, field by field -----------------------------------------------

@functools.cache
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint)


def _typed(hint: Any, value: Any, *, strict: bool) -> Any:
    """``value`` (from JSON) as the field's type: ValidationError when it is not one. Strict: a number stays a
    number and true stays a boolean; lax (only once the field's own rules accepted the value): 512.0 is 512."""
    if strict:
        return _adapter(hint).validate_json(json.dumps(value), strict=True)  # JSON: a list is a tuple
    return _adapter(hint).validate_python(value)


def _within(check: Callable[[Any], object], parent: Any, name: str, child: Any) -> object:
    """Check a nested dataclass where it sits: its parent's rules may span both (the batch and the depth)."""
    return check(replace(parent, **{name: child}))


def _merge(current: Any, raw: object, where: str, check: Callable[[Any], object], problems: list[str]) -> Any:
    """``current`` with each of ``raw``'s values put in that is of its field's type and passes ``check`` (the
    dataclass's own rules, over everything accepted so far), in field order; nested dataclasses value by
    value. A refused value keeps what ``current`` holds (its default) and its sentence joins ``problems``."""
    if not isinstance(raw, dict):
        problems.append(f"The {where or 'top'} settings must be a group of values, not {_shown(raw)}.")
        return current
    cls = type(current)
    hints = typing.get_type_hints(cls)  # the engine's modules annotate with strings
    for f in fields(cls):
        if f.name not in raw or f"{cls.__name__}.{f.name}" in NOT_SAVED:
            continue
        value, path = raw[f.name], f"{where}.{f.name}" if where else f.name
        old = getattr(current, f.name)
        if is_dataclass(old):
            child = _merge(old, value, path, functools.partial(_within, check, current, f.name), problems)
            current = replace(current, **{f.name: child})
            continue
        hint = hints[f.name]
        try:
            typed, type_error = _typed(hint, value, strict=True), None
        except (ValidationError, ValueError, RecursionError) as exc:
            typed, type_error = value, exc
        try:
            check(replace(current, **{f.name: typed}))
            if type_error is not None:
                typed = _typed(hint, value, strict=False)
        except SettingsError as exc:
            problems.append(str(exc))
            continue
        except Exception as exc:  # a value of a kind the rules never expected (a list where a number goes)
            problems.append(_type_sentence(path, value, type_error or exc))
            continue
        current = replace(current, **{f.name: typed})
    return current


def _type_sentence(path: str, value: object, exc: Exception) -> str:
    reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) and exc.errors() else str(exc)
    return f"The setting {path} cannot hold {_shown(value)} ({reason.lower()})."


# --- migrations ------------------------------------------------------------------------------------


def _from_v0(raw: dict[str, Any]) -> dict[str, Any]:
    # Version 0 = a file written before the schema carried a version; its keys already match version 1.
    return {**raw, "schema_version": 1}


# Version 1 kept a flat copy of some load settings; version 2 keeps the engine's LoadSettings whole.
_V1_LOAD = ("n_ctx", "n_gpu_layers", "kv_type", "flash_attn")
_V1_DRAFT = ("ngram", "adaptive", "k", "k_max")


def _from_v1(raw: dict[str, Any]) -> dict[str, Any]:
    moved = {*_V1_LOAD, *_V1_DRAFT, "target_path", "drafter_path", "draft_from_history"}
    out = {key: value for key, value in raw.items() if key not in moved}
    load = {key: raw[key] for key in _V1_LOAD if key in raw}
    draft = {key: raw[key] for key in _V1_DRAFT if key in raw}
    if "target_path" in raw:
        load["target_path"] = raw["target_path"] or ""  # version 1: None for no target
    if "drafter_path" in raw:
        draft["drafter_path"] = raw["drafter_path"] or None
    if "draft_from_history" in raw:  # a flag then; now how many tokens (a non-flag is refused on load)
        flag = raw["draft_from_history"]
        draft["history_tokens"] = (HISTORY_TOKENS if flag else 0) if isinstance(flag, bool) else flag
    out["load"] = {**load, "draft": draft}
    return out


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _from_v0, 1: _from_v1}


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
    settings: AppSettings = _merge(AppSettings(), raw, "", AppSettings.validate, problems)
    # Repeats are dropped, not refused: the rest of the list stays the user's.
    settings = replace(settings, model_folders=tuple(dict.fromkeys(settings.model_folders)),
                       switched_mode_models=tuple(dict.fromkeys(settings.switched_mode_models)))
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


@functools.cache
def _schema() -> TypeAdapter[AppSettings]:
    return TypeAdapter(AppSettings)


def _drop_unsaved(out: dict[str, Any], obj: Any) -> dict[str, Any]:
    for f in fields(obj):
        if f"{type(obj).__name__}.{f.name}" in NOT_SAVED:
            del out[f.name]
        elif is_dataclass(value := getattr(obj, f.name)):
            _drop_unsaved(out[f.name], value)
    return out


def to_json_dict(settings: AppSettings) -> dict[str, Any]:
    """The settings as JSON values, every field but those in NOT_SAVED."""
    return _drop_unsaved(_schema().dump_python(settings, mode="json"), settings)


def save_settings(settings: AppSettings, path: str | os.PathLike[str] | None = None) -> None:
    """Validate (SettingsError) and write atomically (StorageError; the old file is then unchanged)."""
    settings.validate()
    atomic_write_json(Path(path) if path is not None else default_path(), to_json_dict(settings))
