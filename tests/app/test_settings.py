"""Settings: round trip, and every kind of bad file gives working defaults, a warning and a kept copy."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import SettingsError, StorageError
from app.params import HISTORY_TOKENS, DraftSettings, LoadSettings, SamplingSettings
from app.storage import settings as settings_module
from app.storage.settings import (
    NOT_SAVED,
    SCHEMA_VERSION,
    AppSettings,
    fresh_load,
    load_settings,
    save_settings,
    with_settings,
)


def _bad_copies(folder: Path) -> list[Path]:
    return sorted(folder.glob("settings.json.bad-*"))


def _custom() -> AppSettings:
    """Every saved field away from its default (MTP heads aside: they exclude a drafter model, see _with_mtp)."""
    draft = DraftSettings(drafter_path="/models/small.gguf", ngram=5, history_tokens=0, adaptive=False, k=6,
                          k_max=12, p_min=0.2)
    load = LoadSettings(target_path="/models/big.gguf", draft=draft, n_ctx=8192, n_batch=1024, n_gpu_layers=20,
                        main_gpu=1, flash_attn="on", kv_type="q8_0", n_threads=3, recurrent_rollback="checkpoints")
    return AppSettings(
        load=load,
        sampling=SamplingSettings(temperature=0.7, top_k=50, top_p=0.9, min_p=0.0, repeat_penalty=1.1,
                                  repeat_last_n=128, seed=42, max_tokens=1000, stops=("\nUser:", "END")),
        system_prompt="Be brief. ✓",
        system_prompt_presets=(("Brief", "Be brief. ✓"), ("Code & tests", "Write the tests first.")),
        model_folders=("/a", "/b"),
        reload_last_pair_on_start=True,
        bandwidth_override_gbps=936.5,
        switched_mode_models=("/models/base.gguf",),
        context_overflow="drop_oldest",
    )


def _with_mtp() -> AppSettings:
    """The MTP heads instead of a drafter model, and RPC servers instead of one GPU (each excludes the other)."""
    return with_settings(_custom(), {"load.draft.drafter_path": None, "load.draft.mtp": True, "load.main_gpu": None,
                                     "load.rpc_servers": ("10.0.0.2:50052",)})


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


def _saved_fields(cls: type, obj: object, default: object) -> list[tuple[str, object, object]]:
    """(name, value, default) of each field of ``cls`` that the settings file keeps, nested dataclasses by field."""
    out: list[tuple[str, object, object]] = []
    for f in fields(cls):
        if f"{cls.__name__}.{f.name}" in NOT_SAVED:
            continue
        value, base = getattr(obj, f.name), getattr(default, f.name)
        if hasattr(value, "__dataclass_fields__"):
            out += [(f"{f.name}.{n}", v, b) for n, v, b in _saved_fields(type(value), value, base)]
        else:
            out.append((f.name, value, base))
    return out


@pytest.mark.parametrize("custom", [_custom, _with_mtp])
def test_every_load_setting_survives_a_save(tmp_path: Path, custom: Any) -> None:
    """Every field of the engine's LoadSettings, DraftSettings and SamplingSettings is saved and read back, from
    the dataclasses' own fields: a new field that the file does not keep fails here (unless NOT_SAVED says why)."""
    changed = [name for name, value, base in _saved_fields(AppSettings, _custom(), AppSettings()) if value != base]
    changed += [name for name, value, base in _saved_fields(AppSettings, _with_mtp(), AppSettings()) if value != base]
    unchanged = {name for name, _v, _b in _saved_fields(AppSettings, _custom(), AppSettings())} - set(changed)
    assert unchanged == {"schema_version"}, f"give these a value away from the default in _custom: {unchanged}"
    path = tmp_path / "settings.json"
    save_settings(custom(), path)
    assert load_settings(path) == (custom(), None)
    raw = json.loads(path.read_text())
    for name, value, _base in _saved_fields(AppSettings, custom(), AppSettings()):
        *groups, leaf = name.split(".")
        held = raw
        for group in groups:
            held = held[group]
        assert held[leaf] == json.loads(json.dumps(value)), name  # tuples as lists, nested too


