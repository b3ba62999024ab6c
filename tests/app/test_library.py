"""Discovery in a fake home laid out like LM Studio, the Hugging Face cache and Ollama; the header cache;
the compatibility matrix; and `specdeck models`."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from app.cli import models as models_cmd
from app.errors import ModelFileError
from app.library.discovery import (
    FOLDER,
    HUGGINGFACE,
    LMSTUDIO,
    OLLAMA,
    SPECDECK,
    LibraryEntry,
    compat_matrix,
    default_roots,
    discover,
)
from app.library.header_cache import CACHE_FILE, CACHE_VERSION
from app.measure.recommend import drafters_for
from tests.gguf_fixtures import write_tiny_model

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("library-models")
    return {
        "a": write_tiny_model(folder / "a.gguf", name="model-a"),
        "b": write_tiny_model(folder / "b.gguf", name="model-b", seed=1),
        "other": write_tiny_model(folder / "other.gguf", name="other-vocab", vocab="bytes-alt"),
        "big": write_tiny_model(folder / "big.gguf", name="bigger", n_embd=128, n_layer=4),
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_home(root: Path, tiny: dict[str, Path]) -> dict[str, Path]:
    """A home folder as LM Studio, the HF hub cache and Ollama leave it, plus SpecDeck's and a user folder."""
    home = root / "home"
    paths: dict[str, Path] = {}

    specdeck = root / "specdeck-models"
    specdeck.mkdir(parents=True)
    paths["specdeck"] = shutil.copy(tiny["a"], specdeck / "a.gguf")
    (specdeck / "a.gguf.partial").write_bytes(b"half")  # a download in progress is not a model

    lm = home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    lm.mkdir(parents=True)
    paths["lmstudio"] = shutil.copy(tiny["b"], lm / "Tiny-Q8_0.gguf")
    paths["png"] = lm / "cover.gguf"
    paths["png"].write_bytes(PNG)
    old_lm = home / ".cache" / "lm-studio" / "models" / "x" / "y"
    old_lm.mkdir(parents=True)
    paths["lmstudio-old"] = shutil.copy(tiny["big"], old_lm / "big.gguf")

    repo = home / ".cache" / "huggingface" / "hub" / "models--org--Tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    blob = repo / "blobs" / _sha(tiny["other"])
    shutil.copy(tiny["other"], blob)
    for rev in ("rev1", "rev2"):  # two revisions sharing one blob: listed once
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "tiny-other.gguf").symlink_to(Path("..") / ".." / "blobs" / blob.name)
        os.utime(snap, (1000 if rev == "rev1" else 2000,) * 2)
    (repo / "snapshots" / "rev2" / "gone.gguf").symlink_to(Path("..") / ".." / "blobs" / ("0" * 64))
    paths["hf"] = repo / "snapshots" / "rev2" / "tiny-other.gguf"
    paths["hf-blob"] = blob
    paths["hf-gone"] = repo / "snapshots" / "rev2" / "gone.gguf"

    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    digest = _sha(tiny["a"])  # the same bytes as SpecDeck's copy, but another file
    paths["ollama"] = shutil.copy(tiny["a"], ollama / "blobs" / f"sha256-{digest}")
    (ollama / "blobs" / f"sha256-{'1' * 64}").write_text("{{ .Prompt }}")

    def manifest(rel: str, layers: list[dict[str, str]]) -> None:
        path = ollama / "manifests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))

    model_layer = {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}"}
    template_layer = {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{'1' * 64}"}
    manifest("registry.ollama.ai/library/tiny/latest", [model_layer, template_layer])
    manifest("hf.co/org/Tiny-GGUF/Q8_0", [{"mediaType": "application/vnd.ollama.image.model",
                                           "digest": f"sha256:{'2' * 64}"}])
    manifest("registry.ollama.ai/library/evil/latest", [{"mediaType": "application/vnd.ollama.image.model",
                                                         "digest": "sha256:../../../../etc/passwd"}])
    (ollama / "manifests" / "registry.ollama.ai" / "library" / "junk").mkdir(parents=True)
    (ollama / "manifests" / "registry.ollama.ai" / "library" / "junk" / "latest").write_text("not json")

    extra = root / "my-models"
    extra.mkdir()
    paths["folder"] = shutil.copy(tiny["other"], extra / "mine.gguf")
    (extra / ".hidden").mkdir()
    shutil.copy(tiny["b"], extra / ".hidden" / "skipped.gguf")
    (extra / "loop").symlink_to(extra)  # a link loop must not hang the walk

    paths["home"] = home
    paths["specdeck-dir"] = specdeck
    paths["extra"] = extra
    return paths


def run_discover(p: dict[str, Path], cache: Path, **kw: object) -> dict[str, LibraryEntry]:
    entries = discover([p["extra"]], p["home"], env={}, specdeck_dir=p["specdeck-dir"], cache_path=cache,
                       **kw)  # type: ignore[arg-type]
    by_label = {e.label: e for e in entries}
    assert len(by_label) == len(entries)
    return by_label


def test_discovery_in_a_fake_home(tmp_path: Path, tiny: dict[str, Path]) -> None:
    p = make_home(tmp_path, tiny)
    found = run_discover(p, tmp_path / "cache" / CACHE_FILE)
    assert {label: e.source for label, e in found.items()} == {
        "a.gguf": SPECDECK,
        "lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf": LMSTUDIO,
        "lmstudio-community/Tiny-GGUF/cover.gguf": LMSTUDIO,
        "x/y/big.gguf": LMSTUDIO,
        "org/Tiny-GGUF/tiny-other.gguf": HUGGINGFACE,
        "org/Tiny-GGUF/gone.gguf": HUGGINGFACE,
        "tiny:latest": OLLAMA,
        "hf.co/org/Tiny-GGUF:Q8_0": OLLAMA,
        "mine.gguf": FOLDER,
    }
    a = found["a.gguf"]
    assert a.usable
    assert a.info is not None
    assert a.info.name == "model-a"
    assert a.size == p["specdeck"].stat().st_size

    hf = found["org/Tiny-GGUF/tiny-other.gguf"]
    assert hf.path == str(p["hf"])
    assert hf.real_path == str(p["hf-blob"].resolve())
    assert hf.info is not None
    assert hf.info.name == "other-vocab"

    ollama = found["tiny:latest"]
    assert ollama.path == str(p["ollama"])
    assert ollama.info is not None
    assert ollama.info.name == "model-a"

    png = found["lmstudio-community/Tiny-GGUF/cover.gguf"]
    assert png.info is None
    assert png.error_type == "NotGGUFError"
    assert "PNG image" in (png.error or "")
    gone = found["org/Tiny-GGUF/gone.gguf"]
    assert gone.info is None
    assert "links to a blob that is not there" in (gone.error or "")
    missing_blob = found["hf.co/org/Tiny-GGUF:Q8_0"]
    assert missing_blob.info is None
    assert "which is missing" in (missing_blob.error or "")


def test_environment_overrides_and_lmstudio_home_pointer(tmp_path: Path, tiny: dict[str, Path]) -> None:
    home = tmp_path / "home"
    hub = tmp_path / "elsewhere" / "hub"
    snap = hub / "models--a--b" / "snapshots" / "r"
    snap.mkdir(parents=True)
    shutil.copy(tiny["a"], snap / "m.gguf")  # Windows without symlinks: plain copies in the snapshot
    lm_home = tmp_path / "lm-home"
    (lm_home / "models" / "p").mkdir(parents=True)
    shutil.copy(tiny["b"], lm_home / "models" / "p" / "n.gguf")
    home.mkdir()
    (home / ".lmstudio-home-pointer").write_text(str(lm_home))
    ollama = tmp_path / "ollama-store"
    roots = default_roots(home, {"HF_HUB_CACHE": str(hub), "OLLAMA_MODELS": str(ollama)}, tmp_path / "none")
    assert (hub, "hf") in [(r.path, r.layout) for r in roots]
    assert ollama in [r.path for r in roots]
    assert lm_home / "models" in [r.path for r in roots]
    found = {e.label: e.source for e in discover(home=home, env={"HF_HUB_CACHE": str(hub)},
                                                  specdeck_dir=tmp_path / "none", use_cache=False)}
    assert found == {"a/b/m.gguf": HUGGINGFACE, "p/n.gguf": LMSTUDIO}
    hf_home = default_roots(home, {"HF_HOME": str(tmp_path / "hf")}, tmp_path / "none")
    assert tmp_path / "hf" / "hub" in [r.path for r in hf_home]


def test_header_cache_is_used_and_invalidated(tmp_path: Path, tiny: dict[str, Path]) -> None:
    p = make_home(tmp_path, tiny)
    cache = tmp_path / "cache" / CACHE_FILE
    run_discover(p, cache)
    doc = json.loads(cache.read_text())
    assert doc["version"] == CACHE_VERSION
    assert str(p["specdeck"]) in doc["entries"]
    assert [f.name for f in cache.parent.iterdir()] == [CACHE_FILE]  # no temp file left behind
    errors = [e for e in doc["entries"].values() if "error" in e]
    assert any(e["error_type"] == "NotGGUFError" for e in errors)  # broken files are cached too

    # Same size and mtime: the cached description is trusted (proved by editing it).
    doc["entries"][str(p["specdeck"])]["info"]["name"] = "from-the-cache"
    cache.write_text(json.dumps(doc))
    assert run_discover(p, cache)["a.gguf"].info.name == "from-the-cache"  # type: ignore[union-attr]

    # A changed mtime means the file is read again.
    st = p["specdeck"].stat()
    os.utime(p["specdeck"], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert run_discover(p, cache)["a.gguf"].info.name == "model-a"  # type: ignore[union-attr]

    # A corrupt cache file is ignored, then replaced.
    cache.write_bytes(b"\0\0garbage")
    assert run_discover(p, cache)["a.gguf"].usable
    assert json.loads(cache.read_text())["version"] == CACHE_VERSION


def test_split_model_in_the_library(tmp_path: Path, tiny: dict[str, Path]) -> None:
    from tests.app.test_gguf_reader import _write_split

    folder = tmp_path / "split"
    first, second, _ = _write_split(folder)
    cache = tmp_path / "c.json"
    entries = {Path(e.path).name: e for e in discover([folder], tmp_path / "h", env={},
                                                      specdeck_dir=tmp_path / "none", cache_path=cache)}
    assert entries[first.name].is_model
    assert entries[second.name].info.kind == "shard"
    second.unlink()
    entries = {Path(e.path).name: e for e in discover([folder], tmp_path / "h", env={},
                                                      specdeck_dir=tmp_path / "none", cache_path=cache)}
    broken = entries[first.name]
    again = discover([folder], tmp_path / "h", env={}, specdeck_dir=tmp_path / "none", cache_path=cache)
    assert next(e for e in again if e.path == broken.path) == broken  # the cache keeps the reason too
    assert broken.info is not None
    assert not broken.usable
    assert broken.error_type == "MissingShardError"
    assert "big-model-00002-of-00003.gguf" in (broken.error or "")


def test_discovery_is_fast_on_many_files(tmp_path: Path, tiny: dict[str, Path]) -> None:
    folder = tmp_path / "many"
    for i in range(40):
        sub = folder / f"publisher-{i}"
        sub.mkdir(parents=True)
        for j in range(25):
            os.link(tiny["a"], sub / f"m{j}.gguf")  # 1000 files, each read on its own
    cache = tmp_path / "c.json"
    start = time.perf_counter()
    cold = discover([folder], tmp_path / "h", env={}, specdeck_dir=tmp_path / "none", cache_path=cache)
    cold_s = time.perf_counter() - start
    start = time.perf_counter()
    warm = discover([folder], tmp_path / "h", env={}, specdeck_dir=tmp_path / "none", cache_path=cache)
    warm_s = time.perf_counter() - start
    assert len(cold) == len(warm) == 1000
    assert all(e.usable for e in warm)
    assert cold_s < 10.0, cold_s
    assert warm_s < 1.5, warm_s


# --- compatibility in the library -------------------------------------------------------------------------


def test_compat_matrix(tmp_path: Path, tiny: dict[str, Path]) -> None:
    p = make_home(tmp_path, tiny)
    entries = discover([p["extra"]], p["home"], env={}, specdeck_dir=p["specdeck-dir"], use_cache=False)
    matrix = compat_matrix(entries)
    by_label = {e.label: e.path for e in entries}
    a, b = by_label["a.gguf"], by_label["lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf"]
    other = by_label["mine.gguf"]
    assert matrix[(a, b)].ok
    assert matrix[(b, a)].ok
    assert matrix[(a, other)].check == "token_text"
    assert not matrix[(a, other)].ok
    assert not any(e.path in {k[0] for k in matrix} for e in entries if not e.is_model)
    models = [e for e in entries if e.is_model]
    assert len(matrix) == len(models) * (len(models) - 1)


def test_matrix_confirms_close_sizes_on_real_texts(tmp_path: Path, tiny: dict[str, Path]) -> None:
    """Sizes 1..128 apart leave the fingerprints unable to decide: the real token texts do."""
    from tests.app.test_gguf_reader import TOKENS, build, model_kvs, write

    folder = tmp_path / "close"
    write(folder / "t.gguf", build(model_kvs(tokens=[*TOKENS, "pad1", "pad2"])))
    write(folder / "d.gguf", build(model_kvs(tokens=TOKENS)))
    write(folder / "x.gguf", build(model_kvs(tokens=[*TOKENS[:9], "zz", *TOKENS[10:], "pad1"])))
    entries = discover([folder], tmp_path / "h", env={}, specdeck_dir=tmp_path / "none", use_cache=False)
    path = {Path(e.path).name: e.path for e in entries}
    matrix = compat_matrix(entries)
    good = matrix[(path["t.gguf"], path["d.gguf"])]
    assert good.ok
    assert good.confirmed
    assert "real token texts" in good.reason
    bad = matrix[(path["t.gguf"], path["x.gguf"])]
    assert (bad.ok, bad.check) == (False, "token_text")
    assert bad.reason.startswith("token 9 differs")
    unconfirmed = compat_matrix(entries, confirm=False)[(path["t.gguf"], path["d.gguf"])]
    assert unconfirmed.ok
    assert not unconfirmed.confirmed


@pytest.mark.demo
def test_demo_models_in_the_library(tmp_path: Path, demo_models: tuple[Path, Path]) -> None:
    folder = tmp_path / "demo"
    folder.mkdir()
    for path in demo_models:
        (folder / path.name).symlink_to(path)
    entries = discover([folder], tmp_path / "h", env={}, specdeck_dir=tmp_path / "none", use_cache=False)
    smollm2, gemma = (str(folder / p.name) for p in demo_models)
    matrix = compat_matrix(entries)
    assert matrix[(gemma, smollm2)].check == "vocab_type"
    assert "SentencePiece" in matrix[(gemma, smollm2)].reason
    report = drafters_for(next(e.info for e in entries if e.path == gemma), entries)  # type: ignore[arg-type]
    assert [r.kind for r in report.recommendations] == ["ngram"]
    assert [(e.path, r.check) for e, r in report.refused] == [(smollm2, "vocab_type")]


def test_drafters_for_a_target(tmp_path: Path, tiny: dict[str, Path]) -> None:
    p = make_home(tmp_path, tiny)
    entries = discover([p["extra"]], p["home"], env={}, specdeck_dir=p["specdeck-dir"], use_cache=False)
    target = next(e.info for e in entries if e.label == "x/y/big.gguf")
    assert target is not None
    report = drafters_for(target, entries)
    ranked = [Path(r.drafter_path).name if r.drafter_path else "ngram" for r in report.recommendations]
    # a.gguf and its Ollama twin are separate files; smaller drafters first, the n-gram drafter last.
    assert ranked[-1] == "ngram"
    assert set(ranked[:-1]) == {"a.gguf", "Tiny-Q8_0.gguf", f"sha256-{_sha(tiny['a'])}"}
    assert all(r.speedup > 1.0 for r in report.recommendations)
    assert {e.label: r.check for e, r in report.refused} == {
        "org/Tiny-GGUF/tiny-other.gguf": "token_text", "mine.gguf": "token_text"}


# --- `specdeck models` -------------------------------------------------------------------------------------


def _run_cmd(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specdeck models")
    models_cmd.add_arguments(parser)
    return models_cmd.run(parser.parse_args(argv))


@pytest.fixture
def fake_user(tmp_path: Path, tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    p = make_home(tmp_path, tiny)
    monkeypatch.setenv("HOME", str(p["home"]))
    monkeypatch.setenv("USERPROFILE", str(p["home"]))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(p["specdeck-dir"]))
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path / "specdeck-home"))
    return p


def test_models_command_table(fake_user: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_cmd(["--folder", str(fake_user["extra"]), "--target", str(fake_user["lmstudio-old"])]) == 0
    out = capsys.readouterr().out
    assert "SOURCE" in out
    assert "tiny:latest" in out
    assert "org/Tiny-GGUF/tiny-other.gguf" in out
    assert "Cannot be used (3):" in out
    assert "PNG image" in out
    assert "Drafters for big.gguf" in out
    assert "suffix drafter (text match)" in out
    assert "mine.gguf: token 268 differs" in out


def test_models_command_json(fake_user: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--json", "--folder", str(fake_user["extra"]), "--target", str(fake_user["lmstudio-old"])]
    assert _run_cmd(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    by_label = {m["label"]: m for m in doc["models"]}
    assert by_label["a.gguf"]["source"] == "specdeck"
    assert by_label["a.gguf"]["n_vocab"] == 269
    assert by_label["mine.gguf"]["source"] == "folder"
    assert by_label["lmstudio-community/Tiny-GGUF/cover.gguf"]["error_type"] == "NotGGUFError"
    assert doc["target"]["path"] == str(fake_user["lmstudio-old"])
    assert doc["drafters"][-1]["kind"] == "ngram"
    assert all(d["predicted_speedup"] > 1 for d in doc["drafters"])
    assert {i["check"] for i in doc["incompatible"]} == {"token_text"}


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "missing.gguf", "missing.gguf does not exist"),
    (lambda d: _w(d / "pic.gguf", PNG), "pic.gguf is a PNG image, not a GGUF model."),
    (lambda d: _w(d / "cut.gguf", b"GGUF\x03\0\0\0"), "cut.gguf is truncated at byte 8 of 16"),
])
def test_bad_target_is_one_line_and_exit_1(fake_user: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str], make: object,
                                           message: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    assert _run_cmd(["--target", str(target)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("specdeck models: ")
    assert message in captured.err
    assert captured.err.count("\n") == 1
    assert "Traceback" not in captured.err


def _w(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- one model-file check, one sentence everywhere ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["lora", "second-part", "missing-part"])
def test_a_refused_model_file_reads_the_same_in_every_command(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str], specdeck_home: Path
) -> None:
    from app.cli import doctor
    from app.library.model_file import check_model_file
    from tests.app.test_bad_input import write_header

    if kind == "lora":
        path = write_header(tmp_path / "lora.gguf", "llama", general__type="adapter", adapter__type="lora")
    elif kind == "second-part":
        write_header(tmp_path / "z-00001-of-00002.gguf", "llama", split__no=0, split__count=2)
        path = write_header(tmp_path / "z-00002-of-00002.gguf", "llama", split__no=1, split__count=2)
    else:
        path = write_header(tmp_path / "x-00001-of-00002.gguf", "llama", split__no=0, split__count=2)
    with pytest.raises(ModelFileError) as caught:
        check_model_file(path, "target")
    sentence = str(caught.value)
    assert path.name in sentence

    assert _run_cmd(["--target", str(path)]) == 1
    assert capsys.readouterr().err.strip() == f"specdeck models: {sentence}"
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    assert doctor.run(parser.parse_args(["--model", str(path)])) == 2
    assert capsys.readouterr().err.strip() == f"specdeck doctor: {sentence}"
