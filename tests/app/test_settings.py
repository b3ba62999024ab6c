"""Settings: round trip, and every kind of bad file gives working defaults, a warning and a kept copy."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import SettingsError, StorageError
from app.params import SamplingSettings
from app.storage import settings as settings_module
from app.storage.settings import SCHEMA_VERSION, AppSettings, load_settings, save_settings


def _bad_copies(folder: Path) -> list[Path]:
    return sorted(folder.glob("settings.json.bad-*"))


def _custom() -> AppSettings:
    return AppSettings(
        target_path="/models/big.gguf",
        drafter_path="/models/small.gguf",
        ngram=3,
        adaptive=False,
        k=6,
        k_max=12,
        n_ctx=8192,
        n_gpu_layers=20,
        kv_type="q8_0",
        flash_attn="on",
        sampling=SamplingSettings(temperature=0.7, top_k=50, top_p=0.9, min_p=0.0, seed=42, max_tokens=1000),
        system_prompt="Be brief. ✓",
        model_folders=("/a", "/b"),
        reload_last_pair_on_start=True,
        bandwidth_override_gbps=936.5,
    )


def test_missing_file_gives_defaults_without_warning(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is None
    assert not path.exists()


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "settings.json"
    saved = _custom()
    save_settings(saved, path)
    loaded, warning = load_settings(path)
    assert warning is None
    assert loaded == saved
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == SCHEMA_VERSION
    assert raw["sampling"]["temperature"] == 0.7
    assert raw["model_folders"] == ["/a", "/b"]


def test_default_path_follows_specdeck_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    save_settings(replace(AppSettings(), n_ctx=2048))
    assert (tmp_path / "config" / "settings.json").is_file()
    assert load_settings()[0].n_ctx == 2048


def test_load_settings_for_the_engine() -> None:
    assert AppSettings().to_load_settings() is None
    load = _custom().to_load_settings()
    assert load is not None
    load.validate()
    assert (load.target_path, load.draft.drafter_path) == ("/models/big.gguf", "/models/small.gguf")
    assert load.draft.ngram == 3
    assert (load.n_ctx, load.kv_type, load.flash_attn, load.draft.k_max) == (8192, "q8_0", "on", 12)


@pytest.mark.parametrize("garbage", [b"\x00\xff\xfe garbage \x89PNG", b"{\"n_ctx\": 4096,", b"", b"[1, 2, 3]",
                                     b"\"just a string\"", b"[" * 100_000])
def test_corrupt_file(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "settings.json"
    path.write_bytes(garbage)
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is not None
    assert "settings.json was not used" in warning
    assert "Default settings are in use" in warning
    [aside] = _bad_copies(tmp_path)
    assert aside.read_bytes() == garbage  # kept for the user, byte for byte
    assert aside.name in warning
    assert not path.exists()
    save_settings(loaded, path)  # and the next save works normally
    assert load_settings(path) == (AppSettings(), None)


def test_wrong_types_fall_back_per_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    raw: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "n_ctx": "big",
        "adaptive": "yes",
        "k": 3,  # valid: kept
        "k_max": 2.5,
        "target_path": 17,
        "drafter_path": "/models/d.gguf",  # valid: kept
        "model_folders": "/not/a/list",
        "system_prompt": ["not", "text"],
        "sampling": {"temperature": "hot", "top_k": 10, "max_tokens": True, "top_p": 0.5},
        "unknown_future_key": 1,  # ignored
    }
    path.write_text(json.dumps(raw))
    loaded, warning = load_settings(path)
    defaults = AppSettings()
    assert (loaded.k, loaded.drafter_path) == (3, "/models/d.gguf")
    assert (loaded.n_ctx, loaded.adaptive) == (defaults.n_ctx, defaults.adaptive)
    assert loaded.k_max == defaults.k_max
    assert (loaded.target_path, loaded.model_folders, loaded.system_prompt) == (None, (), "")
    assert loaded.sampling == SamplingSettings(top_k=10, top_p=0.5)
    assert warning is not None
    for fragment in ("Context size must be a number", "Adaptive draft depth must be true or false",
                     "Maximum draft depth must be a whole number", "Temperature must be a number",
                     "Max tokens must be a number", "The system prompt must be text"):
        assert fragment in warning
    assert len(_bad_copies(tmp_path)) == 1
    loaded.validate()
    # The repaired settings were written back: the valid values survive the next start.
    assert load_settings(path) == (loaded, None)


def test_nan_and_infinity(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"schema_version": 1, "sampling": {"temperature": NaN, "top_p": Infinity,'
                    ' "min_p": -Infinity}, "bandwidth_override_gbps": NaN, "n_ctx": 1e400}')
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is not None
    assert "Temperature must be a finite number, not nan" in warning
    assert "Top-p must be a finite number" in warning
    assert "bandwidth override" in warning
    assert "Context size must be a finite number, not inf" in warning
    assert len(_bad_copies(tmp_path)) == 1


def test_out_of_range_and_cross_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 1, "n_ctx": 1, "kv_type": "q4_0", "flash_attn": "off",
                                "bandwidth_override_gbps": -5, "sampling": {"top_p": 0}}))
    loaded, warning = load_settings(path)
    assert warning is not None
    assert loaded.n_ctx == AppSettings().n_ctx
    assert "Context size must be between 16" in warning
    # Each of kv_type and flash_attn is valid alone, the pair is not: both go back to their defaults.
    assert (loaded.kv_type, loaded.flash_attn) == ("f16", "auto")
    assert "quantized KV cache needs flash attention" in warning
    assert loaded.bandwidth_override_gbps is None
    assert loaded.sampling.top_p == SamplingSettings().top_p
    loaded.validate()


def test_newer_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    newer = {"schema_version": SCHEMA_VERSION + 5, "n_ctx": 8192, "brand_new": {"x": 1}}
    path.write_text(json.dumps(newer))
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()  # a newer file's meaning is unknown: nothing of it is used
    assert warning is not None
    assert "written by a newer SpecDeck" in warning
    [aside] = _bad_copies(tmp_path)
    assert json.loads(aside.read_text()) == newer


@pytest.mark.parametrize("version", ["1", -1, 1.5, None, True])
def test_bad_schema_version(tmp_path: Path, version: object) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": version}))
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is not None
    assert "schema_version" in warning


def test_unversioned_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"n_ctx": 2048, "k": 3}))  # version 0: before versions existed
    loaded, warning = load_settings(path)
    assert warning is None
    assert (loaded.n_ctx, loaded.k, loaded.schema_version) == (2048, 3, SCHEMA_VERSION)
    assert path.exists()
    assert not _bad_copies(tmp_path)


def test_migration_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A future version 2 renames "context" to "n_ctx": the hook turns a version-1 file into version 2.
    def to_v2(raw: dict[str, Any]) -> dict[str, Any]:
        raw = dict(raw)
        raw["n_ctx"] = raw.pop("context")
        return raw

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 1, "context": 16384}))
    monkeypatch.setattr(settings_module, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(settings_module.MIGRATIONS, 1, to_v2)
    loaded, warning = load_settings(path)
    assert warning is None
    assert (loaded.n_ctx, loaded.schema_version) == (16384, 2)


def test_huge_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    with path.open("wb") as f:
        f.truncate(settings_module.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is not None
    assert "too large" in warning


def test_unreadable_path_never_raises(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.mkdir()  # a folder where the file should be
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is not None
    assert "settings.json" in warning


def test_save_validates_and_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    save_settings(_custom(), path)
    before = path.read_bytes()
    bad = replace(_custom(), sampling=SamplingSettings(temperature=float("nan")))
    with pytest.raises(SettingsError, match="Temperature must be a finite number"):
        save_settings(bad, path)
    with pytest.raises(SettingsError, match="quantized KV cache"):
        save_settings(replace(_custom(), flash_attn="off"), path)
    assert path.read_bytes() == before


def test_save_on_full_disk_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"
    save_settings(_custom(), path)
    before = path.read_bytes()

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StorageError, match=r"Could not save settings.json: the disk is full \(errno 28\)"):
        save_settings(replace(_custom(), n_ctx=2048), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_field_names = st.sampled_from([*AppSettings.__dataclass_fields__, "sampling"])
_sampling_names = st.sampled_from(list(SamplingSettings.__dataclass_fields__))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    top=st.dictionaries(_field_names, _json, max_size=8),
    sampling=st.dictionaries(_sampling_names, _json, max_size=4),
)
def test_any_json_loads_to_valid_settings(
    tmp_path: Path, top: dict[str, Any], sampling: dict[str, Any]
) -> None:
    path = tmp_path / "settings.json"
    doc = {"schema_version": SCHEMA_VERSION, **top}
    if sampling and "sampling" not in top:
        doc["sampling"] = sampling
    path.write_text(json.dumps(doc))
    loaded, _warning = load_settings(path)
    loaded.validate()  # whatever was in the file, what the app gets is usable
    save_settings(loaded, path)
    assert load_settings(path) == (loaded, None)


# --- hostile files (issue 13 §10) -----------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_the_file_does_not_hang_the_start(tmp_path: Path) -> None:
    import signal

    path = tmp_path / "settings.json"
    os.mkfifo(path)

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("load_settings blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        loaded, warning = load_settings(path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert loaded == AppSettings()
    assert warning is not None
    assert "not a regular file" in warning
    assert "Default settings are in use" in warning
    save_settings(_custom(), path)  # the next save replaces it with a real file
    assert load_settings(path) == (_custom(), None)


def test_a_folder_in_place_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.mkdir()
    loaded, warning = load_settings(path)
    assert loaded == AppSettings()
    assert warning is not None
    assert "Default settings are in use" in warning


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    save_settings(_custom(), path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as some Windows editors save it
    assert load_settings(path) == (_custom(), None)
    assert not _bad_copies(tmp_path)


def test_a_huge_system_prompt_is_refused_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    huge = "x" * (15 * 1024 * 1024)
    with pytest.raises(SettingsError, match=r"The system prompt is 15,728,640 characters long; at most"):
        save_settings(replace(_custom(), system_prompt=huge), path)
    assert not path.exists()  # refused before anything was written
    path.write_text(json.dumps({**settings_module.to_json_dict(_custom()), "system_prompt": huge}))
    loaded, warning = load_settings(path)
    assert warning is not None
    assert "The system prompt is 15,728,640 characters long" in warning
    assert loaded == replace(_custom(), system_prompt="")  # everything else kept
    assert len(_bad_copies(tmp_path)) == 1  # the file with the prompt is kept for the user


def test_the_unused_theme_setting_is_gone(tmp_path: Path) -> None:
    assert "theme" not in AppSettings.__dataclass_fields__
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "theme": "dark", "n_ctx": 2048}))
    loaded, warning = load_settings(path)  # an older file's theme is ignored quietly
    assert (loaded.n_ctx, warning) == (2048, None)


def test_drafting_from_the_chat_history_is_a_setting_that_reaches_the_engine(tmp_path: Path) -> None:
    """On by default (the suffix drafter reads the user's earlier answers at load); off, nothing is read. A file
    from before the setting existed loads with it on; a wrong value falls back with a sentence."""
    from app.params import HISTORY_TOKENS

    assert AppSettings().draft_settings().history_tokens == HISTORY_TOKENS
    assert AppSettings(draft_from_history=False).draft_settings().history_tokens == 0
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "ngram": 2}))
    loaded, warning = load_settings(path)
    assert warning is None
    assert (loaded.ngram, loaded.draft_from_history) == (2, True)
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "draft_from_history": "no"}))
    loaded, warning = load_settings(path)
    assert loaded.draft_from_history is True
    assert warning is not None
    assert "Draft from earlier answers must be true or false" in warning
    save_settings(replace(loaded, draft_from_history=False), path)
    assert load_settings(path)[0].draft_from_history is False