def test_what_is_not_saved_names_real_fields_and_stays_out_of_the_file(tmp_path: Path) -> None:
    owners = {cls.__name__: cls for cls in (LoadSettings, DraftSettings, SamplingSettings)}
    for key, reason in NOT_SAVED.items():
        owner, name = key.split(".")
        assert name in owners[owner].__dataclass_fields__, key
        assert reason
    measured = with_settings(_custom(), {"load.draft.model_start": 0.9, "sampling.response_format": "json_object"})
    path = tmp_path / "settings.json"
    save_settings(measured, path)
    raw = json.loads(path.read_text())
    assert "model_start" not in raw["load"]["draft"]
    assert "response_format" not in raw["sampling"]
    assert load_settings(path) == (_custom(), None)


def test_default_path_follows_specdeck_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path))
    save_settings(with_settings(AppSettings(), {"load.n_ctx": 2048}))
    assert (tmp_path / "config" / "settings.json").is_file()
    assert load_settings()[0].load.n_ctx == 2048


def test_load_settings_for_the_engine() -> None:
    assert AppSettings().to_load_settings() is None
    assert AppSettings().load == fresh_load()
    load = _custom().to_load_settings()
    assert load is not None
    load.validate()
    assert (load.target_path, load.draft.drafter_path) == ("/models/big.gguf", "/models/small.gguf")
    assert load.draft.ngram == 5
    assert (load.n_ctx, load.kv_type, load.flash_attn, load.draft.k_max) == (8192, "q8_0", "on", 12)
    assert (load.n_batch, load.main_gpu, load.n_threads, load.draft.p_min) == (1024, 1, 3, 0.2)


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
        "load": {
            "n_ctx": "big",
            "target_path": 17,
            "main_gpu": [0],
            "draft": {"adaptive": "yes", "k": 3, "k_max": 2.5, "drafter_path": "/models/d.gguf", "mtp": 1},
        },
        "model_folders": "/not/a/list",
        "system_prompt": ["not", "text"],
        "sampling": {"temperature": "hot", "top_k": 10, "max_tokens": True, "top_p": 0.5},
        "unknown_future_key": 1,  # ignored
    }
    path.write_text(json.dumps(raw))
    loaded, warning = load_settings(path)
    defaults = AppSettings()
    assert (loaded.load.draft.k, loaded.load.draft.drafter_path) == (3, "/models/d.gguf")
    assert (loaded.load.n_ctx, loaded.load.draft.adaptive) == (defaults.load.n_ctx, defaults.load.draft.adaptive)
    assert (loaded.load.draft.k_max, loaded.load.draft.mtp, loaded.load.main_gpu) == (16, False, None)
    assert (loaded.load.target_path, loaded.model_folders, loaded.system_prompt) == ("", (), "")
    assert loaded.sampling == SamplingSettings(top_k=10, top_p=0.5)
    assert warning is not None
    for fragment in ("Context size must be a number", "Adaptive draft depth must be true or false",
                     "Maximum draft depth must be a whole number", "Temperature must be a number",
                     "Max tokens must be a number", "The system prompt must be text",
                     "Drafting with the target's own MTP heads must be true or false",
                     "The target model must be a file path, not 17", "Main GPU must be a number"):
        assert fragment in warning
    assert len(_bad_copies(tmp_path)) == 1
    loaded.validate()
    # The repaired settings were written back: the valid values survive the next start.
    assert load_settings(path) == (loaded, None)


def test_nan_and_infinity(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"schema_version": 2, "sampling": {"temperature": NaN, "top_p": Infinity,'
                    ' "min_p": -Infinity}, "bandwidth_override_gbps": NaN, "load": {"n_ctx": 1e400}}')
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
    path.write_text(json.dumps({"schema_version": 2, "load": {"n_ctx": 1, "kv_type": "q4_0", "flash_attn": "off",
                                                              "n_batch": 16, "draft": {"k_max": 15}},
                                "bandwidth_override_gbps": -5, "sampling": {"top_p": 0}}))
    loaded, warning = load_settings(path)
    assert warning is not None
    assert loaded.load.n_ctx == AppSettings().load.n_ctx
    assert "Context size must be between 16" in warning
    # Each of kv_type and flash_attn is valid alone, the pair is not: flash attention comes first in the
    # engine's fields and is kept, the KV cache type that needs it goes back to its default.
    assert (loaded.load.kv_type, loaded.load.flash_attn) == ("f16", "off")
    assert "quantized KV cache needs flash attention" in warning
    # A batch of 16 holds a draft 15 deep, read first: both kept.
    assert (loaded.load.n_batch, loaded.load.draft.k_max) == (16, 15)
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
    assert (loaded.load.n_ctx, loaded.load.draft.k, loaded.schema_version) == (2048, 3, SCHEMA_VERSION)
    assert path.exists()
    assert not _bad_copies(tmp_path)


def test_a_version_1_file_keeps_its_values(tmp_path: Path) -> None:
    """Version 1 kept a flat copy of some load settings; they move into the engine's LoadSettings."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({
        "schema_version": 1, "target_path": "/models/big.gguf", "drafter_path": "", "ngram": 2,
        "draft_from_history": False, "adaptive": False, "k": 6, "k_max": 12, "n_ctx": 8192, "n_gpu_layers": 20,
        "kv_type": "q8_0", "flash_attn": "on", "sampling": {"temperature": 0.5}, "system_prompt": "Hi.",
        "model_folders": ["/a"], "reload_last_pair_on_start": True, "bandwidth_override_gbps": None,
        "switched_mode_models": [], "context_overflow": "drop_oldest"}))
    loaded, warning = load_settings(path)
    assert warning is None
    draft = DraftSettings(drafter_path=None, ngram=2, history_tokens=0, adaptive=False, k=6, k_max=12)
    load = LoadSettings(target_path="/models/big.gguf", draft=draft, n_ctx=8192, n_gpu_layers=20, kv_type="q8_0",
                        flash_attn="on")
    assert loaded == AppSettings(load=load, sampling=SamplingSettings(temperature=0.5), system_prompt="Hi.",
                                 model_folders=("/a",), reload_last_pair_on_start=True, context_overflow="drop_oldest")
    path.write_text(json.dumps({"schema_version": 1, "target_path": None, "draft_from_history": True}))
    assert load_settings(path) == (AppSettings(), None)


def test_migration_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A future version 3 renames "context" to the load settings' "n_ctx": the hook turns a version-2 file into 3.
    def to_v3(raw: dict[str, Any]) -> dict[str, Any]:
        raw = dict(raw)
        raw["load"] = {"n_ctx": raw.pop("context")}
        return raw

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 2, "context": 16384}))
    monkeypatch.setattr(settings_module, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(settings_module.MIGRATIONS, 2, to_v3)
    loaded, warning = load_settings(path)
    assert warning is None
    assert (loaded.load.n_ctx, loaded.schema_version) == (16384, 3)


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
        save_settings(with_settings(_custom(), {"load.flash_attn": "off"}), path)
    assert path.read_bytes() == before


def test_save_on_full_disk_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.json"
    save_settings(_custom(), path)
    before = path.read_bytes()

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StorageError, match=r"Could not save settings.json: the disk is full \(errno 28\)"):
        save_settings(with_settings(_custom(), {"load.n_ctx": 2048}), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
def _group(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(list(cls.__dataclass_fields__)), _json, max_size=6)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    top=_group(AppSettings),
    load=_group(LoadSettings),
    draft=_group(DraftSettings),
    sampling=_group(SamplingSettings),
)
def test_any_json_loads_to_valid_settings(
    tmp_path: Path, top: dict[str, Any], load: dict[str, Any], draft: dict[str, Any], sampling: dict[str, Any]
) -> None:
    path = tmp_path / "settings.json"
    doc = {"schema_version": SCHEMA_VERSION, **top}
    if load and "load" not in top:
        doc["load"] = {**load, "draft": draft} if draft and "draft" not in load else load
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


@pytest.mark.parametrize(("stops", "sentence"), [
    ([""], "A stop string cannot be empty."),
    (["x" * 257], "A stop string is at most 256 characters; “xxxxxxxxxxxxxxxxxxxx…” has 257."),
    ([str(n) for n in range(17)], "At most 16 stop strings are taken; 17 are given."),
    (["END", "\n", "END"], "The stop string “END” is listed twice."),
])
def test_bad_stop_strings_fall_back_with_one_sentence(tmp_path: Path, stops: list[str], sentence: str) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({**settings_module.to_json_dict(_custom()),
                                "sampling": {**settings_module.to_json_dict(_custom())["sampling"], "stops": stops}}))
    loaded, warning = load_settings(path)
    assert warning is not None
    assert sentence in warning
    assert loaded == with_settings(_custom(), {"sampling.stops": ()})  # everything else kept
    with pytest.raises(SettingsError) as refused:
        save_settings(with_settings(_custom(), {"sampling.stops": tuple(stops)}), tmp_path / "other.json")
    assert str(refused.value) == sentence


def test_the_unused_theme_setting_is_gone(tmp_path: Path) -> None:
    assert "theme" not in AppSettings.__dataclass_fields__
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "theme": "dark", "load": {"n_ctx": 2048}}))
    loaded, warning = load_settings(path)  # an older file's theme is ignored quietly
    assert (loaded.load.n_ctx, warning) == (2048, None)


def test_drafting_from_the_chat_history_is_a_setting_that_reaches_the_engine(tmp_path: Path) -> None:
    """On by default (the suffix drafter reads the user's earlier answers at load); off, nothing is read. A file
    from before the setting existed loads with it on; a wrong value falls back with a sentence."""
    assert AppSettings().to_load_settings() is None
    assert AppSettings().load.draft.history_tokens == HISTORY_TOKENS
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 1, "ngram": 2}))
    loaded, warning = load_settings(path)
    assert warning is None
    assert (loaded.load.draft.ngram, loaded.load.draft.history_tokens) == (2, HISTORY_TOKENS)
    path.write_text(json.dumps({"schema_version": 1, "draft_from_history": "no"}))
    loaded, warning = load_settings(path)
    assert loaded.load.draft.history_tokens == HISTORY_TOKENS
    assert warning is not None
    assert "Earlier answers to draft from must be a number, not 'no'" in warning
    save_settings(with_settings(loaded, {"load.draft.history_tokens": 0}), path)
    assert load_settings(path)[0].load.draft.history_tokens == 0


@pytest.mark.parametrize(("presets", "sentence"), [
    ([["", "x"]], "A preset's name is one line of 1 to 80 characters, not ''."),
    ([["a", "x"], ["a", "y"]], "There are two presets named “a”."),
    ([["n" * 81, "x"]], "A preset's name is one line of 1 to 80 characters"),
    ([["line\nbreak", "x"]], "A preset's name is one line of 1 to 80 characters"),
    ([[f"p{n}", "x"] for n in range(101)], "At most 100 system-prompt presets are kept; 101 are given."),
])
def test_bad_presets_fall_back_with_one_sentence(tmp_path: Path, presets: list[list[str]], sentence: str) -> None:
    path = tmp_path / "settings.json"
    good = _custom()
    save_settings(good, path)
    assert load_settings(path) == (good, None)
    path.write_text(json.dumps({**settings_module.to_json_dict(good), "system_prompt_presets": presets}))
    loaded, warning = load_settings(path)
    assert warning is not None
    assert sentence in warning
    assert loaded == with_settings(_custom(), {"system_prompt_presets": ()})  # everything else is kept
